"""smolagents' own `CodeAgent(executor_type="e2b")`, unmodified, against a real `kodeagent serve`: the
model is the loopback LLM stand-in, the agent's code runs in a served sandbox through the unmodified
`e2b-code-interpreter` SDK, and its final answer comes back through E2B's error channel as smolagents
expects it."""

from __future__ import annotations

import os
from typing import Any

import pytest
from support.llm_standin import StandinLLM, register_standin_models
from support.served import Served

pytest.importorskip("e2b_code_interpreter")
smolagents = pytest.importorskip("smolagents")
from smolagents import CodeAgent, LiteLLMModel  # noqa: E402

pytestmark = pytest.mark.e2b


def step(code: str) -> str:
    return f"Thought: I will run some code.\n<code>\n{code}\n</code>"


@pytest.fixture
def llm() -> Any:
    register_standin_models()
    with StandinLLM() as server:
        yield server


def test_codeagent_with_the_e2b_executor_runs_in_a_served_sandbox(served: Served, llm: StandinLLM) -> None:
    llm.add(
        step(
            "import os\nwhere = os.getpid()\nopen('note.txt', 'w').write('from the agent')\nprint('pid', where)"
        ),
        step("final_answer({'pid': where, 'note': open('note.txt').read(), 'sum': sum(range(10))})"),
    )
    model = LiteLLMModel(model_id=llm.model("plain"), api_base=llm.api_base, api_key="sk-standin")
    agent = CodeAgent(
        tools=[],
        model=model,
        executor_type="e2b",
        executor_kwargs=served.sdk_options(),
        additional_authorized_imports=["os"],
        verbosity_level=0,
    )
    try:
        answer = agent.run("Write a note and tell me where you ran.")
        (held,) = served.app.registry.list("alice")  # the one sandbox the executor created
        executor = held.sandbox.executor
        in_session = served.call(lambda: executor.run("import os\n(os.getpid(), open('note.txt').read())"))
    finally:
        agent.cleanup()
    assert answer["note"] == "from the agent" and answer["sum"] == 45
    assert answer["pid"] != os.getpid()  # the code ran in the sandbox, not in this process
    assert tuple(in_session.value) == (answer["pid"], "from the agent")  # ...and in that sandbox's session
    assert served.app.registry.list("alice") == []  # cleanup() killed it through the SDK
    assert llm.remaining == 0
    assert f"pid {answer['pid']}" in str(llm.requests[1]["messages"][-1]["content"])
