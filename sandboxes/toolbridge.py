"""The tool bridge's parent side: a tool the sandboxed code called runs here, and its answer goes back.

The function runs in the parent, with the parent's credentials and network; arguments and results
cross in the values codec's tagged JSON (`runtime/values.py`: tuples, sets, bytes, dates, arrays...),
the arguments decoded here as hostile input (one that does not decode is refused, the tool never
runs), bounded (`runtime.bounds.TOOL_MESSAGE_LIMIT`), and a tool's failure becomes an error the
code sees as `ToolError` (and may catch), never a failure of the run: a builtin exception as a
`ToolError` that is also that exception (`except KeyError:` works), any other as `ToolError` naming it.

A call belongs to the run that made it: each run request carries a number (`next_run_number`) that
the runner's stub tags its calls with, and a call tagged with another run (a thread of an earlier
run, still calling after that run ended) is refused, never executed (`for_run`). A tool cannot be
cancelled once it runs in a thread (a blocking function); `ToolCalls` remembers which still run, so a
run stopped by its timeout says its tools may still have effects.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import itertools
import json
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

import anyio

from .errors import ProtocolError
from .runtime import bounds, values
from .runtime.protocol import (
    TOOL_CALL_REFUSED,
    TOOL_RESULT_TOO_LARGE,
    UNCARRIABLE_VALUE,
    ToolCall,
    ToolResult,
)
from .wire import check

ToolFunction = Callable[..., Any]
Caller = Callable[[ToolCall], Awaitable[ToolResult]]

RUN_ENDED = (
    "the run that made this call has ended, so the call was not executed; a tool can be called only "
    "while its run is in progress (join the threads that call tools before the code ends)"
)

_run_numbers = itertools.count(1)


def next_run_number() -> int:
    """A number for a new run request, unique in this process (`RunRequest.run`)."""
    return next(_run_numbers)


class CheckedCall(NamedTuple):
    """A tool call's fields, their types checked."""

    id: int
    name: str
    args: list[Any]
    kwargs: dict[str, Any]


def checked_call(call: Mapping[str, Any]) -> CheckedCall:
    """The fields of `call`, or `ProtocolError`: `call` held to `ToolCall` (`wire.check`). The runner's
    stub always sends an int id, a str name, a list and a dict with str keys: anything else comes from
    a runner the code replaced, and the one rule for a conversation that is not the protocol applies
    (the session is discarded)."""
    checked = check(ToolCall, call)
    return CheckedCall(checked["id"], checked["name"], checked["args"], checked["kwargs"])


_RESULT_LIMITS = values.Limits(bytes=1 << 62)
"""A tool's result is the parent's own: its size is the JSON's, checked against TOOL_MESSAGE_LIMIT."""


def decoded_arguments(call: CheckedCall) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments decoded from the tagged form (`values.CodecError` when they do not):
    positional ones a list, keyword ones a dict with str keys, as a call needs them."""
    args = values.decode(call.args)
    kwargs = values.decode(call.kwargs)
    if type(args) is not list or type(kwargs) is not dict or any(type(key) is not str for key in kwargs):
        raise values.Malformed("the arguments are not a list and a dict with str keys")
    return args, kwargs


def for_run(run: int, call_tool: Caller) -> Caller:
    """`call_tool` for the calls of run number `run` alone: a call tagged with any other run is
    answered with a refusal (the calling thread sees `ToolError`) and never reaches the tool. Before
    that, a missing or malformed tag is a `ProtocolError` (the runner always sends one)."""

    async def call_in_run(call: ToolCall) -> ToolResult:
        tagged = call.get("run") if isinstance(call, Mapping) else None
        if not _is_int(tagged):
            raise ProtocolError(f"a tool call from the runner names no run: {_shown(call)}")
        if tagged != run:
            refused: ToolResult = {
                "op": "tool_result",
                "id": checked_call(call).id,
                "error": {"type": TOOL_CALL_REFUSED, "message": RUN_ENDED},
            }
            return refused
        return await call_tool(call)

    return call_in_run


@dataclass
class _Blocking:
    """A blocking tool's call, handed to a worker thread."""

    name: str
    started: bool = False
    abandoned: bool = False


