"""Every Python example on the site runs, as written, and its asserts hold (pytest-examples)."""

from __future__ import annotations

import json

import pytest
from pytest_examples import CodeExample, EvalExample, find_examples
from support.llm_standin import StandinLLM, code_final, code_step, register_standin_models
from support.served import serving

from .conftest import ROOT

# Fragments (top-level `await`, a fork of an `ex` defined elsewhere) on pages written before the site;
# each is still to be made runnable. Listed by page so a new page cannot join them unnoticed.
FRAGMENT_PAGES = {"fork.md", "egress.md"}
SERVED_PAGES = {"serve.md", "serve-inside.md"}
"""Pages whose examples are E2B client code, run against a `kodeagent serve` on loopback."""
MCP_CLIENT_PAGES = {"mcp.md"}
"""Pages whose examples are agent frameworks' MCP clients, run in their own environment
(tests/docs/test_mcp_clients.py): their adapters need the MCP SDK 1.x, the server 2.x."""
EXAMPLES = [e for e in find_examples(ROOT / "docs") if e.path.name not in FRAGMENT_PAGES | MCP_CLIENT_PAGES]


def test_the_site_has_runnable_examples() -> None:
    pages = {e.path.relative_to(ROOT / "docs").as_posix() for e in EXAMPLES}
    assert {"quickstart.md", "concepts.md"} <= pages, pages


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_docs_example_runs(
    example: CodeExample, eval_example: EvalExample, monkeypatch: pytest.MonkeyPatch
) -> None:
    if example.path.name in SERVED_PAGES:
        # As the page says: the unmodified E2B SDK, pointed at a real `kodeagent serve` by its
        # three environment variables.
        with serving() as server:
            for name, value in server.env().items():
                monkeypatch.setenv(name, value)
            eval_example.run(example)
        return
    if example.path.name != "agents.md":
        eval_example.run(example)
        return
    # The agent example as a user runs it, its provider the loopback LLM stand-in (litellm reads
    # OPENAI_API_BASE for `openai/...` models): one code step that calls the tool, then the answer.
    register_standin_models()
    with StandinLLM() as llm:
        llm.add(
            code_step("import statistics\nprint(statistics.mean([get_price('AAPL'), get_price('MSFT')]))"),
            code_final("300.0"),
        )
        monkeypatch.setenv("OPENAI_API_BASE", llm.api_base)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-standin")
        eval_example.run(example)
        assert llm.remaining == 0
        observations = json.dumps(llm.requests[-1])
        assert "300.0" in observations  # the tool ran in this process and the code printed its mean
