"""One ``/execute``: the cell's Jupyter syntax made Python, the cell run in the session
(`insandbox.py`, through `Executor.stream`), and its events as the NDJSON lines e2b-code-interpreter
parses: ``stdout``/``stderr`` while it runs, then ``number_of_executions``, the ``result`` of its last
expression, its ``error``, and ``end_of_execution``.

A client that leaves mid-cell (the SDK's only way to time out) cancels the run: the session is
replaced, and the next cell of a context that had state says so in an ``error`` (E2B's `Execution` has
no field for it)."""

from __future__ import annotations

import ast
import base64
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ....errors import SandboxFileError
from ....events import OutputEvent, ResultEvent
from ....models import ExecutionResult
from ..insession import helper_code, source
from ..limits import InsideLimits
from ..sandbox import ServedSandbox

_SOURCE = source(Path(__file__).with_name("insandbox.py"))
_SPILL = re.compile(r"^\.kodeagent-display/[0-9a-f]{32}\.png$")
_TEXT = 64 * 1024
STATE_LOST = "StateLostError"


class Context(BaseModel):
    """A context as the interpreter serves it; `known` once its namespace exists in the session."""

    id: str
    language: str = "python"
    cwd: str
    relative: str = ""
    known: bool = False

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


class _Error(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(max_length=1024)
    value: str = Field(max_length=_TEXT)
    traceback: str = Field(max_length=_TEXT)


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    fresh: bool
    count: int | None = None
    display: dict[str, Any] | None = None
    error: _Error | None = None
    spill: str | None = Field(default=None, max_length=100)


_DISPLAY_KEYS = frozenset({"text", "html", "markdown", "svg", "png", "jpeg", "latex", "json", "javascript"})


def jupyter_to_python(code: str) -> str:
    """Lines Jupyter runs as shell (``!cmd``) or as the pip magic (``%pip ...``) as Python that does the
    same; code that is Python already is left as it is (such a line is never valid Python)."""
    try:
        ast.parse(code)
        return code
    except SyntaxError:
        pass
    lines = []
    for line in code.split("\n"):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith("!"):
            command = f"{stripped[1:]!r}"
        elif stripped.startswith("%pip ") or stripped == "%pip":
            command = f"__import__('sys').executable + ' -m pip ' + {stripped[5:]!r}"
        else:
            lines.append(line)
            continue
        lines.append(
            f"{indent}(__import__('sys').stdout.flush(), __import__('sys').stderr.flush(), "
            f"__import__('subprocess').run({command}, shell=True))[0]"
        )
    return "\n".join(lines)


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


async def execute(
    sandbox: ServedSandbox, context: Context, code: str, envs: dict[str, str], limits: InsideLimits
) -> AsyncIterator[bytes]:
    if sandbox.executor.policy.python_guards:
        async for chunk in _guarded_cell(sandbox, context, code):
            yield chunk
        return
    request = {
        "op": "cell",
        "context": context.id,
        "code": jupyter_to_python(code),
        "envs": envs,
        "cwd": context.relative,
        "budget": max(1_000, sandbox.executor.output_limit - 2_000),
    }
    result: ExecutionResult | None = None
    async with sandbox.executor.stream(helper_code(_SOURCE, request)) as events:
        async for event in events:
            if isinstance(event, OutputEvent) and event.text:
                yield line({"type": event.stream, "text": event.text, "timestamp": time.time_ns()})
            elif isinstance(event, ResultEvent):
                result = event.result
    assert result is not None
    for message in await _closing(sandbox, context, result, limits):
        yield line(message)
    yield line({"type": "end_of_execution"})


async def _guarded_cell(sandbox: ServedSandbox, context: Context, code: str) -> AsyncIterator[bytes]:
    """A cell run as the session's own guarded code (no helper: the guards refuse its plain Python),
    its value and error mapped from the executor's result. The interpreter refuses what needs the
    helper (other contexts, a cell's own environment) before it gets here."""
    result: ExecutionResult | None = None
    async with sandbox.executor.stream(code) as events:
        async for event in events:
            if isinstance(event, OutputEvent) and event.text:
                yield line({"type": event.stream, "text": event.text, "timestamp": time.time_ns()})
            elif isinstance(event, ResultEvent):
                result = event.result
    assert result is not None
    lost = context.known and result.state_lost
    context.known = True
    messages: list[dict[str, Any]] = []
    if result.timed_out or result.oom:
        context.known = False
        why = (
            "ran out of memory"
            if result.oom
            else f"ran past this server's cap of {sandbox.executor.timeout:g} s"
        )
        messages.append(
            _error(STATE_LOST, f"the cell {why}; the sandbox's session was restarted and its state is lost")
        )
    elif result.error is not None:
        error = result.error
        messages.append(
            {
                "type": "error",
                "name": error.type[:1024],
                "value": error.message[:_TEXT],
                "traceback": (error.traceback or f"{error.type}: {error.message}")[:_TEXT],
            }
        )
    else:
        if result.value is not None or result.value_repr is not None:
            shown: dict[str, Any] = {"text": result.value_repr or repr(result.value)[:_TEXT]}
            if isinstance(result.value, dict | list):
                shown["json"] = result.value
            messages.append({"type": "result", **shown, "is_main_result": True})
        if lost:
            messages.append(
                _error(STATE_LOST, "the sandbox's state was lost before this cell: its variables are gone")
            )
    for message in messages:
        yield line(message)
    yield line({"type": "end_of_execution"})


async def _closing(
    sandbox: ServedSandbox, context: Context, result: ExecutionResult, limits: InsideLimits
) -> list[dict[str, Any]]:
    if result.timed_out or result.oom:
        context.known = False
        why = (
            "ran out of memory"
            if result.oom
            else f"ran past this server's cap of {sandbox.executor.timeout:g} s"
        )
        return [
            _error(STATE_LOST, f"the cell {why}; the sandbox's session was restarted and its state is lost")
        ]
    try:
        answer = _Answer.model_validate(result.value)
    except ValidationError:
        context.known = False
        why = f" ({result.error.type}: {result.error.message[:500]})" if result.error is not None else ""
        return [
            _error("SandboxError", f"the sandbox answered the cell with something that is not an answer{why}")
        ]
    messages: list[dict[str, Any]] = []
    lost = context.known and answer.fresh
    context.known = True
    if answer.count is not None:
        messages.append({"type": "number_of_executions", "execution_count": answer.count})
    if answer.display is not None:
        shown = {k: v for k, v in answer.display.items() if k in _DISPLAY_KEYS}
        if answer.spill is not None and _SPILL.match(answer.spill):
            png = await _spilled(sandbox, answer.spill, limits)
            if png is not None:
                shown["png"] = png
        if isinstance(shown.get("text"), str):
            messages.append({"type": "result", **shown, "is_main_result": True})
    notice = (
        "the sandbox's state was lost before this cell (an earlier run was interrupted, or ran out of time "
        "or memory): the variables of this context are gone, and the cell ran in a fresh session"
    )
    if answer.error is not None:
        error = answer.error.model_dump()
        if lost:
            error["value"] = f"{error['value']} ({notice})"
        messages.append({"type": "error", **error})
    elif lost:
        messages.append(_error(STATE_LOST, notice))
    return messages


async def _spilled(sandbox: ServedSandbox, path: str, limits: InsideLimits) -> str | None:
    """A PNG too big for the run's value, written to a file by the cell helper: read, then removed."""
    try:
        data = await sandbox.executor.download(path, max_bytes=limits.max_file_bytes)
    except SandboxFileError:
        return None
    finally:
        await sandbox.executor.run(f"__import__('os').remove({path!r})")
    return base64.b64encode(data).decode()


def _error(name: str, value: str) -> dict[str, str]:
    return {"type": "error", "name": name, "value": value, "traceback": f"{name}: {value}"}


async def context_op(sandbox: ServedSandbox, context: Context, op: str) -> bool:
    """Create ("touch") or drop ("forget") a context's namespace; True when it was not there."""
    result = await sandbox.executor.run(helper_code(_SOURCE, {"op": op, "context": context.id}))
    value = result.value
    return bool(isinstance(value, dict) and value.get("fresh") is True)
