"""The HTTP front door: bearer tokens (tenants), the Host/Origin checks against DNS rebinding, the
request-size cap, and the MCP connections (transport sessions) each token holds. A plain ASGI
middleware, so it runs before the MCP SDK sees a byte.

Each refusal is an HTTP error whose body is a JSON-RPC error object, which the MCP SDK's client raises
as an `MCPError` carrying the message (a bare status would reach the user as "Server returned an
error response").
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..web import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    bind,
    body_first,
    host_allowed,
    is_loopback,
    origin_allowed,
    repeated_header,
    url_of,
)
from .config import HttpConfig, TokenConfig

logger = logging.getLogger("sandboxes.adapters.mcp")


TENANT_KEY = "kodeagent.tenant"
"""Where the guard leaves the caller's tenant in the ASGI scope."""

UNAUTHORIZED = -32001
FORBIDDEN_ORIGIN = -32002
BAD_HOST = -32003
TOO_LARGE = -32004
UNKNOWN_SESSION = -32005
AMBIGUOUS = -32006
TOO_MANY_CONNECTIONS = -32007
NOT_FOUND = -32008

SINGLE_HEADERS = (
    "host",
    "origin",
    "authorization",
    "content-length",
    "content-type",
    "transfer-encoding",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
)
"""Headers the guard or the MCP SDK reads. Of a repeated one the guard and the SDK could read different
values (a dict keeps the last, Starlette's ``headers.get`` the first), so a request repeating one is refused."""

NO_OAUTH = ("/.well-known/oauth-", "/.well-known/openid-configuration")
"""Discovery paths of OAuth clients: answered 404 before the token check, so a client learns there is no
login to start (a 401 there makes some clients, the MCP Inspector among them, begin one)."""


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


@dataclass
class _Connection:
    tenant: str
    in_flight: int = 0
    idle_since: float = 0.0


@dataclass
class Connections:
    """The MCP connections (transport sessions, ``Mcp-Session-Id``) let through, each bound to the token
    that opened it for as long as it lives: an id the table does not hold for the caller's token is
    refused before the SDK sees it, so no binding is ever dropped while its transport can be reached.

    A connection ends when its client deletes it, or after `idle_timeout` with no request in flight
    (the SDK's own idle timeout, given the same value, ends its side then; its clock restarts as a
    request ends, this one's just after). When the table or a token's share of it is full, new
    connections are refused: nothing is evicted."""

    capacity: int
    per_token: int
    idle_timeout: float
    clock: Callable[[], float] = time.monotonic
    _open: dict[str, _Connection] = field(default_factory=dict, init=False, repr=False)
    _opening: dict[str, int] = field(default_factory=dict, init=False, repr=False)  # tenant -> being opened

    @classmethod
    def of(cls, http: HttpConfig) -> Connections:
        """The table `http`'s limits ask for."""
        return cls(http.max_connections, http.max_connections_per_token, http.connection_idle_timeout)

    def owner(self, transport: str) -> str | None:
        self._expire()
        connection = self._open.get(transport)
        return None if connection is None else connection.tenant

    def count(self, tenant: str | None = None) -> int:
        """Open connections (and ones being opened) of `tenant`, or of everyone."""
        self._expire()
        if tenant is None:
            return len(self._open) + sum(self._opening.values())
        mine = sum(1 for c in self._open.values() if c.tenant == tenant)
        return mine + self._opening.get(tenant, 0)

    def reserve(self, tenant: str) -> tuple[int, str] | None:
        """Hold a slot for a connection `tenant` is opening; or the (status, message) refusing it."""
        if self.count(tenant) >= self.per_token:
            return 429, (
                f"this token already has {self.per_token} MCP connections open (the limit, "
                "http.max_connections_per_token): close one (an MCP client does on exit), or wait "
                f"for idle ones to end after {self.idle_timeout:g} s"
            )
        if self.count() >= self.capacity:
            return 503, (
                f"the server has {self.capacity} MCP connections open (the limit, http.max_connections); "
                f"try again later: idle connections end after {self.idle_timeout:g} s"
            )
        self._opening[tenant] = self._opening.get(tenant, 0) + 1
        return None

    def unreserve(self, tenant: str) -> None:
        self._opening[tenant] -= 1
        if not self._opening[tenant]:
            del self._opening[tenant]

    def bind(self, tenant: str, transport: str) -> None:
        """The reserved slot of `tenant` became the connection `transport`, with the request that opened
        it in flight (`leave` it when that ends)."""
        self.unreserve(tenant)
        self._open[transport] = _Connection(tenant, in_flight=1)

    def enter(self, transport: str) -> None:
        self._open[transport].in_flight += 1

    def leave(self, transport: str) -> None:
        connection = self._open.get(transport)
        if connection is not None:
            connection.in_flight -= 1
            connection.idle_since = self.clock()

    def forget(self, transport: str) -> None:
        self._open.pop(transport, None)

    def _expire(self) -> None:
        limit = self.clock() - self.idle_timeout
        for transport in [t for t, c in self._open.items() if c.in_flight <= 0 and c.idle_since <= limit]:
            del self._open[transport]


