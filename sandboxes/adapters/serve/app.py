"""The front door: one ASGI app for every sandbox and both in-sandbox ports at one URL.

Before anything reads a request: the headers that decide anything appear at most once, the Host and
Origin pass the DNS-rebinding checks, and the body is bounded (a declared length over the cap is
refused before a byte is read; a streamed one is cut off at the cap). Then the request is told apart
by E2B's headers, as E2B's own edge does: no `E2b-Sandbox-Port` is the control plane (the API key in
`X-API-KEY` names the tenant); 49983 is envd, 49999 the code interpreter, each reached only with the
sandbox's access token. Requests are counted per tenant while they run (over the cap: 429).
`POST /run_code` (SandboxFusion's API, `runcode.py`) takes the key in the forms its clients send.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ..mcp.auth import TokenTable
from ..web import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    body_first,
    host_allowed,
    origin_allowed,
    repeated_header,
)
from .config import ServeConfig
from .control import TENANT_KEY, ControlPlane
from .errors import ServeError, TooLarge
from .limits import InsideLimits
from .registry import SANDBOX_PORT_HEADER, ExecutorFactory, Registry
from .runcode import PATH as RUN_CODE_PATH
from .runcode import RunCode
from .sandbox import ENVD_PORT, INTERPRETER_PORT, Resolve

logger = logging.getLogger("sandboxes.adapters.serve")


API_KEY_HEADER = "x-api-key"
SINGLE_HEADERS = (
    "host",
    "origin",
    "x-api-key",
    "authorization",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "e2b-sandbox-id",
    "e2b-sandbox-port",
    "x-access-token",
    "connect-protocol-version",
    "connect-timeout-ms",
)
"""Headers this server or the in-sandbox apps read: a request repeating one is refused (two readers
could see different values)."""

CONNECT_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    413: "resource_exhausted",
    421: "permission_denied",
    429: "resource_exhausted",
    501: "unimplemented",
    502: "unavailable",
    503: "unavailable",
}


def _placeholder(name: str) -> Callable[[Resolve], ASGIApp]:
    """Until the in-sandbox app exists: every request is answered 501, after its sandbox is resolved."""

    def build(resolve: Resolve) -> ASGIApp:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            from starlette.requests import Request

            try:
                await resolve(Request(scope, receive))
            except ServeError as exc:
                await refuse(scope, send, exc.status, str(exc))
                return
            await refuse(scope, send, 501, f"this server does not serve the {name} API yet")

        return app

    return build


def _in_sandbox_app(module: str, name: str, resolve: Resolve, limits: InsideLimits) -> ASGIApp:
    import importlib

    try:
        build = getattr(importlib.import_module(f"{__package__}.{module}"), f"{module}_app")
    except (ImportError, AttributeError):
        return _placeholder(name)(resolve)
    built: ASGIApp = build(resolve, limits)
    return built


class ServeApp:
    """The ASGI app of `kodeagent serve`: the front door, the control plane and both in-sandbox apps.
    Its lifespan holds the registry: at shutdown every sandbox is closed."""

    def __init__(self, config: ServeConfig, *, factory: ExecutorFactory | None = None) -> None:
        if not config.keys:
            raise ValueError("the server needs at least one API key (see keys.with_keys)")
        self.config = config
        self.keys = TokenTable(config.keys)
        self.registry = Registry(config, factory)
        self.control = ControlPlane(self.registry).app()
        self.run_code = RunCode(config, self.keys, self.registry.in_flight)
        self.ports: dict[int, ASGIApp] = {
            ENVD_PORT: _in_sandbox_app("envd", "envd", self.registry.resolve, config.inside),
            INTERPRETER_PORT: _in_sandbox_app(
                "interpreter", "code interpreter", self.registry.resolve, config.inside
            ),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        raw = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        receive, send = body_first(receive, send, raw)
        repeated = repeated_header(raw, SINGLE_HEADERS)
        if repeated is not None:
            logger.warning("refused a request repeating the header %s", repeated)
            await refuse(scope, send, 400, f"the request repeats the header {repeated!r}; send it once")
            return
        headers = dict(raw)
        host = headers.get("host", "")
        if not host_allowed(host, self.config.allowed_hosts):
            logger.warning("refused a request for Host %r", host)
            await refuse(
                scope,
                send,
                421,
                f"this server does not answer to the Host {host!r} (DNS rebinding protection); list the "
                "name in allowed_hosts to allow it",
            )
            return
        origin = headers.get("origin")
        if origin is not None and not origin_allowed(origin, self.config.allowed_origins):
            logger.warning("refused a request from Origin %r", origin)
            await refuse(scope, send, 403, f"requests from the Origin {origin!r} are not allowed")
            return
        port_text = headers.get(SANDBOX_PORT_HEADER)
        if (
            port_text is None and scope.get("path") == RUN_CODE_PATH
        ):  # SandboxFusion's route, its own keys' forms
            await self.run_code(scope, receive, send, headers)
            return
        try:
            if port_text is None:
                await self._control(scope, receive, send, headers)
            else:
                await self._in_sandbox(scope, receive, send, headers, port_text)
        except ServeError as exc:
            await refuse(scope, send, exc.status, str(exc))

    async def _control(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        tenant = self.keys.tenant_for_token(headers.get(API_KEY_HEADER, ""))
        if tenant is None:
            logger.warning(
                "refused a control-plane request with %s API key",
                "a wrong" if API_KEY_HEADER in headers else "no",
            )
            await refuse(
                scope,
                send,
                401,
                "Invalid API key: send this server's key as E2B_API_KEY (printed when it started, or from "
                "KODEAGENT_SERVE_KEY or its config file)",
            )
            return
        scope[TENANT_KEY] = tenant
        bounded = _bounded(scope, receive, headers, self.config.max_control_bytes)
        async with self.registry.in_flight(tenant):
            await _guarded(self.control, scope, bounded, send)

    async def _in_sandbox(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], port_text: str
    ) -> None:
        port = int(port_text) if port_text.isdigit() and len(port_text) <= 5 else 0
        app = self.ports.get(port)
        if app is None:
            await refuse(scope, send, 502, f"The sandbox is running but port {port_text[:8]!r} is not open")
            return
        entry = self.registry.authenticate(headers, port, str(scope.get("path", "")))
        bounded = _bounded(scope, receive, headers, self.config.max_request_bytes)
        async with self.registry.in_flight(entry.tenant), self.registry.using(entry):
            await _guarded(app, scope, bounded, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.registry.__aenter__()
                except Exception as exc:  # reported to the server, which then does not start
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.registry.__aexit__(None, None, None)
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_app(config: ServeConfig, *, factory: ExecutorFactory | None = None) -> ServeApp:
    """The ASGI app serving `config` (which must name its keys: see `keys.with_keys`). `factory`
    makes each sandbox's unopened executor (default: `open_executor` on the config's backend)."""
    return ServeApp(config, factory=factory)


class _Started:
    """`send`, remembering whether the response has begun (a refusal can only come before that)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


