"""The Ray driver's side of a node agent's answers: whatever an agent answers, a run returns its result
or raises the `ProtocolError` the executor turns into a discarded session, never a `KeyError`,
`TypeError` or an exception group. The agent here is a plain object whose methods answer as a
hostile node would (the cluster's own transport is tests/backends/ray/test_ray.py's business)."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.backends.ray import Placement, RaySession
from sandboxes.backends.ray.cluster import Reservation
from sandboxes.errors import ProtocolError
from sandboxes.runtime.protocol import ToolCall, ToolResult

pytestmark = pytest.mark.anyio

DONE_RESULT = {"stdout": "ok\n"}


class Remote:
    """`agent.<method>.remote(...)`: an awaitable of the next scripted answer."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    async def remote(self, *args: Any) -> Any:
        return self.answers.pop(0) if self.answers else {"kind": "done", "result": DONE_RESULT}


class Agent:
    def __init__(self, events: list[Any]) -> None:
        self.run = Remote(events[:1])
        self.next_event = Remote(events[1:])
        self.answer = Remote([None] * 10)
        self.close = Remote([None])


def session(events: list[Any]) -> RaySession:
    reservation = Reservation(group=None, node_id="n" * 32, resource="kodeagent_sandbox")
    return RaySession(Placement("s1", reservation, Agent(events)), "namespaces")


async def tools(call: ToolCall) -> ToolResult:
    return {"op": "tool_result", "id": call["id"], "value": None}


TOOL = {"kind": "tool", "id": 1, "name": "lookup", "args": [], "kwargs": {}}

HOSTILE = {
    "no kind": [{"result": DONE_RESULT}],
    "a kind of another type": [{"kind": ["done"]}],
    "an unknown kind": [{"kind": "surprise"}],
    "not a mapping": [["done"]],
    "a result that is not one": [{"kind": "done", "result": {"stdout": 5}}],
    "a tool call whose name is a list": [{**TOOL, "name": ["lookup"]}],
    "a tool call without its id": [{k: v for k, v in TOOL.items() if k != "id"}],
    "a bad event after a good tool call": [
        TOOL,
        {"kind": "output", "stream": "fd9", "text": "x", "dropped": 0},
    ],
    "an error naming no type": [{"kind": "error", "message": "x"}],
}


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("answer", sorted(HOSTILE))
async def test_a_malformed_answer_is_a_protocol_error(answer: str, streamed: bool) -> None:
    run = session(HOSTILE[answer])
    on_output = (lambda event: None) if streamed else None
    with pytest.raises(ProtocolError, match="the cluster node sent a malformed"):
        await run.run("x", tools, on_output, {"chars": 100, "chars_per_second": 100} if streamed else None)


async def test_well_formed_answers_make_the_result() -> None:
    run = session([TOOL, {"kind": "done", "result": {"stdout": "ran\n"}}])
    result = await run.run("x", tools)
    assert result.stdout == "ran\n"
