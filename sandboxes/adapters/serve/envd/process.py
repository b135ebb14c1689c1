"""envd's ``process.Process`` Connect service: Start (foreground and background alike), Connect, List,
SendInput/StreamInput-less stdin (SendInput, CloseStdin) and SendSignal.

A command runs *inside* the session, detached from any run: a stdlib helper spawns it in the session
(its own process group, the session's boundary) and threads of the session pump its stdout/stderr
into bounded buffers there. The server reads them with short runs (`poll`, each waiting at most
`POLL_WAIT` for news), so a command and ``/execute`` never see each other's output and neither holds
the session for long: a cell waits at most one poll, and while a long cell runs, a command's output
arrives after it. Every poll is shielded from the client leaving, since a cancelled run would replace
the session; leaving only stops the stream, the command goes on (``commands.connect`` reattaches),
as E2B's envd does. At the stream's deadline (``Connect-Timeout-Ms``, the SDK's `timeout`) the
command's process group is killed. A pid is the server's own number, never one the sandbox reported.
"""

from __future__ import annotations

import base64
import itertools
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

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
POLL_WAIT = 0.05
"""Seconds one poll waits in the session for output: the most a cell waits for a command's poll."""
MAX_COMMANDS = 64
_PIDS = itertools.count(1000)
_SIGNALS = {"SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15}
_KEEPALIVE = 30.0


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cmd: str = Field(min_length=1, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=4096)
    envs: dict[str, str] = Field(default_factory=dict, max_length=4096)
    cwd: str | None = None


@dataclass
class Running:
    """A command of `ServedSandbox.commands`: its config as E2B lists it, and its tag."""

    config: dict[str, Any]
    tag: str | None = None


async def stream(request: Request, method: str, resolve: Resolve, caps: InsideLimits) -> Response:
    arrived = time.monotonic()
    try:
        sandbox = await resolve(request)
        if not request.headers.get("content-type", "").startswith(STREAM_CONTENT_TYPE):
            raise RpcError("invalid_argument", f"process.Process/{method} is {STREAM_CONTENT_TYPE}")
        message = parse_single_envelope(await read_body(request, caps.max_rpc_bytes))
        deadline = timeout_seconds(request.headers.get("connect-timeout-ms"))
        expires = math.inf if not deadline else arrived + deadline
        if method == "Connect":
            pid = _pid(sandbox, message)
            return _streaming(_follow(sandbox, pid, expires, owner=False, start=False))
        if len(sandbox.commands) >= MAX_COMMANDS:
            raise RpcError("resource_exhausted", f"a sandbox runs at most {MAX_COMMANDS} commands at once")
        try:
            config = _Config.model_validate(message.get("process") or {})
        except ValidationError as exc:
            raise RpcError(
                "invalid_argument", f"the process config is not valid: {exc.errors()[0]['msg']}"
            ) from None
        tag = message.get("tag")
        spawn = {
            "op": "spawn",
            "argv": [config.cmd, *config.args],
            "envs": {**sandbox.envs, **config.envs},
            "cwd": to_relative(config.cwd or str(sandbox.home), sandbox.home),
            "stdin": bool(message.get("stdin")),
        }
    except ServeError as exc:
        return Response(end_of_stream(RpcError.of(exc)), media_type=STREAM_CONTENT_TYPE)
    pid = next(_PIDS)
    try:
        reply = await _shielded(sandbox, {**spawn, "pid": pid})
    except ServeError as exc:  # headers are not sent yet: the error is the stream's end, as envd's
        return Response(end_of_stream(RpcError.of(exc)), media_type=STREAM_CONTENT_TYPE)
    if not isinstance(reply, dict) or reply.get("spawned") is not True:
        why = str(reply.get("message"))[:1024] if isinstance(reply, dict) else "no answer"
        return Response(
            end_of_stream(RpcError("invalid_argument", f"the command could not start: {why}")),
            media_type=STREAM_CONTENT_TYPE,
        )
    sandbox.commands[pid] = Running(
        config=config.model_dump(exclude_none=True), tag=tag if isinstance(tag, str) else None
    )
    return _streaming(_follow(sandbox, pid, expires, owner=True, start=True))


def _streaming(body: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(body, media_type=STREAM_CONTENT_TYPE)


async def _shielded(sandbox: ServedSandbox, request: dict[str, Any]) -> Any:
    """A helper call the client's leaving cannot cancel (a cancelled run replaces the session)."""
    with anyio.CancelScope(shield=True):
        return await session.call(sandbox, request)


async def _follow(
    sandbox: ServedSandbox, pid: int, expires: float, *, owner: bool, start: bool
) -> AsyncIterator[bytes]:
    """The command's events from now until it ends, the stream's deadline passes, or the client leaves."""
    limit = max(1024, sandbox.executor.output_limit // 6)
    offsets = {"stdout": 0, "stderr": 0}
    yield envelope({"event": {"start": {"pid": pid}}})
    quiet_since = time.monotonic()
    while True:
        remaining = expires - time.monotonic()
        if remaining <= 0:
            try:
                await _shielded(sandbox, {"op": "signal", "pid": pid, "signal": 9})
            except RpcError:  # the sandbox ended meanwhile (a kill beside the client's own timeout)
                pass
            yield end_of_stream(
                RpcError("deadline_exceeded", "the command's timeout was reached; it was killed")
            )
            return
        try:
            reply = await _shielded(
                sandbox,
                {"op": "poll", "pid": pid, **offsets, "limit": limit, "wait": min(POLL_WAIT, remaining)},
            )
            news = _validated(reply)
        except RpcError as exc:
            sandbox.commands.pop(pid, None)
            yield end_of_stream(exc)
            return
        for name in ("stdout", "stderr"):
            data, offsets[name] = news[name], news[f"{name}_offset"]
            if data:
                quiet_since = time.monotonic()
                yield envelope({"event": {"data": {name: base64.b64encode(data).decode()}}})
        code = news["exit_code"]
        if code is not None:
            if owner or pid in sandbox.commands:
                sandbox.commands.pop(pid, None)
                await _shielded(sandbox, {"op": "forget", "pid": pid})
            end = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
            if code < 0:
                end = {"exitCode": -1, "exited": True, "status": f"signal: {-code}"}
            yield envelope({"event": {"end": end}}) + end_of_stream()
            return
        if time.monotonic() - quiet_since > _KEEPALIVE:
            quiet_since = time.monotonic()
            yield envelope({"event": {"keepalive": {}}})


def _validated(reply: Any) -> dict[str, Any]:
    if not isinstance(reply, dict):
        raise RpcError("internal", "the sandbox answered a poll with something else")
    for name in ("stdout", "stderr"):
        if not isinstance(reply.get(name), bytes) or not _whole(reply.get(f"{name}_offset")):
            raise RpcError("internal", "the sandbox answered a poll with invalid output")
    code = reply.get("exit_code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise RpcError("internal", "the sandbox answered a poll with an invalid exit code")
    return reply


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _pid(sandbox: ServedSandbox, message: dict[str, Any]) -> int:
    selector = message.get("process")
    if not isinstance(selector, dict):
        raise RpcError("invalid_argument", "the request names no process (`process.pid` or `process.tag`)")
    pid, tag = selector.get("pid"), selector.get("tag")
    if tag is not None:
        pid = next((p for p, r in sandbox.commands.items() if r.tag == tag), None)
    if not _whole(pid) or pid not in sandbox.commands:
        raise RpcError("not_found", f"no running command {selector!r} in this sandbox")
    return int(pid)


async def handle(method: str, message: dict[str, Any], sandbox: ServedSandbox) -> dict[str, Any]:
    if method == "List":
        running = await session.call(sandbox, {"op": "running"})
        alive = set(running) if isinstance(running, list) else set()
        return {
            "processes": [
                {"config": r.config, "pid": pid, **({"tag": r.tag} if r.tag else {})}
                for pid, r in sandbox.commands.items()
                if pid in alive
            ]
        }
    if method == "SendSignal":
        pid = _pid(sandbox, message)
        signum = _SIGNALS.get(message.get("signal", ""))
        if signum is None:
            raise RpcError("invalid_argument", "the signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
        await session.call(sandbox, {"op": "signal", "pid": pid, "signal": signum})
        return {}
    if method == "SendInput":
        pid = _pid(sandbox, message)
        given = message.get("input")
        data = given.get("stdin", "") if isinstance(given, dict) else ""
        if not isinstance(data, str):
            raise RpcError("invalid_argument", "input.stdin must be base64 text")
        try:
            base64.b64decode(data, validate=True)
        except ValueError:
            raise RpcError("invalid_argument", "input.stdin is not valid base64") from None
        await session.call(sandbox, {"op": "stdin", "pid": pid, "data": data})
        return {}
    if method == "CloseStdin":
        await session.call(sandbox, {"op": "stdin", "pid": _pid(sandbox, message), "close": True})
        return {}
    raise RpcError("unimplemented", f"process.Process/{method} is not served here")
