"""ReActAgent end to end against the LLM stand-in over real HTTP: native tool calls, JSON mode, prose."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from support.llm_standin import (
    PRICE_IN,
    PRICE_OUT,
    StandinLLM,
    collect,
    error,
    garbled,
    react_call,
    react_finish,
    register_standin_models,
    reply,
    slow,
)

from kodeagent import (
    AgentResponse,
    ChatMessage,
    ReActAgent,
    RetryError,
    StepRecord,
    llm_vision_support,
    tool,
)

pytestmark = pytest.mark.anyio


PRICES = {"AAPL": 200.0, "MSFT": 410.5}
CALLS: list[str] = []


@tool
def get_price(symbol: str) -> float:
    """Latest price of a stock. Args: symbol: ticker, e.g. AAPL."""
    CALLS.append(symbol)
    return PRICES[symbol]


@tool
def secret_tool(x: int) -> int:
    """A tool that must not be reachable when excluded. Args: x: any number."""
    CALLS.append(f"secret:{x}")
    return x


def make(llm: StandinLLM, kind: str = "json", **kwargs: Any) -> ReActAgent:
    agent = ReActAgent(llm.model(kind), litellm_params=llm.params(), tools=[get_price, secret_tool], **kwargs)
    agent.retry_base_delay = 0.01
    return agent


def finals(responses: list[AgentResponse]) -> list[AgentResponse]:
    return [r for r in responses if r.type == "final"]


def steps(responses: list[AgentResponse]) -> list[StepRecord]:
    return [r.value for r in responses if r.type == "step"]


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    CALLS.clear()


# ---------------------------------------------------------------------- the three reply modes


async def test_json_mode_tool_then_finish(llm: StandinLLM) -> None:
    llm.add(react_call("get_price", {"symbol": "AAPL"}), react_finish("AAPL is at 200.0"))
    agent = make(llm, "json")
    responses = await collect(agent.run("What is the AAPL price?"))

    assert responses[-1].type == "final"
    assert responses[-1].value == "AAPL is at 200.0"
    assert responses[-1].metadata["task_successful"] is True
    assert CALLS == ["AAPL"]
    first = llm.requests[0]
    assert first["response_format"]["type"] == "json_schema"
    assert "tools" not in first
    # the tool's result went back to the model as an observation
    assert llm.requests[1]["messages"][-1] == {"role": "user", "content": "Observation: 200.0"}
    assert agent.task is not None and agent.task.result == "AAPL is at 200.0"


async def test_native_tool_calls_run_concurrently(llm: StandinLLM) -> None:
    arrived = 0
    both_here = anyio.Event()

    @tool
    async def rendezvous(name: str) -> str:
        """Wait until both calls are in flight; sequential execution would never get past this.

        Args:
            name: who arrives.
        """
        nonlocal arrived
        arrived += 1
        if arrived == 2:
            both_here.set()
        await both_here.wait()
        return f"{name} met"

    llm.add(
        reply(tool_calls=[("rendezvous", {"name": "a"}), ("rendezvous", {"name": "b"})]),
        reply("Both met."),
    )
    agent = ReActAgent(llm.model("native"), litellm_params=llm.params(), tools=[rendezvous])
    with anyio.fail_after(60):  # a hang guard, not a timing assertion
        responses = await collect(agent.run("Meet twice"))

    assert responses[-1].value == "Both met."
    assert llm.requests[0]["tools"][0]["function"]["name"] == "rendezvous"
    tool_messages = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["a met", "b met"]
    ids = [c["id"] for c in llm.requests[1]["messages"][-3]["tool_calls"]]
    assert [m["tool_call_id"] for m in tool_messages] == ids
    [step, _] = steps(responses)
    assert [c.result for c in step.tool_calls] == ["a met", "b met"]


async def test_native_invalid_arguments_are_told_to_the_model(llm: StandinLLM) -> None:
    llm.add(
        reply(tool_calls=[("get_price", {"ticker": "AAPL"})]),
        reply(tool_calls=[("get_price", "{not json")]),
        reply(tool_calls=[("get_price", {"symbol": "AAPL"})]),
        reply("200.0"),
    )
    responses = await collect(make(llm, "native").run("AAPL?"))
    assert responses[-1].value == "200.0"
    observations = [m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert "symbol: Field required" in observations[0]
    assert "ticker" in observations[0]
    assert "not valid JSON" in observations[1]
    assert observations[2] == "200.0"
    assert CALLS == ["AAPL"]  # the function never ran with bad arguments


async def test_prose_fallback(llm: StandinLLM) -> None:
    llm.add(
        'Thought: I need the price.\nAction: get_price\nArgs: {"symbol": "MSFT"}',
        "Thought: Done.\nAnswer: MSFT trades at 410.5\nSuccessful: true",
    )
    agent = make(llm, "plain")
    responses = await collect(agent.run("MSFT?"))
    assert responses[-1].value == "MSFT trades at 410.5"
    assert CALLS == ["MSFT"]
    assert "response_format" not in llm.requests[0] and "tools" not in llm.requests[0]
    parsed = agent.parse_text_response("Thought: t\nAction: get_price\nArgs: {}")
    assert isinstance(parsed, ChatMessage) and parsed.action == "get_price"  # type: ignore[attr-defined]


async def test_malformed_json_is_reported_and_the_model_recovers(llm: StandinLLM) -> None:
    llm.add("I am not sure what to do here.", "```json\n" + react_finish("42") + "\n```")
    responses = await collect(make(llm, "json").run("Answer"))
    assert responses[-1].value == "42"
    [bad, good] = steps(responses)
    assert bad.error and "unusable reply" in bad.error
    feedback = llm.requests[1]["messages"][-1]
    assert feedback["role"] == "user" and "could not be used" in feedback["content"]


async def test_unknown_and_excluded_tools(llm: StandinLLM) -> None:
    llm.add(
        react_call("secret_tool", {"x": 1}),
        react_call("no_such_tool", {}),
        react_finish("gave up", successful=False),
    )
    agent = make(llm, "json", allowed_tools=["get_*"])
    responses = await collect(agent.run("Try the secret tool"))
    system = llm.requests[0]["messages"][0]["content"]
    assert "get_price" in system and "secret_tool" not in system
    assert CALLS == []  # never callable
    first_obs = llm.requests[1]["messages"][-1]["content"]
    assert "no tool named 'secret_tool'" in first_obs and "get_price" in first_obs
    assert responses[-1].metadata["task_successful"] is False
    assert agent.tool_names == {"get_price"}


async def test_allowed_tools_per_run_and_empty_list(llm: StandinLLM) -> None:
    llm.add(reply("nothing to call"))
    agent = make(llm, "native")
    responses = await collect(agent.run("hi", allowed_tools=[]))
    assert responses[-1].value == "nothing to call"
    # with no tools allowed, none are sent, and a plain reply is still the answer
    assert "tools" not in llm.requests[0]
    assert "(no tools are available" in llm.requests[0]["messages"][0]["content"]


# ---------------------------------------------------------------------- the provider misbehaves


async def test_server_error_then_success_is_retried(llm: StandinLLM) -> None:
    llm.add(error(500), react_finish("fine"))
    agent = make(llm, "json")
    responses = await collect(agent.run("q"))
    assert responses[-1].value == "fine"
    assert len(llm.requests) == 2
    assert agent.usage_tracker.records[0].attempts == 2


async def test_slow_reply_past_the_timeout_is_retried(llm: StandinLLM) -> None:
    llm.add(slow(12, reply(react_finish("late"))), react_finish("on time"))
    # generous enough that the prompt reply arrives in time even on a loaded machine
    agent = ReActAgent(llm.model("json"), litellm_params=llm.params(timeout=4), tools=[get_price])
    agent.retry_base_delay = 0.01
    responses = await collect(agent.run("q"))
    assert responses[-1].value == "on time"


async def test_retries_run_out(llm: StandinLLM) -> None:
    llm.add(error(503), error(502), error(500))
    agent = make(llm, "json", max_retries=2)
    with pytest.raises(RetryError) as info:
        await collect(agent.run("q"))
    assert "3 times" in str(info.value)
    assert len(llm.requests) == 3


async def test_permanent_error_is_not_retried(llm: StandinLLM) -> None:
    llm.add(error(400, "bad request"), react_finish("never"))
    from kodeagent import LLMError

    with pytest.raises(LLMError):
        await collect(make(llm, "json").run("q"))
    assert len(llm.requests) == 1


# ---------------------------------------------------------------------- run() arguments


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": ""}, "non-empty"),
        ({"task": "   "}, "non-empty"),
        ({"task": "x", "recurrent_mode": True, "chat_history": []}, "recurrent_mode and chat_history"),
        ({"task": "x", "chat_history": [{"role": "robot", "content": "hi"}]}, "role 'robot'"),
        ({"task": "x", "chat_history": [{"role": "user"}]}, "no content"),
        ({"task": "x", "chat_history": [{"role": "tool", "content": "r", "tool_call_id": "c9"}]}, "c9"),
        ({"task": "x", "chat_history": "hello"}, "list of messages"),
        ({"task": "x", "files": [f"f{i}" for i in range(50)]}, "too many files"),
        ({"task": "x", "inputs": {"not valid": 1}}, "identifier"),
        ({"task": "x", "history": [{"role": "system", "content": "s"}]}, "earlier turns"),
    ],
)
async def test_run_value_errors(llm: StandinLLM, kwargs: dict[str, Any], message: str) -> None:
    agent = make(llm, "json")
    with pytest.raises(ValueError, match=message):
        await collect(agent.run(**kwargs))
    assert llm.requests == []  # nothing was sent


async def test_chat_history_is_continued(llm: StandinLLM) -> None:
    llm.add(react_finish("Your name is Ada."))
    history = [
        {"role": "system", "content": "an old system prompt"},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
    ]
    agent = make(llm, "json")
    await collect(agent.run("What is my name?", chat_history=history))
    sent = llm.requests[0]["messages"]
    assert sent[0]["role"] == "system" and "an old system prompt" not in sent[0]["content"]
    assert sent[1:3] == history[1:]
    assert "What is my name?" in sent[3]["content"]
    assert agent.msg_idx_of_new_task == 3


async def test_history_and_inputs(llm: StandinLLM) -> None:
    llm.add(react_finish("Turku is sunny"))
    agent = make(llm, "json")
    await collect(
        agent.run(
            "Weather?",
            history=[
                ChatMessage(role="user", content="I live in Turku."),
                {"role": "assistant", "content": "OK."},
            ],
            inputs={"city": "Turku", "days": [1, 2]},
        )
    )
    sent = llm.requests[0]["messages"]
    assert sent[1] == {"role": "user", "content": "I live in Turku."}
    assert sent[2] == {"role": "assistant", "content": "OK."}
    assert '- city = "Turku"' in sent[3]["content"] and "- days = [1, 2]" in sent[3]["content"]


async def test_recurrent_mode_mentions_previous_task(llm: StandinLLM) -> None:
    llm.add(react_finish("4"), react_finish("8"))
    agent = make(llm, "json")
    await collect(agent.run("What is 2+2?"))
    await collect(agent.run("Double it.", recurrent_mode=True))
    task_message = llm.requests[1]["messages"][1]["content"]
    assert "What is 2+2?" in task_message and "4" in task_message and "Double it." in task_message


# ---------------------------------------------------------------------- structured answers and hooks


class Quote(BaseModel):
    symbol: str
    price: float


async def test_response_model_retry_on_validation_failure(llm: StandinLLM) -> None:
    llm.add(
        react_finish('{"symbol": "AAPL"}'),
        react_finish('{"symbol": "AAPL", "price": 200.0}'),
    )
    agent = make(llm, "json")
    responses = await collect(agent.run("Quote AAPL", response_model=Quote))
    assert responses[-1].value == Quote(symbol="AAPL", price=200.0)
    assert "price" in llm.requests[0]["messages"][1]["content"]  # the schema is in the task
    rejection = llm.requests[1]["messages"][-1]["content"]
    assert "price: Field required" in rejection


async def test_on_step_sync_and_async(llm: StandinLLM) -> None:
    seen: list[StepRecord] = []

    async def record(step: StepRecord) -> None:
        seen.append(step)

    llm.add(react_call("get_price", {"symbol": "AAPL"}), react_finish("200"))
    await collect(make(llm, "json", on_step=record).run("AAPL?"))
    assert [s.index for s in seen] == [1, 2]
    assert seen[0].tool_calls[0].name == "get_price" and seen[0].tool_calls[0].result == 200.0
    assert seen[1].is_final and seen[1].output == "200"

    calls: list[int] = []
    llm.add(react_finish("x"))
    await collect(make(llm, "json", on_step=lambda s: calls.append(s.index)).run("q"))
    assert calls == [1]


async def test_system_prompt_is_identical_across_steps(llm: StandinLLM) -> None:
    llm.add(
        react_call("get_price", {"symbol": "AAPL"}),
        react_call("get_price", {"symbol": "MSFT"}),
        react_finish("done"),
    )
    await collect(make(llm, "json", persona="You are terse.").run("Both prices"))
    systems = [r["messages"][0] for r in llm.requests]
    assert len(systems) == 3 and all(s == systems[0] for s in systems)
    assert "You are terse." in systems[0]["content"]
    # and the conversation only grows: each request extends the previous one
    for before, after in zip(llm.requests, llm.requests[1:], strict=False):
        assert after["messages"][: len(before["messages"])] == before["messages"]


async def test_out_of_steps_salvages_progress(llm: StandinLLM) -> None:
    llm.add(
        react_call("get_price", {"symbol": "AAPL"}),
        react_call("get_price", {"symbol": "MSFT"}),
        reply("AAPL is 200.0; MSFT was not checked to the end."),
    )
    agent = make(llm, "json")
    responses = await collect(agent.run("Prices", max_iterations=2))
    final = responses[-1]
    assert final.type == "final" and final.metadata["task_successful"] is False
    assert "not finished within 2 steps" in final.value and "AAPL is 200.0" in final.value
    assert "salvage" in agent.get_usage_metrics()["by_component"]
    assert not agent.final_answer_found


async def test_observer_notices_a_repeated_failing_action(llm: StandinLLM) -> None:
    bad = react_call("get_price", {"symbol": "NOPE"})
    llm.add(bad, bad, bad, react_finish("cannot", successful=False))
    responses = await collect(make(llm, "json").run("NOPE price"))
    notes = [r for r in responses if r.type == "log" and r.channel == "observer"]
    assert len(notes) == 1 and "failed 3 times" in notes[0].value
    assert "supervisor" in llm.requests[3]["messages"][-1]["content"]


async def test_planner_and_usage_per_component(llm: StandinLLM) -> None:
    llm.add(
        reply("1. [ ] get the price\n2. [ ] answer", usage=(50, 10)),
        reply(react_finish("200"), usage=(100, 20)),
    )
    agent = make(llm, "json", use_planner=True)
    responses = await collect(agent.run("AAPL?"))
    assert agent.current_plan and "get the price" in agent.current_plan
    assert any(r.type == "log" and r.channel == "planner" for r in responses)
    assert "get the price" in llm.requests[1]["messages"][-1]["content"]
    metrics = agent.get_usage_metrics()
    assert metrics["by_component"]["planner"]["prompt_tokens"] == 50
    assert metrics["by_component"]["agent"]["completion_tokens"] == 20
    assert metrics["total"]["total_tokens"] == 180
    assert metrics["total"]["cost"] == pytest.approx(150 * PRICE_IN + 30 * PRICE_OUT)
    report = agent.get_usage_report()
    assert "planner" in report and "agent" in report
    assert "planner" not in agent.get_usage_report(include_breakdown=False)


async def test_filter_tools_for_task(llm: StandinLLM) -> None:
    llm.add(reply('["get_price"]'), react_finish("ok"))
    agent = make(llm, "json", filter_tools_for_task=True)
    await collect(agent.run("Price of AAPL"))
    system = llm.requests[1]["messages"][0]["content"]
    assert "get_price" in system and "secret_tool" not in system
    assert "tool_filter" in agent.get_usage_metrics()["by_component"]


# ---------------------------------------------------------------------- surface


async def test_history_view_truncates_and_skips_system(llm: StandinLLM) -> None:
    llm.add(react_finish("y" * 5000))
    agent = make(llm, "json")
    await collect(agent.run("long"))
    text = agent.get_history()
    assert "You are" not in text
    assert "[user]" in text and "[assistant]" in text
    assert max(len(line) for line in text.splitlines()) < agent.HISTORY_TRUNCATE_CHARS + 20


def test_vision_support() -> None:
    register_standin_models()
    assert llm_vision_support(["openai/standin-native", "openai/standin-plain", "no/such-model"]) == [
        True,
        False,
        False,
    ]


async def test_response_helper_stores_final_result(llm: StandinLLM) -> None:
    llm.add(react_finish(json.dumps({"a": 1})))
    agent = make(llm, "json")
    await collect(agent.run("q"))
    r = agent.response("final", "direct")
    assert r.rtype == "final" and agent.task is not None and agent.task.result == "direct"


async def test_task_record_and_reference_module_path(llm: StandinLLM) -> None:
    from kodeagent.kodeagent import Agent as RefAgent
    from kodeagent.kodeagent import ReActAgent as RefReAct

    assert RefReAct is ReActAgent and issubclass(RefReAct, RefAgent)
    llm.add(react_call("get_price", {"symbol": "AAPL"}), react_finish("200"))
    agent = make(llm, "json")
    await collect(agent.run("AAPL?", task_id="task-7"))
    assert agent.task is not None
    assert agent.task.id == "task-7" and agent.task.is_finished and agent.task.steps_taken == 2
    assert agent.response_format_class.__name__ == "ReActChatMessage"
    assert [s.index for s in agent.steps] == [1, 2]


async def test_order_of_responses(llm: StandinLLM) -> None:
    llm.add(react_call("get_price", {"symbol": "AAPL"}), react_finish("200"))
    responses = await collect(make(llm, "json").run("AAPL?"))
    assert [(r.type, r.channel) for r in responses] == [
        ("step", "react"),
        ("step", "react"),
        ("log", "usage"),
        ("final", "react"),
    ]
    assert responses[2].metadata["calls"] == 2
    assert responses[3].metadata["usage"]["calls"] == 2


async def test_standin_rejects_what_a_provider_would(llm: StandinLLM) -> None:
    """The stand-in checks requests like the provider does, so the agents' histories are really checked."""
    from kodeagent import LLMError, call_llm

    bad = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "r"}]
    with pytest.raises(LLMError, match="tool message must answer"):
        await call_llm(llm.model("json"), bad, component="test", litellm_params=llm.params())
    assert llm.rejected and llm.requests == []


