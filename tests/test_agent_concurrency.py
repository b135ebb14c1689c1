"""One agent, several tasks at once: a second concurrent run is refused, clones and sub-agents are independent.

The stand-in answers each request from its own messages (`dynamic`), since concurrent runs reach the
server in no fixed order; every answer must come back to the run that asked for it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import pytest
from support.llm_standin import (
    StandinLLM,
    code_final,
    code_step,
    collect,
    dynamic,
    react_finish,
    reply,
)

from kodeagent import AgentBusyError, CodeActAgent, ReActAgent

pytestmark = pytest.mark.anyio


def _task_number(body: dict[str, Any]) -> int:
    """The number N in the run's task text 'square N' (the first user message)."""
    first_user = next(m for m in body["messages"] if m["role"] == "user")
    content = (
        first_user["content"] if isinstance(first_user["content"], str) else json.dumps(first_user["content"])
    )
    return int(re.search(r"square (\d+)", content).group(1))  # type: ignore[union-attr]


def _square_react(body: dict[str, Any]) -> str:
    return react_finish(str(_task_number(body) ** 2))


async def test_a_second_concurrent_run_on_one_agent_is_refused(llm: StandinLLM) -> None:
    started = anyio.Event()
    release = anyio.Event()

    async def wait_for_release() -> str:
        """Blocks until the test lets it go."""
        started.set()
        await release.wait()
        return "released"

    llm.add(
        reply(json.dumps({"thought": "t", "action": "wait_for_release", "args": "{}"})), react_finish("first")
    )
    agent = ReActAgent(llm.model("json"), litellm_params=llm.params(), tools=[wait_for_release])
    results: dict[str, Any] = {}

    async def first() -> None:
        results["first"] = (await collect(agent.run("square 1")))[-1].value

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        await started.wait()
        with pytest.raises(AgentBusyError, match="clone"):
            await collect(agent.run("square 2"))
        release.set()
    assert results["first"] == "first"
    # Once the first run is over, the same agent runs again.
    llm.add(react_finish("again"))
    assert (await collect(agent.run("square 3")))[-1].value == "again"


async def test_clones_run_tasks_in_parallel_with_independent_state(llm: StandinLLM) -> None:
    llm.add(*[dynamic(_square_react) for _ in range(4)])
    agent = ReActAgent(llm.model("json"), litellm_params=llm.params())
    clones = [agent.clone() for _ in range(4)]
    answers: dict[int, Any] = {}

    async def one(n: int) -> None:
        answers[n] = (await collect(clones[n].run(f"square {n + 5}")))[-1].value

    async with anyio.create_task_group() as group:
        for n in range(4):
            group.start_soon(one, n)
    assert answers == {n: str((n + 5) ** 2) for n in range(4)}
    for n, clone in enumerate(clones):
        assert clone.task is not None and clone.task.description == f"square {n + 5}"
        assert clone.usage_tracker.metrics()["total"]["calls"] == 1
    assert agent.task is None and agent.usage_tracker.records == []  # the original was never run


async def test_parallel_calls_of_one_sub_agent_get_their_own_answers_and_roll_up_usage(
    llm: StandinLLM,
) -> None:
    helper = CodeActAgent(
        llm.model("json"),
        litellm_params=llm.params(),
        name="squarer",
        description="Squares a number with Python.",
    )
    manager = ReActAgent(llm.model("native"), litellm_params=llm.params(), tools=[helper.as_tool()])

    def helper_step(body: dict[str, Any]) -> str:
        observations = [m for m in body["messages"] if m["role"] == "user" and "Observation" in m["content"]]
        n = _task_number(body)
        if not observations:
            return code_step(f"print({n} ** 2)")
        printed = re.search(r"Output:\n(\d+)", observations[-1]["content"]).group(1)  # type: ignore[union-attr]
        return code_final(printed)

    llm.add(reply(tool_calls=[("squarer", {"task": "square 11"}), ("squarer", {"task": "square 12"})]))
    llm.add(*[dynamic(helper_step) for _ in range(4)])
    llm.add(reply("121 and 144"))
    responses = await collect(manager.run("What are 11 squared and 12 squared?"))
    step = next(r.value for r in responses if r.type == "step")
    assert sorted((c.args["task"], c.result) for c in step.tool_calls) == [
        ("square 11", "121"),
        ("square 12", "144"),
    ]
    assert responses[-1].value == "121 and 144"
    usage = manager.get_usage_metrics()
    assert usage["by_component"]["squarer.agent"]["calls"] == 4  # two steps in each of the two helper runs
    assert usage["total"]["calls"] == 6
    assert helper.task is None  # each call ran on a clone: the helper itself holds no run


async def test_a_sub_agent_called_from_codeact_code_rolls_up_usage(llm: StandinLLM) -> None:
    helper = ReActAgent(
        llm.model("json"), litellm_params=llm.params(), name="oracle", description="Answers questions."
    )
    manager = CodeActAgent(llm.model("json"), litellm_params=llm.params(), tools=[helper.as_tool()])
    llm.add(
        code_step('print(oracle(task="square 9"))'),
        dynamic(_square_react),
        code_final("81"),
    )
    responses = await collect(manager.run("Ask the oracle for 9 squared"))
    assert responses[-1].value == "81"
    first_step = next(r.value for r in responses if r.type == "step")
    assert first_step.observation == "Output:\n81"
    usage = manager.get_usage_metrics()
    assert usage["by_component"]["oracle.agent"]["calls"] == 1
    assert usage["total"]["calls"] == 3


async def test_nothing_of_one_run_reaches_the_next(llm: StandinLLM) -> None:
    """Each run has state of its own (nothing is reset): the observer's one reminder that steps are
    running out comes in every run, and steps and usage are the run's alone."""

    def get_price(symbol: str) -> float:
        """Latest price. Args: symbol: the ticker."""
        return 200.0

    agent = ReActAgent(llm.model("json"), litellm_params=llm.params(), tools=[get_price], max_iterations=3)
    for task in ("square 1", "square 2"):
        llm.add(
            json.dumps({"thought": "t", "action": "get_price", "args": '{"symbol": "A"}'}), react_finish("ok")
        )
        responses = await collect(agent.run(task))
        reminders = [r for r in responses if r.channel == "observer" and "only 2 step(s) remain" in r.value]
        assert len(reminders) == 1, task
        assert agent.task is not None and agent.task.description == task
        assert [s.index for s in agent.steps] == [1, 2]
        assert agent.usage_tracker.metrics()["total"]["calls"] == 2
