"""Agent options, judged by what a run does with them: the defaults, each option reaching what the
model is sent or what the sandbox does, and an option no agent knows refused by name.

The model is the LLM stand-in over real HTTP; CodeAct's code runs on the host backend.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.llm_standin import (
    StandinLLM,
    code_final,
    code_step,
    collect,
    error,
    react_call,
    react_finish,
)

from kodeagent import Agent, CodeActAgent, ReActAgent, RetryError

pytestmark = pytest.mark.anyio


def get_price(symbol: str) -> float:
    """Latest price of a stock. Args: symbol: ticker, e.g. AAPL."""
    return 200.0


def secret_tool() -> str:
    """Not for this agent."""
    return "secret"


@pytest.mark.parametrize("cls", [ReActAgent, CodeActAgent])
def test_an_unknown_option_is_a_type_error_naming_it(cls: type[Agent]) -> None:
    with pytest.raises(TypeError, match=r"'max_iteration' \(did you mean 'max_iterations'\?\)"):
        cls("openai/x", max_iteration=3)  # type: ignore[call-arg]


def test_codeact_options_are_its_own() -> None:
    with pytest.raises(TypeError, match="run_env"):
        ReActAgent("openai/x", run_env="host")  # type: ignore[call-arg]


@pytest.mark.parametrize("cls", [ReActAgent, CodeActAgent])
async def test_by_default_a_run_takes_20_steps_then_sums_up(llm: StandinLLM, cls: type[Agent]) -> None:
    never_done = react_call("get_price", {"symbol": "AAPL"}) if cls is ReActAgent else code_step("print(1)")
    llm.add(*[never_done] * 20, "AAPL is 200.0")
    agent = cls(llm.model("json"), litellm_params=llm.params(), tools=[get_price])
    final = (await collect(agent.run("Price?")))[-1]
    assert final.metadata["steps"] == 20 and not final.metadata["task_successful"]
    assert "not finished within 20 steps" in final.value and final.value.endswith("AAPL is 200.0")
    assert len(llm.requests) == 21 and llm.remaining == 0
    # auto: a model that litellm says supports a schema is asked for one; no planner call was made
    assert all(r["response_format"]["type"] == "json_schema" for r in llm.requests[:20])
    assert set(agent.get_usage_metrics()["by_component"]) == {"agent", "salvage"}


@pytest.mark.parametrize(("max_retries", "attempts"), [(None, 4), (0, 1)])
async def test_a_failing_model_call_is_tried_once_plus_max_retries(
    llm: StandinLLM, max_retries: int | None, attempts: int
) -> None:
    llm.add(*[error(500)] * 5)
    options: dict[str, Any] = {} if max_retries is None else {"max_retries": max_retries}
    agent = ReActAgent(llm.model("json"), litellm_params=llm.params(), **options)
    agent.retry_base_delay = 0.001
    with pytest.raises(RetryError):
        await collect(agent.run("q"))
    assert len(llm.requests) == attempts


async def test_configured_options_change_what_the_model_is_sent(llm: StandinLLM) -> None:
    llm.add(react_call("get_price", {"symbol": "AAPL"}), react_call("get_price", {"symbol": "MSFT"}))
    agent = ReActAgent(
        llm.model("native"),
        litellm_params=llm.params(),
        tools=[get_price, secret_tool],
        name="pricer",
        persona="You are a terse stock clerk.",
        allowed_tools=["get_*"],
        max_iterations=2,
        tool_calling="text",
        structured_output="off",
    )
    responses = await collect(agent.run("Prices?", summarize_progress_on_failure=False))
    assert responses[-1].value == "The task was not finished within 2 steps."
    assert {r.channel for r in responses if r.type != "log"} == {"pricer"}
    assert len(llm.requests) == 2
    for request in llm.requests:
        # a model able to call tools natively is still asked in free text, as told
        assert "tools" not in request and "response_format" not in request
        system = request["messages"][0]["content"]
        assert (
            "You are a terse stock clerk." in system and "get_price" in system and "secret_tool" not in system
        )


async def test_planning_interval_turns_the_planner_on_at_that_pace(llm: StandinLLM) -> None:
    llm.add("1. look", *[code_step(f"print({i})") for i in range(3)], "2. look again", code_final("done"))
    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), planning_interval=3)
    responses = await collect(agent.run("Look"))
    plans = [r.metadata["event"] for r in responses if r.channel == "planner"]
    assert plans == ["plan", "plan_update"] and responses[-1].value == "done"
    assert agent.get_usage_metrics()["by_component"]["planner"]["calls"] == 2


async def test_codeact_options_reach_the_sandbox(llm: StandinLLM) -> None:
    llm.add(
        code_step("import json\nprint(1)"), code_step("import math\nwhile True:\n    pass"), code_final("x")
    )
    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), allowed_imports=["math"], timeout=1)
    await collect(agent.run("Loop"))
    told = [r["messages"][-1]["content"] for r in llm.requests[1:]]
    assert "import of 'json' is not allowed" in told[0]
    assert "ran past the time limit of 1 s" in told[1]


@pytest.mark.parametrize("cls", [ReActAgent, CodeActAgent])
async def test_native_tool_calling_is_react_s_codeact_asks_for_json(
    llm: StandinLLM, cls: type[Agent]
) -> None:
    """CodeAct's tools are functions inside its code: told "native", it asks for a JSON step instead."""
    llm.add(react_finish("ok") if cls is ReActAgent else code_final("ok"))
    agent = cls(llm.model("native"), litellm_params=llm.params(), tools=[get_price], tool_calling="native")
    assert (await collect(agent.run("q")))[-1].value == "ok"
    [request] = llm.requests
    if cls is ReActAgent:
        assert [t["function"]["name"] for t in request["tools"]] == ["get_price"]
        assert "response_format" not in request
    else:
        assert "tools" not in request and request["response_format"]["type"] == "json_schema"
        assert json.dumps("get_price(symbol: str)")[1:-1] in request["messages"][0]["content"]


async def test_codeact_refuses_inputs_that_would_hide_a_tool_or_builtin() -> None:
    def lookup(key: str) -> str:
        """Look a key up. Args: key: the key."""
        return key

    agent = CodeActAgent(model_name="openai/never-called", run_env="host", tools=[lookup])
    for name in ("final_answer", "print", "lookup"):
        with pytest.raises(ValueError, match=f"inputs \\['{name}'\\] would hide"):
            await agent.arun("t", inputs={name: 1})


@pytest.mark.parametrize("name", ["env", "env_vars_to_set"])
async def test_codeact_env_reaches_the_sandbox_by_either_name(llm: StandinLLM, name: str) -> None:
    """`env` is sandboxes' name; the API reference's `env_vars_to_set` is its alias."""
    llm.add(code_step("import os\nprint(os.environ.get('GREETING'))"), code_final("hi"))
    options: dict[str, Any] = {name: {"GREETING": "hello"}}
    agent = CodeActAgent(
        llm.model("json"), litellm_params=llm.params(), backend="host", allowed_imports=["os"], **options
    )
    await collect(agent.run("Greet"))
    assert llm.requests[1]["messages"][-1]["content"] == "Observation:\nOutput:\nhello"