class ToolCalls:
    """The tool calls of one run. A blocking (sync) tool runs in a worker thread, which nothing can
    stop: when the run is stopped, `stop` says which of them are still running, so that the result
    does not claim the run's effects ended with it. Async tools are cancelled with the run."""

    def __init__(self, tools: Mapping[str, ToolFunction]) -> None:
        self.tools = tools
        self._lock = threading.Lock()  # the worker threads update `_blocking` too
        self._blocking: list[_Blocking] = []

    async def call(self, call: ToolCall) -> ToolResult:
        """Run the tool `call` names with its JSON arguments; answer with its value or its error.
        Never raises for what the tool does; a malformed call is a `ProtocolError`."""
        return await self.run(checked_call(call))

    async def run(self, call: CheckedCall) -> ToolResult:
        """`call`, already checked (the executor reports its fields as events first)."""
        function = self.tools.get(call.name)
        reply: ToolResult = {"op": "tool_result", "id": call.id}
        if function is None:
            reply["error"] = {
                "type": "NameError",
                "message": f"no tool named {bounds.clipped(call.name, 200)!r}",
            }
            return reply
        try:
            args, kwargs = decoded_arguments(call)
        except values.CodecError as exc:
            reply["error"] = {
                "type": UNCARRIABLE_VALUE,
                "message": bounds.clipped(
                    f"the arguments could not be decoded, so the tool did not run: {exc}", 4_000
                ),
            }
            return reply
        try:
            if inspect.iscoroutinefunction(function):
                value = await function(*args, **kwargs)
            else:
                # In a thread, so that a blocking tool cannot hold the event loop past the timeout.
                value = await anyio.to_thread.run_sync(
                    self._in_thread(call.name, functools.partial(function, *args, **kwargs)),
                    abandon_on_cancel=True,
                )
                if inspect.isawaitable(value):
                    value = await value
        except Exception as exc:  # the tool's failure goes back to the code, which may catch it
            reply["error"] = {"type": exception_type_name(exc), "message": _message(exc)}
            return reply
        try:
            encoded = values.encode(value, _RESULT_LIMITS, path="result", crossing="enter the sandbox")
            size = len(json.dumps(encoded, ensure_ascii=False).encode())
        except (values.Uncarriable, ValueError) as exc:
            reply["error"] = {"type": "TypeError", "message": _message(exc)}
            return reply
        if size > bounds.TOOL_MESSAGE_LIMIT:
            reply["error"] = {
                "type": TOOL_RESULT_TOO_LARGE,
                "message": f"the result is {size:,} bytes of JSON; at most {bounds.TOOL_MESSAGE_LIMIT:,} "
                "cross into the sandbox. Have the tool return less, or a summary",
            }
            return reply
        reply["value"] = encoded
        return reply

    def stop(self) -> list[str]:
        """The run is over (stopped, or ended): a blocking tool not yet started in its thread never
        starts; the names of those still running, each once, in the order they were called."""
        with self._lock:
            for call in self._blocking:
                call.abandoned = not call.started
            running = [call.name for call in self._blocking if call.started]
        return list(dict.fromkeys(running))

    def _in_thread(self, name: str, function: Callable[[], Any]) -> Callable[[], Any]:
        call = _Blocking(name)
        with self._lock:
            self._blocking.append(call)

        def run() -> Any:
            with self._lock:
                if call.abandoned:  # its run was stopped before a worker thread took it
                    self._blocking.remove(call)
                    return None
                call.started = True
            try:
                return function()
            finally:
                with self._lock:
                    self._blocking.remove(call)

        return run


def still_running(names: list[str]) -> str:
    """What a stopped run's error adds when blocking tools of the run were still running."""
    if not names:
        return ""
    quoted = ", ".join(repr(name) for name in names)
    verb = "was" if len(names) == 1 else "were"
    return (
        f"; {'tool' if len(names) == 1 else 'tools'} {quoted} {verb} still running in this process and "
        "may still have effects (a blocking tool cannot be stopped)"
    )


class RelayedToolError(Exception):
    """A tool's failure that another bridge already named (a Ray node passing on its driver's answer):
    it crosses under that name, as the tool's own exception would have."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name


def exception_type_name(exc: BaseException) -> str:
    """The name the runner raises a tool's exception as: a builtin's bare name (``KeyError``, which
    the code sees as a `ToolError` that is also a `KeyError`), any other class by module and name
    (``mytools.RateLimited``, a plain `ToolError`): a tool's own class called `KeyError` is no
    builtin, and the runner maps bare builtin names only."""
    if isinstance(exc, RelayedToolError):
        return bounds.clipped(exc.type_name, bounds.ERROR_TYPE_LIMIT)
    kind = type(exc)
    if getattr(builtins, kind.__name__, None) is kind:
        return kind.__name__
    return bounds.clipped(f"{kind.__module__}.{kind.__qualname__}", bounds.ERROR_TYPE_LIMIT)


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a tool's exception whose __str__ fails still reports its type
        text = "<the exception's message could not be read>"
    return bounds.clipped(text, bounds.ERROR_MESSAGE_LIMIT)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    try:
        return bounds.clipped(repr(value), 300)
    except Exception:  # a value decoded from JSON has a repr; this is belt and braces
        return f"<{type(value).__name__}>"
