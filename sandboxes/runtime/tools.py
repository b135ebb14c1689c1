"""The tool-call side of the runner: the stub the code calls for each tool, and the errors the code
sees (loaded by `runner.py` as ``_kodeagent_tools``; stdlib only).

A tool runs in the parent; its stub sends the call's arguments in the values codec's form
(`values.py`) and waits for the result on the channel. A tool's failure arrives as `ToolError`, of
the builtin exception's class too when it was one (`tool_error_class`). These classes live here,
not in the code's namespace (``__main__``), so the guard refuses the code's writes to them as to any
module's class.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: nothing is imported at run time
    from .channel import Channel

_siblings = sys.modules["_kodeagent_siblings"]  # loaded by the entry point first (siblings.py)
bounds = _siblings.load("bounds")
values = _siblings.load("values")


class FinalAnswerSignal(BaseException):
    """Raised by `final_answer()`. A BaseException, so `except Exception:` in user code cannot catch it."""


class ToolError(Exception):
    """A tool raised an exception in the parent; the message says which and why.

    A builtin exception arrives as a class that is both (`ToolKeyError(ToolError, KeyError)`, see
    `tool_error_class`), so `except KeyError:` and `except ToolError:` both catch it."""

    def __str__(self) -> str:
        # The message as given: KeyError's own `__str__` would show it quoted, as a missing key.
        return BaseException.__str__(self)


_TOOL_ERROR_BASES: dict[str, type[Exception]] = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type)
    and issubclass(value, Exception)
    and not issubclass(value, BaseExceptionGroup)  # built from a list of exceptions, not a message
}
"""The builtin exceptions a tool's failure may arrive as, by name; fixed when the runner starts,
before any code runs, so no name the parent sends is ever looked up anywhere else."""

_tool_error_classes: dict[str, type[ToolError]] = {}


def tool_error_class(type_name: str) -> type[ToolError]:
    """The class the code sees for a tool's exception named `type_name`: ``Tool<Name>``, a subclass of
    `ToolError` and of that builtin, or `ToolError` itself for any other name (the parent names a
    non-builtin exception by its module and class, which is in no table)."""
    found = _tool_error_classes.get(type_name)
    if found is None:
        base = _TOOL_ERROR_BASES.get(type_name)
        found = ToolError
        if base is not None:
            try:
                made = type(f"Tool{type_name}", (ToolError, base), {"__module__": ToolError.__module__})
                made("probe")  # UnicodeDecodeError and kin need more than a message: plain ToolError
                found = made
            except TypeError:
                pass
        _tool_error_classes[type_name] = found
    return found


def stub(name: str, channel: Channel, before_call: Callable[[], None]) -> Callable[..., Any]:
    """The function the code calls as tool `name`: its arguments cross to the parent in the codec's
    form, its result comes back decoded, its failure raises `tool_error_class`. `before_call` runs
    first (a streamed run's output written so far goes out before the call)."""

    def call_tool(*args: Any, **kwargs: Any) -> Any:
        before_call()
        try:
            sent = values.encode(list(args), path="args", crossing="leave the sandbox")
            named = values.encode(kwargs, path="kwargs", crossing="leave the sandbox")
            reply = channel.call(name, sent, named, bounds.TOOL_MESSAGE_LIMIT)
        except values.Uncarriable as exc:
            raise TypeError(f"arguments of tool {name!r}: {exc}") from None
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(
                f"arguments of tool {name!r} must be at most {bounds.TOOL_MESSAGE_LIMIT:,} bytes "
                f"in the values codec's JSON: {exc}"
            ) from None
        if reply is None:
            raise SystemExit(0)
        if reply.get("error"):
            error = reply["error"]
            kind = bounds.clipped(str(error.get("type")), bounds.ERROR_TYPE_LIMIT)
            message = bounds.clipped(str(error.get("message")), bounds.ERROR_MESSAGE_LIMIT)
            raise tool_error_class(kind)(f"tool {name!r} failed: {kind}: {message}")
        try:  # numpy, pandas, PIL values arrive as such once the code imported them
            return values.decode(reply.get("value"), importer=sys.modules.get)
        except values.Malformed as exc:
            raise ToolError(f"tool {name!r} returned a value that could not be decoded: {exc}") from None

    call_tool.__name__ = call_tool.__qualname__ = name
    return call_tool
