"""Watching a run: the typed events of `Executor.stream`, and the bounded buffer that carries them.

A streamed run yields, in order: `OutputEvent`s as the code writes to stdout and stderr (also from
`os.write`, C extensions and child processes: capture is at the file descriptors), a `ToolCallEvent`
and a `ToolResultEvent` around every tool call, and last one `ResultEvent` whose result is what
`run()` returns for the same code. Output is bounded twice, and each cut is counted in `dropped`:

- in the sandbox, by the stream's budget (`StreamBudget`): a token bucket of `chars` characters refilled
  at `chars_per_second`, so a flood cannot starve the channel and a long loop keeps showing its latest
  output; the runner never makes the code's writes wait for the stream;
- here, by the buffer of a slow consumer (`buffer` events): past it output events are dropped and
  counted, never tool or result events.

Dropping never touches the result: its stdout and stderr keep their head and tail as in `run()`.
"""

from __future__ import annotations

from collections import deque
from typing import Annotated, Any, Literal, TypedDict

import anyio
from pydantic import BaseModel, Field

from .models import ExecutionResult
from .runtime.protocol import StreamOptions

__all__ = [
    "DEFAULT_EVENT_BUFFER",
    "DEFAULT_STREAM_CHARS",
    "DEFAULT_STREAM_RATE",
    "Event",
    "EventStream",
    "OutputEvent",
    "ResultEvent",
    "StreamBudget",
    "ToolCallEvent",
    "ToolResultEvent",
]

DEFAULT_STREAM_CHARS = 64_000
"""Characters a stream may send in one burst (the token bucket's size)."""
DEFAULT_STREAM_RATE = 64_000
"""Characters per second the stream's budget refills at, once a burst used it up."""
DEFAULT_EVENT_BUFFER = 1_024
"""Output events held for a slow consumer; past them output is dropped and counted."""
EVENT_BUFFER_CHARS = 4_000_000
"""Characters of output held for a slow consumer at most, whatever the number of events."""


class OutputEvent(BaseModel):
    """Text the code wrote, in the order written. `dropped` counts the characters of this stream left
    out (past the stream's budget, or a slow consumer's buffer) since its previous event; an event
    with empty `text` only reports such a count (at the end of a run)."""

    kind: Literal["output"] = "output"
    stream: Literal["stdout", "stderr"]
    text: str
    dropped: int = 0


class ToolCallEvent(BaseModel):  # type: ignore[no-redef]  # a field named kwargs: mypy's pydantic plugin
    """The code called a tool (it runs in the parent); its `ToolResultEvent` follows."""

    kind: Literal["tool_call"] = "tool_call"
    name: str
    args: list[Any]
    kwargs: dict[str, Any]


class ToolResultEvent(BaseModel):
    """A tool call ended: `ok`, or the error the code sees (as `ToolError`)."""

    kind: Literal["tool_result"] = "tool_result"
    name: str
    ok: bool
    error: str | None = None


class ResultEvent(BaseModel):
    """The last event: the run's result, the same as `Executor.run()` returns for the code."""

    kind: Literal["result"] = "result"
    result: ExecutionResult


Event = Annotated[OutputEvent | ToolCallEvent | ToolResultEvent | ResultEvent, Field(discriminator="kind")]
"""One event of a streamed run (tell them apart by `kind` or `isinstance`)."""


class StreamBudget(TypedDict, total=False):
    """How much a streamed run shows (keyword arguments of `Executor.stream` and of `run` with callbacks).

    chars: characters of output sent in one burst at most. Default 64,000.
    chars_per_second: the rate the budget refills at. Default 64,000.
    buffer: output events held here for a slow consumer. Default 1,024.
    """

    chars: int
    chars_per_second: int
    buffer: int


def stream_options(budget: StreamBudget) -> tuple[StreamOptions, int]:
    """The runner's stream options and the event buffer for `budget`; a clear error for bad values."""
    unknown = set(budget) - set(StreamBudget.__annotations__)
    if unknown:
        raise TypeError(
            f"unknown stream options: {', '.join(sorted(unknown))} (chars, chars_per_second, buffer)"
        )
    chars = budget.get("chars", DEFAULT_STREAM_CHARS)
    rate = budget.get("chars_per_second", DEFAULT_STREAM_RATE)
    buffer = budget.get("buffer", DEFAULT_EVENT_BUFFER)
    for name, value in (("chars", chars), ("chars_per_second", rate), ("buffer", buffer)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return {"chars": chars, "chars_per_second": rate}, buffer


class EventStream:
    """The events of one streamed run, an async iterator (what `Executor.stream` yields).

    The run puts events in (never waiting); the consumer takes them out. Output events beyond
    `limit` waiting events (or `EVENT_BUFFER_CHARS` characters) are dropped, and the count rides on
    the stream's next output event (before the result at the latest); tool and result events are
    never dropped. `dropped` says how many characters this buffer left out in all.
    """

    def __init__(self, limit: int = DEFAULT_EVENT_BUFFER, chars: int = EVENT_BUFFER_CHARS) -> None:
        self._events: deque[Event] = deque()
        self._limit = limit
        self._chars_limit = chars
        self._outputs = 0
        self._chars = 0
        self._pending = {"stdout": 0, "stderr": 0}
        self._ready = anyio.Event()
        self._closed = False
        self._error: BaseException | None = None
        self.dropped = 0
        """Characters of output this buffer dropped for a slow consumer (not those the budget dropped)."""

    # the producer's side (the run, on the event loop; never waits)

    def put_output(self, event: OutputEvent) -> None:
        """Queue an output event, or drop and count it when the consumer is too far behind."""
        if self._closed:
            return
        size = len(event.text)
        if self._outputs >= self._limit or self._chars + size > self._chars_limit:
            self._pending[event.stream] += size + event.dropped
            self.dropped += size
            return
        pending = self._pending[event.stream]
        if pending:
            event = event.model_copy(update={"dropped": event.dropped + pending})
            self._pending[event.stream] = 0
        self._outputs += 1
        self._chars += size
        self._append(event)

    def put(self, event: Event) -> None:
        """Queue a tool or result event (never dropped); before a result, the counts still to report."""
        if self._closed:
            return
        if isinstance(event, OutputEvent):
            self.put_output(event)
            return
        if isinstance(event, ResultEvent):
            for stream, count in self._pending.items():
                if count:
                    self._outputs += 1
                    self._append(OutputEvent(stream=stream, text="", dropped=count))
            self._pending = {"stdout": 0, "stderr": 0}
        self._append(event)

    def close(self, error: BaseException | None = None) -> None:
        """No more events; with `error`, the consumer's next `__anext__` raises it (after the queued)."""
        if not self._closed:
            self._closed = True
            self._error = error
            self._ready.set()

    def _append(self, event: Event) -> None:
        self._events.append(event)
        self._ready.set()

    # the consumer's side

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        while not self._events:
            if self._closed:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                raise StopAsyncIteration
            await self._ready.wait()
            self._ready = anyio.Event()
        event = self._events.popleft()
        if isinstance(event, OutputEvent):
            self._outputs -= 1
            self._chars -= len(event.text)
        return event
