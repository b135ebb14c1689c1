"""The node side of the ray backend (`ray.node.NodeAgent`) driven directly, without a cluster: the event
protocol the parent relies on, with real host-backend sessions behind it. What crosses the cluster is
tested on a real one in `test_ray.py`."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sandboxes import HostExecutor, Policy
from sandboxes.backends.ray.node import NodeAgent

# No cluster, but the node agent's reaper imports ray: the ray tier.
pytestmark = [pytest.mark.anyio, pytest.mark.ray]


async def opened(agent: NodeAgent, session: str, tools: list[str] | None = None, **options: Any) -> None:
    answer = await agent.open(session, "group-id", "host", {"timeout": 10, **options}, tools or [])
    assert answer["kind"] == "opened", answer


async def test_a_tool_call_is_an_event_and_the_answer_resumes_the_run() -> None:
    agent = NodeAgent()
    await opened(agent, "s", ["double"])
    try:
        event = await agent.run("s", "print(double(21), double(n=2))")
        assert event == {"kind": "tool", "id": 1, "name": "double", "args": [21], "kwargs": {}}
        await agent.answer("s", 1, {"value": 42})
        event = await agent.next_event("s")
        assert event["kind"] == "tool" and event["kwargs"] == {"n": 2}
        await agent.answer("s", event["id"], {"value": 4})
        done = await agent.next_event("s")
        assert done["kind"] == "done" and done["result"]["stdout"] == "42 4\n"
    finally:
        await agent.close("s")


async def test_a_tool_error_reaches_the_code_as_on_a_local_backend() -> None:
    def refuse() -> None:
        raise PermissionError("no access")

    code = "try:\n    refuse()\nexcept Exception as e:\n    print(type(e).__name__, '|', e)"
    agent = NodeAgent()
    await opened(agent, "s", ["refuse"])
    try:
        event = await agent.run("s", code)
        await agent.answer("s", event["id"], {"error": {"type": "PermissionError", "message": "no access"}})
        done = await agent.next_event("s")
    finally:
        await agent.close("s")
    async with HostExecutor(timeout=10, tools={"refuse": refuse}) as local:
        expected = await local.run(code)
    assert done["result"]["stdout"] == expected.stdout
    assert "PermissionError" in expected.stdout


async def test_an_answer_after_the_timeout_is_dropped_and_the_run_times_out() -> None:
    agent = NodeAgent()
    await opened(agent, "s", ["slow"], timeout=1)
    try:
        event = await agent.run("s", "print(slow())")
        with anyio.fail_after(20):
            done = await agent.next_event("s")  # nobody answers: the node's own timeout ends the run
        assert done["kind"] == "done" and done["result"]["timed_out"] and done["result"]["state_lost"]
        await agent.answer("s", event["id"], {"value": "late"})  # dropped, not delivered to the next run
        after = await agent.run("s", "print('next')")
        assert after["kind"] == "done" and after["result"]["stdout"] == "next\n"
    finally:
        await agent.close("s")


async def test_close_during_a_run_ends_it() -> None:
    agent = NodeAgent()
    await opened(agent, "s", policy=Policy(allowed_imports=["time"]))
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run, "s", "import time\ntime.sleep(60)")
        await anyio.sleep(0.5)
        with anyio.fail_after(20):
            await agent.close("s")
        group.cancel_scope.cancel()  # the run's own call waits for an event that no longer comes
    assert (await agent.run("s", "print(1)"))["kind"] == "lost"
    assert (await agent.info())["sessions"] == 0


async def test_misuse_and_unknown_sessions_are_answered_not_raised() -> None:
    agent = NodeAgent()
    assert (await agent.open("s", "g", "host", {"isolaton": "process"}, []))["type"] == "TypeError"
    assert (await agent.run("nobody", "print(1)"))["kind"] == "lost"
    assert (await agent.download("nobody", "a.txt"))["kind"] == "lost"
    await opened(agent, "s", ["wait"])
    try:
        missing = await agent.download("s", "missing.txt")
        assert missing["kind"] == "error" and missing["type"] == "SandboxFileError"
        event = await agent.run("s", "wait()\nprint(1)")
        second = await agent.run("s", "print(2)")
        assert second == {
            "kind": "error",
            "type": "ProtocolError",
            "message": "a run of this session is in progress",
        }
        await agent.answer("s", event["id"], {"value": None})
        done = await agent.next_event("s")
        assert done["kind"] == "done" and done["result"]["stdout"] == "1\n"
    finally:
        await agent.close("s")


async def forked(agent: NodeAgent, parent: str, child: str) -> dict[str, Any]:
    answer = await agent.fork(parent, child, "child-group")
    assert answer["kind"] == "opened", answer
    return dict(answer)


async def test_a_fork_is_a_new_node_session_with_a_copy_of_the_state_and_its_own_tool_queue() -> None:
    agent = NodeAgent()
    await opened(agent, "p", ["ask"])
    try:
        assert (await agent.run("p", "x = [1, 2]"))["kind"] == "done"
        answer = await forked(agent, "p", "c")
        assert answer["isolation"] in ("namespaces", "process")
        assert answer["report"]["seconds"] > 0 and answer["report"]["threads_not_copied"] == 0
        assert (await agent.info())["sessions"] == 2
        # Both ways independent: each changes its copy, and sees only its own change.
        child = await agent.run("c", "x.append('child')\nprint(x)")
        parent = await agent.run("p", "x.append('parent')\nprint(x)")
        assert child["kind"] == "done" and child["result"]["stdout"] == "[1, 2, 'child']\n"
        assert parent["kind"] == "done" and parent["result"]["stdout"] == "[1, 2, 'parent']\n"
        # The child's tool call is the child's event; the parent's queue stays empty.
        event = await agent.run("c", "print(ask('q'))")
        assert event == {"kind": "tool", "id": 1, "name": "ask", "args": ["q"], "kwargs": {}}
        assert agent.sessions["p"].events.empty() and not agent.sessions["p"].pending
        await agent.answer("c", 1, {"value": "for the child"})
        done = await agent.next_event("c")
        assert done["kind"] == "done" and done["result"]["stdout"] == "for the child\n"
        # The parent's own tool calls still reach the parent's queue.
        event = await agent.run("p", "print(ask('p'))")
        assert event["kind"] == "tool" and event["args"] == ["p"]
        assert agent.sessions["c"].events.empty()
        await agent.answer("p", event["id"], {"value": "for the parent"})
        done = await agent.next_event("p")
        assert done["kind"] == "done" and done["result"]["stdout"] == "for the parent\n"
    finally:
        await agent.close("c")
        await agent.close("p")
    assert (await agent.info())["sessions"] == 0


async def test_closing_either_side_of_a_fork_leaves_the_other_running() -> None:
    agent = NodeAgent()
    await opened(agent, "p")
    try:
        await agent.run("p", "x = 1")
        await forked(agent, "p", "c1")
        await agent.close("p")
        assert (await agent.run("p", "print(x)"))["kind"] == "lost"
        alive = await agent.run("c1", "x += 1\nprint(x)")
        assert alive["kind"] == "done" and alive["result"]["stdout"] == "2\n"
        # A fork of the fork; then the middle one closes and the last one still runs.
        await forked(agent, "c1", "c2")
        await agent.close("c1")
        last = await agent.run("c2", "print(x * 10)")
        assert last["kind"] == "done" and last["result"]["stdout"] == "20\n", last
        assert not last["result"]["state_lost"]
    finally:
        for name in ("p", "c1", "c2"):
            await agent.close(name)
    assert (await agent.info())["sessions"] == 0


async def test_a_fork_is_refused_during_a_run_and_of_a_missing_session() -> None:
    agent = NodeAgent()
    await opened(agent, "p", ["wait"])
    try:
        event = await agent.run("p", "x = wait()\nprint(x)")
        busy = await agent.fork("p", "c", "g")
        assert busy["kind"] == "error" and busy["type"] == "ExecutorBusy", busy
        assert "in progress" in busy["message"]
        await agent.answer("p", event["id"], {"value": 7})
        done = await agent.next_event("p")
        assert done["kind"] == "done" and done["result"]["stdout"] == "7\n"  # the refusal left it intact
        assert (await agent.fork("nobody", "c", "g"))["kind"] == "lost"
        existing = await agent.fork("p", "p", "g")
        assert existing["kind"] == "error" and existing["type"] == "ValueError"
        assert (await agent.info())["sessions"] == 1
    finally:
        await agent.close("p")


async def test_a_child_closed_while_it_is_being_forked_is_ended_once_made() -> None:
    agent = NodeAgent()
    await opened(agent, "p")
    try:
        await agent.run("p", "x = 1")
        async with anyio.create_task_group() as group:
            answers: list[dict[str, Any]] = []

            async def fork() -> None:
                answers.append(dict(await agent.fork("p", "c", "g")))

            group.start_soon(fork)
            while "c" not in agent._forking:
                await anyio.sleep(0)
            await agent.close("c")  # as a driver whose fork was cancelled does
        assert answers == [{"kind": "lost", "message": "this node no longer holds the session"}]
        assert "c" not in agent.sessions and not agent._forking
        after = await agent.run("p", "print(x)")
        assert after["kind"] == "done" and after["result"]["stdout"] == "1\n"
    finally:
        await agent.close("p")
    assert (await agent.info())["sessions"] == 0
