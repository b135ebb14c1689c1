"""The tool bridge's parent side: a tool the sandboxed code called runs here, and its answer goes back.

The function runs in the parent, with the parent's credentials and network; only JSON crosses into
the sandbox, bounded (`runtime.bounds.TOOL_MESSAGE_LIMIT`), and a tool's failure becomes an error the
code sees as `ToolError` (and may catch), never a failure of the run.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from .runtime import bounds
from .runtime.protocol import TOOL_RESULT_TOO_LARGE, ToolCall, ToolResult

ToolFunction = Callable[..., Any]


async def call_tool(tools: Mapping[str, ToolFunction], call: ToolCall) -> ToolResult:
    """Run the tool `call` names with its JSON arguments; answer with its value or its error."""
    name = call.get("name", "")
    function = tools.get(name)
    reply: ToolResult = {"op": "tool_result", "id": call.get("id")}
    if function is None:
        reply["error"] = {"type": "NameError", "message": f"no tool named {name!r}"}
        return reply
    args, kwargs = call.get("args", []), call.get("kwargs", {})
    try:
        if inspect.iscoroutinefunction(function):
            value = await function(*args, **kwargs)
        else:
            # In a thread, so that a blocking tool cannot hold the event loop past the timeout.
            value = await anyio.to_thread.run_sync(
                functools.partial(function, *args, **kwargs), abandon_on_cancel=True
            )
            if inspect.isawaitable(value):
                value = await value
        size = len(json.dumps(value, ensure_ascii=False).encode())
    except Exception as exc:  # the tool's failure goes back to the code, which may catch it
        reply["error"] = {
            "type": type(exc).__name__,
            "message": bounds.clipped(str(exc), bounds.ERROR_MESSAGE_LIMIT),
        }
        return reply
    if size > bounds.TOOL_MESSAGE_LIMIT:
        reply["error"] = {
            "type": TOOL_RESULT_TOO_LARGE,
            "message": f"the result is {size:,} bytes of JSON; at most {bounds.TOOL_MESSAGE_LIMIT:,} "
            "cross into the sandbox. Have the tool return less, or a summary",
        }
        return reply
    reply["value"] = value
    return reply
