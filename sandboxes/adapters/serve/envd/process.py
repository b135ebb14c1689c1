"""envd's ``process.Process`` Connect service: commands run *as a run of the session* (a stdlib helper
in the session spawns the command with the session's stdout/stderr, so its output streams as that
run's output and it lives inside the session's boundary).

Why a run: the session's runner does one thing at a time, and a command taking its turn cannot
interleave its output with a cell's, or race a cell for the working directory; the price is that a
command and ``/execute`` wait for each other. `timeout` (the stream's ``Connect-Timeout-Ms``) is kept
by the helper itself, which kills the command's process group at the deadline (the session stays);
a client that leaves, or a ``SendSignal``, cancels the run (the session is replaced, and the next
``/execute`` says the state was lost). A pid is the server's own number for a command, never one
the sandbox reported.
"""

from __future__ import annotations

import base64
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ....events import OutputEvent, ResultEvent
from ....models import ExecutionResult
from ..connect import (
    STREAM_CONTENT_TYPE,
    RpcError,
    end_of_stream,
    envelope,
    parse_single_envelope,
    read_body,
    timeout_seconds,
)
from ..errors import ServeError
from ..limits import InsideLimits
from ..paths import to_relative
from ..sandbox import Resolve, ServedSandbox
from . import session

STREAMING = frozenset({"Start", "Connect"})
_PIDS = itertools.count(1000)
_MARGIN = 0.05
"""Seconds the helper's deadline keeps short of the client's, so the command's end reaches the client
before the client's own deadline closes the stream (which would cancel the run and lose the state)."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cmd: str = Field(min_length=1, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=4096)
    envs: dict[str, str] = Field(default_factory=dict, max_length=4096)
    cwd: str | None = None


@dataclass
class Running:
    """A command running now (`ServedSandbox.commands`): its config as E2B lists it, and how to stop it."""

    config: dict[str, Any]
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    signalled: bool = False


async def stream(request: Request, method: str, resolve: Resolve, caps: InsideLimits) -> Response:
    arrived = time.monotonic()
    try:
        sandbox = await resolve(request)
        if not request.headers.get("content-type", "").startswith(STREAM_CONTENT_TYPE):
            raise RpcError("invalid_argument", f"process.Process/{method} is {STREAM_CONTENT_TYPE}")
        message = parse_single_envelope(await read_body(request, caps.max_rpc_bytes))
        deadline = timeout_seconds(request.headers.get("connect-timeout-ms"))
        if method == "Connect":
            raise RpcError(
                "unimplemented", "reattaching to a command (commands.connect) is not served here yet"
            )
        if message.get("stdin"):
            raise RpcError(
                "unimplemented",
                "commands with stdin are not served here yet; start the command with stdin=False",
            )
        try:
            config = _Config.model_validate(message.get("process") or {})
        except ValidationError as exc:
            raise RpcError(
                "invalid_argument", f"the process config is not valid: {exc.errors()[0]['msg']}"
            ) from None
        helper = {
            "op": "run",
            "argv": [config.cmd, *config.args],
            "envs": {**sandbox.envs, **config.envs},
            "cwd": to_relative(config.cwd or str(sandbox.home), sandbox.home),
        }
    except ServeError as exc:
        return Response(end_of_stream(RpcError.of(exc)), media_type=STREAM_CONTENT_TYPE)
    return StreamingResponse(
        _events(sandbox, config, helper, deadline, arrived), media_type=STREAM_CONTENT_TYPE
    )


async def _events(
    sandbox: ServedSandbox, config: _Config, helper: dict[str, Any], deadline: float | None, started: float
) -> AsyncIterator[bytes]:
    pid = next(_PIDS)
    running = Running(config=config.model_dump(exclude_none=True))
    sandbox.commands[pid] = running
    try:
        yield envelope({"event": {"start": {"pid": pid}}})
        remaining = None if deadline is None else max(0.0, deadline - (time.monotonic() - started) - _MARGIN)
        result: ExecutionResult | None = None
        with running.scope:
            async with session.stream(sandbox, {**helper, "timeout": remaining}) as events:
                async for event in events:
                    if isinstance(event, OutputEvent) and event.text:
                        data = base64.b64encode(event.text.encode("utf-8", "surrogateescape")).decode()
                        yield envelope({"event": {"data": {event.stream: data}}})
                    elif isinstance(event, ResultEvent):
                        result = event.result
        if result is None:  # signalled: the run was cancelled, the command killed with the session
            yield envelope({"event": {"end": {"exitCode": -1, "exited": True, "status": "signal: killed"}}})
            yield end_of_stream()
            return
        yield _end(sandbox, result)
    finally:
        sandbox.commands.pop(pid, None)


def _end(sandbox: ServedSandbox, result: ExecutionResult) -> bytes:
    if result.timed_out:
        return end_of_stream(
            RpcError(
                "deadline_exceeded",
                f"the command ran past this server's cap of {sandbox.executor.timeout:g} s per run; "
                "the sandbox's session was restarted",
            )
        )
    try:
        reply = session.answer(result)
    except RpcError as exc:
        return end_of_stream(exc)
    if not isinstance(reply, dict) or not isinstance(reply.get("spawned"), bool):
        return end_of_stream(RpcError("internal", "the sandbox answered the command with something else"))
    if not reply["spawned"]:
        return end_of_stream(
            RpcError("invalid_argument", f"the command could not start: {str(reply.get('message'))[:1024]}")
        )
    code = reply.get("exit_code")
    if code is None:
        return end_of_stream(
            RpcError("deadline_exceeded", "the command's timeout was reached; it was killed")
        )
    if isinstance(code, bool) or not isinstance(code, int):
        return end_of_stream(
            RpcError("internal", "the sandbox answered the command with an invalid exit code")
        )
    end = (
        {"exitCode": code, "exited": True, "status": f"exit status {code}"}
        if code >= 0
        else {"exitCode": -1, "exited": True, "status": f"signal: {-code}"}
    )
    return envelope({"event": {"end": end}}) + end_of_stream()


async def handle(method: str, message: dict[str, Any], sandbox: ServedSandbox) -> dict[str, Any]:
    if method == "List":
        return {"processes": [{"config": r.config, "pid": pid} for pid, r in sandbox.commands.items()]}
    if method in ("SendInput", "CloseStdin", "StreamInput"):
        raise RpcError("failed_precondition", "commands here have no stdin; start them with stdin=False")
    if method == "SendSignal":
        selector = message.get("process")
        pid = selector.get("pid") if isinstance(selector, dict) else None
        running = sandbox.commands.get(pid) if isinstance(pid, int) and not isinstance(pid, bool) else None
        if running is None:
            raise RpcError("not_found", f"no running command with pid {pid!r} in this sandbox")
        if message.get("signal") not in ("SIGNAL_SIGKILL", "SIGNAL_SIGTERM"):
            raise RpcError("invalid_argument", "the signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
        running.signalled = True
        running.scope.cancel()
        return {}
    raise RpcError("unimplemented", f"process.Process/{method} is not served here")