async def test_prompt_cache_marker_on_the_system_prompt(llm: StandinLLM) -> None:
    llm.add(react_call("get_price", {"symbol": "AAPL"}), react_finish("200"))
    agent = make(llm, "json")
    assert agent._prompt_cache_wanted() is False
    assert ReActAgent("anthropic/claude-sonnet-4-5")._prompt_cache_wanted() is True
    agent.prompt_cache = True
    await collect(agent.run("AAPL?"))
    for request in llm.requests:
        [part] = request["messages"][0]["content"]
        assert part["cache_control"] == {"type": "ephemeral"} and "get_price" in part["text"]
    assert isinstance(agent.chat_history[0]["content"], str)  # the history itself is unchanged


async def test_no_summary_when_not_asked(llm: StandinLLM) -> None:
    llm.add(react_call("get_price", {"symbol": "AAPL"}))
    agent = make(llm, "json")
    responses = await collect(agent.run("AAPL?", max_iterations=1, summarize_progress_on_failure=False))
    assert responses[-1].value == "The task was not finished within 1 step."
    assert len(llm.requests) == 1


async def test_garbled_response_body_is_retried(llm: StandinLLM) -> None:
    llm.add(garbled(), react_finish("fine"))
    agent = make(llm, "json")
    responses = await collect(agent.run("q"))
    assert responses[-1].value == "fine"
    assert len(llm.requests) == 2


async def test_input_args_pass_context_variables_by_reference(llm: StandinLLM) -> None:
    seen: list[list[float]] = []

    @tool
    def total(values: list[float]) -> float:
        """Sum numbers. Args: values: the numbers."""
        seen.append(values)
        return sum(values)

    big = [float(i) for i in range(100)]
    llm.add(
        json.dumps({"thought": "t", "action": "total", "args": "{}", "input_args": {"values": "nope"}}),
        json.dumps({"thought": "t", "action": "total", "args": "{}", "input_args": {"values": "numbers"}}),
        react_finish("4950"),
    )
    agent = ReActAgent(llm.model("json"), litellm_params=llm.params(), tools=[total])
    responses = await collect(agent.run("Sum the numbers", inputs={"numbers": big}))
    assert responses[-1].value == "4950"
    assert "input_args" in llm.requests[0]["messages"][1]["content"]  # the model is told how
    assert (
        "'nope', which is not a context variable (known: numbers)"
        in llm.requests[1]["messages"][-1]["content"]
    )
    assert seen == [big]
    assert llm.requests[2]["messages"][-1]["content"] == "Observation: 4950.0"
