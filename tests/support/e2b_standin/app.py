"""The stand-in's HTTP surface: E2B's control-plane REST API and the sandbox proxy in front of envd.

Two listening ports, one ASGI app that tells them apart by the port a request arrived on:

* the API port (the SDK's ``api_url``): ``POST /v2/sandboxes``, ``GET|DELETE /sandboxes/{id}``,
  ``POST /sandboxes/{id}/timeout``, ``POST /v2/sandboxes/{id}/connect``; ``X-API-KEY`` required.
* the sandbox port (the SDK's ``sandbox_url``): what ``https://sandbox.e2b.app`` does. The proxy picks
  the sandbox from the ``E2b-Sandbox-Id`` header the SDK sends and answers 502 "The sandbox was not
  found" for a dead one; envd then serves ``/health``, ``/files`` (read, multipart or octet-stream
  write) and the ``process.Process`` Connect RPCs (Start, Connect, SendInput, SendSignal,
  CloseStdin, List). ``X-Access-Token`` (the ``envdAccessToken`` from create) is checked.

Raw ASGI on purpose: nothing between the wire and this code that could hide a framing mistake.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio

from . import connect
from .connect import RpcError
from .state import ENVD_VERSION, Process, Registry, Sandbox

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

DEFAULT_SANDBOX_TIMEOUT = 15
"""Seconds a sandbox lives when create does not say (the E2B API's default)."""

_SANDBOX_ROUTE = re.compile(r"^/sandboxes/(?P<id>[^/]+)(?P<rest>/timeout|/network|/metrics)?$")
_CONNECT_ROUTE = re.compile(r"^/v2/sandboxes/(?P<id>[^/]+)/connect$")


class StandInApp:
    """The ASGI application. `api_port` and `sandbox_port` are set once the sockets are bound."""

    def __init__(self, registry: Registry, api_key: str) -> None:
        self.registry = registry
        self.api_key = api_key
        self.api_port = 0
        self.sandbox_port = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        port = scope["server"][1] if scope.get("server") else 0
        key = f"{'api' if port == self.api_port else 'envd'} {scope['method']} {scope['path']}"
        self.registry.requests[key] = self.registry.requests.get(key, 0) + 1
        if port == self.api_port:
            await self._control_plane(scope, headers, receive, send)
        else:
            await self._sandbox_proxy(scope, headers, receive, send)

    # ------------------------------------------------------------------ control plane

    async def _control_plane(
        self, scope: Scope, headers: dict[str, str], receive: Receive, send: Send
    ) -> None:
        method, path = scope["method"], scope["path"]
        body = await _read_body(receive)
        if headers.get("x-api-key") != self.api_key:
            return await _json(send, 401, {"code": 401, "message": "Invalid API key"})
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            return await _json(send, 400, {"code": 400, "message": "request body is not JSON"})
        if method == "POST" and path == "/v2/sandboxes":
            return await self._create(request, headers["x-api-key"], send)
        if match := _CONNECT_ROUTE.match(path):
            sandbox = self.registry.get_alive(match["id"])
            if method != "POST" or sandbox is None:
                return await _not_found(send, match["id"])
            if isinstance(request.get("timeout"), int):
                self.registry.set_timeout(sandbox, request["timeout"], only_extend=True)
            return await _json(send, 200, _sandbox_json(sandbox))
        if match := _SANDBOX_ROUTE.match(path):
            sandbox = self.registry.get_alive(match["id"])
            if sandbox is None:
                return await _not_found(send, match["id"])
            if match["rest"] == "/network" and method == "PUT":
                sandbox.network = request  # replaces all egress rules, as the API does
                return await _empty(send, 204)
            if match["rest"] == "/timeout" and method == "POST":
                timeout = request.get("timeout")
                if not isinstance(timeout, int) or timeout < 0:
                    return await _json(send, 400, {"code": 400, "message": "timeout must be an integer >= 0"})
                self.registry.set_timeout(sandbox, timeout)
                return await _empty(send, 204)
            if match["rest"] == "/metrics" and method == "GET":
                return await _json(
                    send, 200, _metrics(sandbox, parse_qs(scope.get("query_string", b"").decode()))
                )
            if not match["rest"] and method == "GET":
                return await _json(send, 200, _sandbox_detail_json(sandbox))
            if not match["rest"] and method == "DELETE":
                self.registry.stats["killed"] += 1
                await self.registry.destroy(sandbox, reason="killed")
                return await _empty(send, 204)
        await _json(send, 404, {"code": 404, "message": f"no route {method} {path} in the stand-in"})

    async def _create(self, request: dict[str, Any], api_key: str, send: Send) -> None:
        template = request.get("templateID")
        if not isinstance(template, str) or not template:
            return await _json(send, 400, {"code": 400, "message": "templateID is required"})
        if len(self.registry.running(api_key)) >= self.registry.max_sandboxes:
            message = (
                f"You have reached the maximum number of concurrent E2B sandboxes "
                f"({self.registry.max_sandboxes}). If you need more, please contact us."
            )
            return await _json(send, 429, {"code": 429, "message": message})
        timeout = request.get("timeout", DEFAULT_SANDBOX_TIMEOUT)
        envs = request.get("envVars") or {}
        if not isinstance(timeout, int) or timeout < 0 or not isinstance(envs, dict):
            return await _json(send, 400, {"code": 400, "message": "invalid timeout or envVars"})
        sandbox = await self.registry.create(
            api_key,
            template,
            timeout,
            {str(k): str(v) for k, v in envs.items()},
            request.get("metadata") or {},
        )
        if "allow_internet_access" in request:
            sandbox.network = {"allow_internet_access": request["allow_internet_access"]}
        await _json(send, 201, _sandbox_json(sandbox))

    # ------------------------------------------------------------------ sandbox proxy and envd

    async def _sandbox_proxy(
        self, scope: Scope, headers: dict[str, str], receive: Receive, send: Send
    ) -> None:
        sandbox_id = headers.get("e2b-sandbox-id") or _id_from_host(headers.get("host", ""))
        sandbox = self.registry.get_alive(sandbox_id or "")
        if sandbox is None:
            await _read_body(receive)
            return await _json(
                send,
                502,
                {"code": 502, "message": "The sandbox was not found", "sandboxId": sandbox_id or ""},
            )
        path = scope["path"]
        if path == "/health":
            await _read_body(receive)
            return await _empty(send, 204)
        if headers.get("x-access-token") != sandbox.access_token:
            await _read_body(receive)
            if path.startswith("/process."):
                error = RpcError("unauthenticated", "invalid or missing X-Access-Token")
                return await _json(send, 401, error.to_json())
            return await _json(send, 401, {"code": 401, "message": "invalid or missing X-Access-Token"})
        if path == "/files":
            return await self._files(scope, headers, sandbox, receive, send)
        if path.startswith("/process.Process/") and scope["method"] == "POST":
            return await self._process_rpc(path.rsplit("/", 1)[1], headers, sandbox, receive, send)
        await _read_body(receive)
        await _json(send, 404, {"code": 404, "message": f"envd has no route {path}"})

    async def _files(
        self, scope: Scope, headers: dict[str, str], sandbox: Sandbox, receive: Receive, send: Send
    ) -> None:
        query = {k: v[-1] for k, v in parse_qs(scope["query_string"].decode()).items()}
        body = await _read_body(receive)
        if scope["method"] == "GET":
            local = _resolve(sandbox, query.get("path", ""))
            if local is None or not local.exists():
                return await _json(
                    send, 404, {"code": 404, "message": f"path '{query.get('path')}' does not exist"}
                )
            if local.is_dir():
                return await _json(
                    send, 400, {"code": 400, "message": f"path '{query.get('path')}' is a directory"}
                )
            data = await anyio.Path(local).read_bytes()
            return await _bytes(send, 200, data, "application/octet-stream")
        if scope["method"] != "POST":
            return await _json(send, 405, {"code": 405, "message": "method not allowed"})
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        content_type = headers.get("content-type", "")
        if content_type.startswith("multipart/form-data"):
            try:
                parts = _parse_multipart(body, content_type)
            except ValueError as exc:
                return await _json(send, 400, {"code": 400, "message": str(exc)})
            if "path" in query and len(parts) == 1:
                parts = [(query["path"], parts[0][1])]
        else:
            parts = [(query.get("path", ""), body)]
        written = []
        for path, data in parts:
            local = _resolve(sandbox, path)
            if local is None:
                return await _json(send, 400, {"code": 400, "message": f"invalid path {path!r}"})
            await anyio.Path(local.parent).mkdir(parents=True, exist_ok=True)
            await anyio.Path(local).write_bytes(data)
            written.append({"name": local.name, "type": "file", "path": sandbox.sandbox_path(local)})
        await _json(send, 200, written)

    async def _process_rpc(
        self, method: str, headers: dict[str, str], sandbox: Sandbox, receive: Receive, send: Send
    ) -> None:
        body = await _read_body(receive)
        streaming = method in ("Start", "Connect")
        try:
            if streaming:
                if not headers.get("content-type", "").startswith(connect.STREAM_CONTENT_TYPE):
                    raise RpcError("invalid_argument", f"{method} expects {connect.STREAM_CONTENT_TYPE}")
                request = connect.parse_single_envelope(body)
                deadline = connect.timeout_seconds(headers)
                if method == "Start":
                    process, events = await self.registry.start_process(sandbox, request)
                else:
                    process = sandbox.find(request.get("process") or {})
                    _, events = self.registry.make_subscription(process)
            else:
                request = connect.parse_json(body)
                reply = await self._unary(method, request, sandbox)
        except RpcError as error:
            if streaming:
                await _start(send, 200, connect.STREAM_CONTENT_TYPE)
                return await send({"type": "http.response.body", "body": connect.end_of_stream(error)})
            return await _json(send, connect.HTTP_STATUS[error.code], error.to_json())
        if not streaming:
            return await _json(send, 200, reply)
        keepalive = float(headers.get("keepalive-ping-interval", "0") or 0) or math.inf
        await self._stream(process, events, deadline, keepalive, method == "Start", receive, send)

    async def _unary(self, method: str, request: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        if method == "List":
            processes = [
                {"config": p.config, "pid": p.pid, **({"tag": p.tag} if p.tag else {})}
                for p in sandbox.processes.values()
                if p.end is None
            ]
            return {"processes": processes}
        if method not in ("SendInput", "SendSignal", "CloseStdin"):
            raise RpcError("unimplemented", f"process.Process/{method} is not implemented by the stand-in")
        process = sandbox.find(request.get("process") or {})
        if method == "SendSignal":
            names = {"SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15}
            signum = names.get(request.get("signal", ""))
            if signum is None:
                raise RpcError("invalid_argument", f"unsupported signal {request.get('signal')!r}")
            process.signal(signum)
            return {}
        stdin = process.proc.stdin
        if stdin is None:
            raise RpcError("failed_precondition", "the process was started without stdin")
        try:
            if method == "CloseStdin":
                await stdin.aclose()
            else:
                data = base64.b64decode(((request.get("input") or {}).get("stdin")) or "")
                await stdin.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise RpcError("failed_precondition", f"cannot write to the process's stdin: {exc}") from exc
        return {}

    async def _stream(
        self,
        process: Process,
        events: Any,
        deadline: float | None,
        keepalive: float,
        owns_process: bool,
        receive: Receive,
        send: Send,
    ) -> None:
        """Send the process's events as Connect envelopes until it ends, the client leaves or time is up."""
        expires = time.monotonic() + deadline if deadline is not None else math.inf

        async def frame(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch_disconnect)
            try:
                await _start(send, 200, connect.STREAM_CONTENT_TYPE)
                await frame(connect.envelope({"event": {"start": {"pid": process.pid}}}))
                while True:
                    wait = min(keepalive, expires - time.monotonic())
                    if wait <= 0:
                        if owns_process:
                            process.signal(9)  # envd kills the command when its stream deadline passes
                        error = RpcError("deadline_exceeded", "the command's timeout was reached")
                        await frame(connect.end_of_stream(error), more=False)
                        break
                    with anyio.move_on_after(wait):
                        kind, value = await events.receive()
                        if kind in ("stdout", "stderr"):
                            data = base64.b64encode(value).decode()
                            await frame(connect.envelope({"event": {"data": {kind: data}}}))
                        elif kind == "end":
                            await frame(connect.envelope({"event": {"end": value}}))
                            await frame(connect.end_of_stream(), more=False)
                            break
                        else:
                            await frame(connect.end_of_stream(RpcError("unavailable", value)), more=False)
                            break
                        continue
                    if time.monotonic() < expires:
                        await frame(connect.envelope({"event": {"keepalive": {}}}))
            finally:
                events.close()
                tg.cancel_scope.cancel()


# ---------------------------------------------------------------------- helpers


def _resolve(sandbox: Sandbox, path: str) -> Path | None:
    try:
        local = sandbox.resolve(path)
    except ValueError:
        return None
    return local if local == sandbox.root or sandbox.root in local.parents else None


def _id_from_host(host: str) -> str | None:
    match = re.match(r"^\d+-(?P<id>[^.]+)\.", host)
    return match["id"] if match else None


def _iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat().replace("+00:00", "Z")


def _metrics(sandbox: Sandbox, query: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The samples between ``start`` and ``end`` (Unix seconds, both inclusive; default: the sandbox's
    whole life up to now), as the API's ``GET /sandboxes/{id}/metrics`` lists them."""

    def bound(name: str, default: float) -> float:
        values = query.get(name)
        return float(values[0]) if values and values[0].lstrip("-").isdigit() else default

    start, end = bound("start", 0), bound("end", math.inf)
    return [sample for sample in sandbox.metrics if start <= sample["timestampUnix"] <= end]


def _sandbox_json(sandbox: Sandbox) -> dict[str, Any]:
    return {
        "templateID": sandbox.template_id,
        "sandboxID": sandbox.sandbox_id,
        "clientID": "standin",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.access_token,
        "trafficAccessToken": None,
        "domain": None,
    }


def _sandbox_detail_json(sandbox: Sandbox) -> dict[str, Any]:
    return {
        **_sandbox_json(sandbox),
        "startedAt": _iso(sandbox.started_at),
        "endAt": _iso(sandbox.end_at),
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": "running",
        "metadata": sandbox.metadata,
    }


def _parse_multipart(body: bytes, content_type: str) -> list[tuple[str, bytes]]:
    """The ``file`` parts of a multipart/form-data body, as (filename, data)."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not match:
        raise ValueError("multipart body without a boundary")
    delimiter = b"--" + match[1].encode()
    files = []
    for part in body.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break
        head, separator, data = part.partition(b"\r\n\r\n")
        if not separator:
            raise ValueError("malformed multipart part")
        if not data.endswith(b"\r\n"):
            raise ValueError("multipart part does not end with CRLF")
        disposition = next(
            (
                line
                for line in head.decode("utf-8", "replace").split("\r\n")
                if line.lower().startswith("content-disposition")
            ),
            "",
        )
        name = re.search(r'\bname="([^"]*)"', disposition)
        filename = re.search(r'\bfilename="([^"]*)"', disposition)
        if name and name[1] == "file" and filename:
            files.append((filename[1], data[:-2]))
    if not files:
        raise ValueError("multipart body has no file part")
    return files


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _start(send: Send, status: int, content_type: str | None, length: int | None = None) -> None:
    headers = []
    if content_type:
        headers.append((b"content-type", content_type.encode()))
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _bytes(send: Send, status: int, body: bytes, content_type: str) -> None:
    await _start(send, status, content_type, len(body))
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, value: Any) -> None:
    await _bytes(send, status, json.dumps(value).encode(), "application/json")


async def _empty(send: Send, status: int) -> None:
    await _start(send, status, None)
    await send({"type": "http.response.body", "body": b""})


async def _not_found(send: Send, sandbox_id: str) -> None:
    message = f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it"
    await _json(send, 404, {"code": 404, "message": message})