class HttpGuard:
    """ASGI middleware in front of the MCP app: unambiguous headers, Host, Origin, no OAuth, bearer token,
    the token's own MCP connection and its caps, body size, in that order.

    DNS rebinding needs a domain name that resolves to this machine, so a Host that is an IP literal
    or ``localhost`` is accepted, and any other name only when listed in `allowed_hosts`. A request
    with an Origin (a browser) is accepted only from a loopback origin or one in `allowed_origins`.

    A client that goes away while a request of its connection runs (the HTTP stream dropped) gets
    that request cancelled, as an MCP ``notifications/cancelled`` would: a run does not outlive the
    client waiting for it.
    """

    def __init__(
        self,
        app: ASGIApp,
        tokens: TokenTable,
        *,
        max_body: int,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        connections: Connections | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body = max_body
        self.allowed_hosts = tuple(allowed_hosts)
        self.allowed_origins = tuple(allowed_origins)
        self.connections = connections or Connections.of(HttpConfig())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # websockets: not an MCP transport
            await send({"type": "websocket.close", "code": 1008})
            return
        raw = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        receive, send = body_first(receive, send, raw)
        repeated = _repeated(raw)
        if repeated is not None:
            logger.warning("refused a request repeating the header %s", repeated)
            await _refuse(
                send,
                400,
                AMBIGUOUS,
                f"the request repeats the header {repeated!r}; send each of {', '.join(SINGLE_HEADERS)} "
                "at most once",
            )
            return
        headers = dict(raw)
        refusal = self._check_headers(headers)
        if refusal is not None:
            status, code, text, extra = refusal
            await _refuse(send, status, code, text, extra)
            return
        if str(scope.get("path", "")).startswith(NO_OAUTH):
            await _refuse(send, 404, NOT_FOUND, "this server has no OAuth: send its bearer token instead")
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
        scope["user"] = _sdk_user(tenant)  # the SDK binds its transports to this too
        transport = headers.get("mcp-session-id")
        answer = _Answer(send, self.connections, tenant, transport, scope.get("method") == "DELETE")
        if transport is not None:
            if self.connections.owner(transport) != tenant:
                logger.warning("refused tenant %s an MCP session it does not hold", tenant)
                await _refuse(
                    send, 404, UNKNOWN_SESSION, "no such MCP session for this token; initialize a new one"
                )
                return
            self.connections.enter(transport)
            try:
                await self._serve(scope, receive, answer, headers)
            finally:
                self.connections.leave(transport)
            return
        if scope.get("method") != "POST":  # only a POST (initialize) opens a connection
            await self._serve(scope, receive, answer, headers)
            return
        full = self.connections.reserve(tenant)
        if full is not None:
            logger.warning("refused tenant %s a new MCP connection: %s", tenant, full[1])
            await _refuse(send, full[0], TOO_MANY_CONNECTIONS, full[1])
            return
        try:
            await self._serve(scope, receive, answer, headers)
        finally:
            if answer.opened is None:
                self.connections.unreserve(tenant)
            else:
                self.connections.leave(answer.opened)

    async def _serve(self, scope: Scope, receive: Receive, answer: _Answer, headers: dict[str, str]) -> None:
        """The request, its (bounded) body read whole first, to the app, which answers through `answer`."""
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            await _refuse(answer.send, 413, TOO_LARGE, self._too_large(int(declared)))
            return
        body = bytearray()
        while True:  # read the whole (bounded) body first: a refusal cannot come after the app answered
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), answer)
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await _refuse(answer.send, 413, TOO_LARGE, self._too_large(None))
                return
            if not message.get("more_body", False):
                break
        incoming = _replay([{"type": "http.request", "body": bytes(body)}], receive)
        requests = _request_ids(bytes(body)) if answer.transport is not None else []
        if requests:
            incoming = self._cancelling_on_disconnect(
                incoming, answer, scope, answer.transport or "", requests
            )
        await self.app(scope, incoming, answer)

    def _cancelling_on_disconnect(
        self, receive: Receive, answer: _Answer, scope: Scope, transport: str, requests: list[Any]
    ) -> Receive:
        """`receive`, which, when the client disconnects before its answer is complete, first cancels
        the request(s) it sent on its connection (a run must not go on for nobody)."""

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not answer.complete:
                logger.info("the client of tenant %s went away mid-request: cancelling it", answer.tenant)
                with anyio.CancelScope(shield=True):
                    for request_id in requests:
                        await self._cancel(scope, transport, request_id)
            return message

        return receiving

    async def _cancel(self, scope: Scope, transport: str, request_id: Any) -> None:
        """Send the connection's server an MCP ``notifications/cancelled`` for `request_id`, as its
        client would have."""
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": request_id, "reason": "the client disconnected"},
            }
        ).encode()
        keep = ("host", "authorization", "mcp-protocol-version")
        headers = [(k, v) for k, v in scope.get("headers", []) if k.decode("latin-1").lower() in keep]
        headers += [
            (b"mcp-session-id", transport.encode("latin-1")),
            (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream"),
            (b"content-length", str(len(body)).encode()),
        ]
        pending = [{"type": "http.request", "body": body}]

        async def receive() -> Message:
            return pending.pop(0) if pending else {"type": "http.disconnect"}

        async def discard(message: Message) -> None:
            pass

        if self.connections.owner(transport) is None:  # ended meanwhile, and its requests with it
            return
        self.connections.enter(transport)
        try:
            await self.app({**scope, "method": "POST", "headers": headers}, receive, discard)
        except Exception:  # the connection may be ending as well: then nothing is left to cancel
            logger.debug("cancelling a request of a departed client failed", exc_info=True)
        finally:
            self.connections.leave(transport)

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
        if not host_allowed(host, self.allowed_hosts):
            logger.warning("refused a request for Host %r", host)
            return (
                421,
                BAD_HOST,
                f"this server does not answer to the Host {host!r} (DNS rebinding protection); "
                "list the name in http.allowed_hosts to allow it",
                [],
            )
        origin = headers.get("origin")
        if origin is not None and not origin_allowed(origin, self.allowed_origins):
            logger.warning("refused a request from Origin %r", origin)
            return (
                403,
                FORBIDDEN_ORIGIN,
                f"requests from the Origin {origin!r} are not allowed (DNS rebinding "
                "protection); list it in http.allowed_origins to allow it",
                [],
            )
        return None


class _Answer:
    """The app's `send` for one request, watched: a connection it opens is bound to the caller's token
    before its id can reach the client, a connection it deletes is forgotten, and whether the answer is
    complete is known (a disconnect before that cancels the request)."""

    def __init__(
        self, send: Send, connections: Connections, tenant: str, transport: str | None, deleting: bool
    ) -> None:
        self.send = send
        self.connections = connections
        self.tenant = tenant
        self.transport = transport
        self.deleting = deleting
        self.opened: str | None = None
        self.complete = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            status = int(message.get("status", 0))
            if self.transport is None and status < 400:  # the SDK keeps a connection it answered so
                minted = next(
                    (v for k, v in message.get("headers", []) if k.lower() == b"mcp-session-id"), None
                )
                if minted is not None:
                    self.opened = minted.decode("latin-1")
                    self.connections.bind(self.tenant, self.opened)
            elif self.transport is not None and self.deleting and status < 300:
                self.connections.forget(self.transport)
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self.send(message)


def _repeated(headers: list[tuple[str, str]]) -> str | None:
    """The first header of `SINGLE_HEADERS` that `headers` (lower-case names) carries more than once."""
    return repeated_header(headers, SINGLE_HEADERS)


def _request_ids(body: bytes) -> list[Any]:
    """The ids of the JSON-RPC requests in a (bounded) request body; none when it is not one."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return []
    messages = parsed if isinstance(parsed, list) else [parsed]
    return [
        m["id"]
        for m in messages
        if isinstance(m, dict)
        and isinstance(m.get("method"), str)
        and isinstance(m.get("id"), str | int)
        and not isinstance(m["id"], bool)
    ]


def _sdk_user(tenant: str) -> Any:
    """The tenant as the MCP SDK's authenticated user (it compares it on every request of a transport)."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(AccessToken(token="", client_id=tenant, scopes=[]))


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
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "Connections",
    "HttpGuard",
    "TokenTable",
    "bind",
    "is_loopback",
    "url_of",
]
