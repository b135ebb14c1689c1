"""Every Python example on the site runs, as written, and its asserts hold (pytest-examples)."""

from __future__ import annotations

import json

import pytest
from pytest_examples import CodeExample, EvalExample, find_examples
from support.llm_standin import StandinLLM, code_final, code_step, register_standin_models
from support.needs import require
from support.served import serving

from .conftest import ROOT

SERVED_PAGES = {"serve.md", "serve-inside.md"}
"""Pages whose examples are E2B client code, run against a `kodeagent serve` on loopback."""
MCP_CLIENT_PAGES = {"mcp.md"}
"""Pages whose examples are agent frameworks' MCP clients, run in their own environment
(tests/docs/test_mcp_clients.py): their adapters need the MCP SDK 1.x, the server 2.x."""
EXAMPLES = [e for e in find_examples(ROOT / "docs") if e.path.name not in MCP_CLIENT_PAGES]


def egress_missing() -> str | None:
    from sandboxes.backends.host.process import namespaces_available
    from sandboxes.egress.service import unavailable

    return unavailable() or (None if namespaces_available() else "no namespaces here for the egress gateway")


def test_the_site_has_runnable_examples() -> None:
    pages = {e.path.relative_to(ROOT / "docs").as_posix() for e in EXAMPLES}
    assert {"quickstart.md", "concepts.md", "fork.md", "egress.md"} <= pages, pages


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
    if example.path.name == "egress.md":
        require(egress_missing(), "the egress page's examples")
    if example.path.name == "fork.md" and "CodeActAgent" in example.source:
        # Step 1 loads the data; on_step keeps the best of two candidates on forks; step 2 sees it.
        register_standin_models()
        with StandinLLM() as llm:
            llm.add(
                code_step("data = [3, 1, 2]\nprint(len(data))"),
                code_step("print(best)"),
                code_final("[1, 2, 3]"),
            )
            monkeypatch.setenv("OPENAI_API_BASE", llm.api_base)
            monkeypatch.setenv("OPENAI_API_KEY", "sk-standin")
            eval_example.run(example)
            assert llm.remaining == 0
            last = json.dumps(llm.requests[-1])
            assert "[1, 2, 3]" in last and "IndexError" not in last.split("Candidate")[-1]
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
