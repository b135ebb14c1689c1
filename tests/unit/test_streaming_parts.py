"""The pure parts of streaming: the token bucket, the runner's streamer, the parent's output gate and
its event buffer, the budget's validation. No worker, no clock-dependent assertion."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from sandboxes import (
    ExecutionResult,
    OutputEvent,
    ResultEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from sandboxes.errors import ProtocolError
from sandboxes.events import EventStream, stream_options
from sandboxes.runtime import bounds
from sandboxes.runtime.runner import Streamer
from sandboxes.session import OutputGate


def test_the_bucket_grants_its_capacity_then_its_rate() -> None:
    bucket = bounds.TokenBucket(100, 10, now=0.0)
    assert bucket.take(60, now=0.0) == 60
    assert bucket.take(60, now=0.0) == 40  # the burst is spent
    assert bucket.take(60, now=0.0) == 0
    assert bucket.take(60, now=2.0) == 20  # two seconds at 10 a second
    assert bucket.take(1000, now=1000.0) == 100  # refills up to its capacity, no further


class BlockedChannel:
    """A channel whose writes wait until released, as a parent that stopped reading."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.sent: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any], limit: int | None = None) -> None:
        self.released.wait()
        self.sent.append(dict(message))


def test_the_streamer_never_waits_for_a_blocked_channel_and_counts_every_character() -> None:
    channel = BlockedChannel()
    streamer = Streamer(channel)  # type: ignore[arg-type]
    streamer.start({"chars": 1_000_000, "chars_per_second": 1})
    offered = 0
    done = threading.Event()

    def write() -> None:  # the drain thread's side: 20 MB while nothing can be sent
        nonlocal offered
        for i in range(200):
            text = ("é" if i % 2 else "x") * 100_000
            streamer.offer("stdout", text)
            offered += len(text)
        streamer.offer("stderr", "err")
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert done.wait(60), "offer() waited for the channel"
    channel.released.set()
    streamer.finish()
    writer.join()
    out = [m for m in channel.sent if m["stream"] == "stdout"]
    assert all(m["op"] == "output" for m in channel.sent)
    streamed = sum(len(m["text"]) for m in out)
    assert streamed + sum(m["dropped"] for m in out) == offered  # streamed or counted, nothing lost
    assert streamed <= bounds.STREAM_BUFFER_CHARS * 2  # what the buffer (and one batch in flight) holds
    assert all(len(m["text"]) <= bounds.STREAM_MESSAGE_CHARS for m in channel.sent)
    err = [m for m in channel.sent if m["stream"] == "stderr"]
    assert sum(len(m["text"]) + m["dropped"] for m in err) == 3  # the buffer was full: counted
    streamer.offer("stdout", "after the run")  # not streamed: the run's stream ended
    streamer.finish()
    assert not any("after" in m["text"] for m in channel.sent)


def test_the_gate_bounds_a_forged_flood_and_counts_what_it_cut() -> None:
    got: list[OutputEvent] = []
    gate = OutputGate({"chars": 1_000, "chars_per_second": 1}, got.append)
    allowance = (
        1_000 + 2 * bounds.STREAM_BUFFER_CHARS + bounds.STREAM_MESSAGE_CHARS + 1_000
    )  # and a little time
    sent = 0
    for _ in range(100):
        gate.receive({"op": "output", "stream": "stdout", "text": "y" * 50_000, "dropped": 7})
        sent += 50_000 + 7
    gate.flush()
    streamed = sum(len(e.text) for e in got)
    assert streamed <= allowance
    assert streamed + sum(e.dropped for e in got) == sent
    with pytest.raises(ProtocolError):
        gate.receive({"op": "output", "stream": "fd3", "text": "x", "dropped": 0})
    with pytest.raises(ProtocolError):
        gate.receive({"op": "output", "stream": "stdout", "text": 5, "dropped": 0})


def result_event() -> ResultEvent:
    return ResultEvent(result=ExecutionResult(stdout="done"))


@pytest.mark.anyio
async def test_a_slow_consumer_loses_output_not_tools_nor_the_result() -> None:
    events = EventStream(limit=3)
    for i in range(10):
        events.put_output(OutputEvent(stream="stdout", text=f"{i}", dropped=0))
    events.put(ToolCallEvent(name="t", args=[], kwargs={}))
    events.put(ToolResultEvent(name="t", ok=True))
    events.put(result_event())
    events.close()
    seen = [event async for event in events]
    texts = [e.text for e in seen if isinstance(e, OutputEvent)]
    assert texts[:3] == ["0", "1", "2"]
    assert sum(isinstance(e, ToolCallEvent | ToolResultEvent) for e in seen) == 2
    notice = seen[-2]
    assert isinstance(notice, OutputEvent) and notice.text == "" and notice.dropped == 7
    assert isinstance(seen[-1], ResultEvent) and events.dropped == 7


@pytest.mark.anyio
async def test_the_buffer_hands_the_drop_count_to_the_next_chunk_once_there_is_room() -> None:
    events = EventStream(limit=1)
    events.put_output(OutputEvent(stream="stdout", text="a"))
    events.put_output(OutputEvent(stream="stdout", text="bcd", dropped=2))  # no room: 5 characters lost
    assert (await events.__anext__()).text == "a"  # type: ignore[union-attr]
    events.put_output(OutputEvent(stream="stdout", text="e", dropped=1))
    nxt = await events.__anext__()
    assert nxt == OutputEvent(stream="stdout", text="e", dropped=6)


@pytest.mark.anyio
async def test_a_failed_run_raises_from_the_iteration() -> None:
    events = EventStream()
    events.put_output(OutputEvent(stream="stderr", text="x"))
    events.close(RuntimeError("the backend broke"))
    assert (await events.__anext__()).text == "x"  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="the backend broke"):
        await events.__anext__()
    with anyio.fail_after(5), pytest.raises(StopAsyncIteration):
        await events.__anext__()


def test_the_budget_is_checked() -> None:
    assert stream_options({"chars": 10, "chars_per_second": 5, "buffer": 2}) == (
        {"chars": 10, "chars_per_second": 5},
        2,
    )
    with pytest.raises(ValueError, match="chars_per_second"):
        stream_options({"chars_per_second": 0})
    with pytest.raises(ValueError, match="chars"):
        stream_options({"chars": True})
    with pytest.raises(TypeError, match="rate"):
        stream_options({"rate": 5})  # type: ignore[typeddict-unknown-key]