async def _guarded(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """`app`, with a body cut off at its cap (or any `ServeError` before a response) answered as a
    refusal instead of a broken connection."""
    answer = _Started(send)
    try:
        await app(scope, receive, answer)
    except ServeError as exc:
        if answer.started:
            raise
        await refuse(scope, send, exc.status, str(exc))


def _bounded(scope: Scope, receive: Receive, headers: dict[str, str], limit: int) -> Receive:
    """`receive`, refusing a body over `limit` bytes: a declared length at once, a streamed one when
    its bytes pass the limit (whatever reads it gets `TooLarge`, before the excess is kept)."""
    declared = headers.get("content-length", "")
    if declared and (not declared.isdigit() or len(declared) > 18):
        raise ServeError("Content-Length is not a number", status=400)
    if declared and int(declared) > limit:
        raise TooLarge(_too_large(int(declared), limit))
    seen = 0

    async def receiving() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise TooLarge(_too_large(None, limit))
        return message

    return receiving


def _too_large(size: int | None, limit: int) -> str:
    what = f"{size:,} bytes" if size is not None else "larger than that"
    return f"the request body is {what}; this server takes at most {limit:,} bytes here"


async def refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    """An error answer in the shape the SDK reads on that path: Connect's ``{"code": "...", "message"}``
    for an RPC path, E2B's ``{"code": <status>, "message"}`` for anything else."""
    path = str(scope.get("path", ""))
    rpc = path.startswith("/") and "." in path.split("/")[1] if path.count("/") >= 2 else False
    value: dict[str, Any] = (
        {"code": CONNECT_CODES.get(status, "unknown"), "message": message}
        if rpc
        else {"code": status, "message": message}
    )
    body = json.dumps(value).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
