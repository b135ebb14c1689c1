"""The HTTP front door: bearer tokens (tenants), the Host/Origin checks against DNS rebinding, and the
request-size cap. A plain ASGI middleware, so it runs before the MCP SDK sees a byte.

Each refusal is an HTTP error whose body is a JSON-RPC error object, which the MCP SDK's client raises
as an `MCPError` carrying the message (a bare status would reach the user as "Server returned an
error response").
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .config import TokenConfig

logger = logging.getLogger("sandboxes.adapters.mcp")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TENANT_KEY = "kodeagent.tenant"
"""Where the guard leaves the caller's tenant in the ASGI scope."""

UNAUTHORIZED = -32001
FORBIDDEN_ORIGIN = -32002
BAD_HOST = -32003
TOO_LARGE = -32004
UNKNOWN_SESSION = -32005
MAX_TRACKED_SESSIONS = 100_000


class TokenTable:
    """The accepted bearer tokens and the tenant each one is. Every comparison runs in constant time
    and every token is compared, so timing tells nothing about which token (or how much of one) matched."""

    def __init__(self, tokens: Iterable[TokenConfig]) -> None:
        self._tokens = [(t.token.encode(), t.name) for t in tokens]
        if not self._tokens:
            raise ValueError("an HTTP server needs at least one token")

    @property
    def tenants(self) -> list[str]:
        return [name for _, name in self._tokens]

    def tenant_for_token(self, token: str) -> str | None:
        given = token.encode("utf-8", "replace")
        found = None
        for secret, name in self._tokens:
            if hmac.compare_digest(given, secret) and found is None:
                found = name
        return found

    def tenant_for_header(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization: Bearer <token>`` header value, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.tenant_for_token(token.strip())


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IP addresses."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split_host(value: str) -> tuple[str, str]:
    """'name:port' / '[::1]:port' / 'name' -> (name, port or '')."""
    if value.startswith("["):
        name, _, rest = value.partition("]")
        return name + "]", rest.removeprefix(":")
    name, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return name, port


def _matches(value: str, patterns: Iterable[str]) -> bool:
    """`value` ('name:port') against patterns 'name', 'name:port' or 'name:*'."""
    name, port = _split_host(value.lower())
    for pattern in patterns:
        want_name, want_port = _split_host(pattern.lower())
        if want_name == name and (want_port in ("", "*") or want_port == port):
            return True
    return False


class HttpGuard:
    """ASGI middleware in front of the MCP app: Host, Origin, bearer token, the token's own MCP
    transport session, body size, in that order.

    DNS rebinding needs a domain name that resolves to this machine, so a Host that is an IP literal
    or ``localhost`` is accepted, and any other name only when listed in `allowed_hosts`. A request
    with an Origin (a browser) is accepted only from a loopback origin or one in `allowed_origins`.
    """

    def __init__(
        self,
        app: ASGIApp,
        tokens: TokenTable,
        *,
        max_body: int,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body = max_body
        self.allowed_hosts = tuple(allowed_hosts)
        self.allowed_origins = tuple(o.rstrip("/").lower() for o in allowed_origins)
        self._owners: dict[str, str] = {}  # MCP transport session id -> the tenant that opened it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # websockets: not an MCP transport
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self._check_headers(headers)
        if refusal is not None:
            status, code, text, extra = refusal
            await _refuse(send, status, code, text, extra)
            return
        tenant = self.tokens.tenant_for_header(headers.get("authorization"))
        if tenant is None:
            given = "authorization" in headers
            logger.warning("refused a request with %s bearer token", "a wrong" if given else "no")
            refusal_text = (
                "the bearer token is not valid for this server"
                if given
                else "this server needs a bearer token: send the header 'Authorization: Bearer <token>' (the "
                "token was printed when the server started, or comes from KODEAGENT_MCP_TOKEN or the config file)"
            )
            await _refuse(
                send, 401, UNAUTHORIZED, refusal_text, [(b"www-authenticate", b'Bearer realm="kodeagent"')]
            )
            return
        scope[TENANT_KEY] = tenant
        transport_session = headers.get("mcp-session-id")
        if transport_session is not None and self._owners.get(transport_session, tenant) != tenant:
            logger.warning("refused tenant %s the MCP session of another token", tenant)
            await _refuse(
                send, 404, UNKNOWN_SESSION, "no such MCP session for this token; initialize a new one"
            )
            return
        send = self._binding_sessions(send, tenant, scope.get("method") == "DELETE", transport_session)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            await _refuse(send, 413, TOO_LARGE, self._too_large(int(declared)))
            return
        body = bytearray()
        while True:  # read the whole (bounded) body first: a refusal cannot come after the app answered
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await _refuse(send, 413, TOO_LARGE, self._too_large(None))
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay([{"type": "http.request", "body": bytes(body)}], receive), send)

    def _binding_sessions(self, send: Send, tenant: str, deleting: bool, session: str | None) -> Send:
        """`send`, noting which token an MCP transport session (``Mcp-Session-Id``) was opened with, so
        that no other token can use it (the SDK would serve anyone who knows the id)."""

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message.get("status", 0))
                for key, value in message.get("headers", []):
                    if key.lower() == b"mcp-session-id" and status < 300:
                        self._owners[value.decode("latin-1")] = tenant
                        while len(self._owners) > MAX_TRACKED_SESSIONS:
                            self._owners.pop(next(iter(self._owners)))  # the oldest
                if deleting and session is not None and status < 300:
                    self._owners.pop(session, None)
            await send(message)

        return noting

    def _too_large(self, size: int | None) -> str:
        what = f"{size:,} bytes" if size is not None else "larger than that"
        return (
            f"the request is {what}; this server takes at most {self.max_body:,} bytes per request "
            "(http.max_request_bytes): send less code or smaller files per call"
        )

    def _check_headers(
        self, headers: dict[str, str]
    ) -> tuple[int, int, str, list[tuple[bytes, bytes]]] | None:
        host = headers.get("host", "")
        name, _ = _split_host(host)
        if not host or not (
            _is_ip_literal(name) or name.lower() == "localhost" or _matches(host, self.allowed_hosts)
        ):
            logger.warning("refused a request for Host %r", host)
            return (421, BAD_HOST, f"this server does not answer to the Host {host!r} (DNS rebinding protection); "
                    "list the name in http.allowed_hosts to allow it", [])  # fmt: skip
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin):
            logger.warning("refused a request from Origin %r", origin)
            return (403, FORBIDDEN_ORIGIN, f"requests from the Origin {origin!r} are not allowed (DNS rebinding "
                    "protection); list it in http.allowed_origins to allow it", [])  # fmt: skip
        return None

    def _origin_allowed(self, origin: str) -> bool:
        origin = origin.rstrip("/").lower()
        scheme, _, rest = origin.partition("://")
        if scheme in ("http", "https") and rest and is_loopback(_split_host(rest)[0]):
            return True
        for allowed in self.allowed_origins:
            if origin == allowed or (allowed.endswith(":*") and origin.startswith(allowed[:-1])):
                return True
        return False


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


async def _refuse(
    send: Send, status: int, code: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        *(headers or [])],
        }
    )  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (IPv4 or IPv6 by the host's form); port 0 picks a free one."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    return socket.create_server((bare, port), family=family, backlog=128, reuse_port=False)


def url_of(sock: socket.socket, path: str) -> str:
    address, port = sock.getsockname()[:2]
    shown = f"[{address}]" if ":" in address else address
    return f"http://{shown}:{port}{path}"
