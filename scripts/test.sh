#!/usr/bin/env bash
# The README's test command: install what the suite needs (scripts/install.sh), then run it.
# `bash scripts/test.sh tests/unit` runs only the fast tier.
# `bash scripts/test.sh --quick` is the developer loop (a few minutes on two cores, no installs): the
# unit tier and every contract of tests/conformance on the host backend, nothing marked slow.
set -euo pipefail
cd "$(dirname "$0")/.."
export LITELLM_LOCAL_MODEL_COST_MAP=True
if [ "${1:-}" = "--quick" ]; then
    shift
    exec python3 -m pytest -q -m "not slow and not docker and not ray and not e2b and not e2b_live and not llama" \
        tests/unit tests/conformance "$@"
fi
bash scripts/install.sh
python3 -m pytest -q "$@"
