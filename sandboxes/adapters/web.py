"""What every HTTP adapter (`kodeagent mcp --http`, `kodeagent serve`) checks before it reads a
request, and how it listens: the Host and Origin checks against DNS rebinding, refusing repeated
headers, an answer that waits for the body it refuses, loopback addresses, the listening socket.

DNS rebinding needs a domain name that resolves to this machine, so a Host that is an IP literal or
``localhost`` is accepted, and any other name only when listed. A request with an Origin (a browser)
is accepted only from a loopback origin or a listed one.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import anyio

# The ASGI shapes every adapter speaks (plain aliases: no ASGI framework is needed for them).
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DISCARD_BYTES = 8 * 1024 * 1024
"""The most of a request's unread body read and dropped before its answer starts (see `body_first`)."""
DISCARD_SECONDS = 2.0
"""How long reading it may take; past either bound the connection closes with the body unread."""


def is_ip_literal(host: str) -> bool:
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


def split_host(value: str) -> tuple[str, str]:
    """'name:port' / '[::1]:port' / 'name' -> (name, port or '')."""
    if value.startswith("["):
        name, _, rest = value.partition("]")
        return name + "]", rest.removeprefix(":")
    name, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return name, port


def matches_host(value: str, patterns: Iterable[str]) -> bool:
    """`value` ('name:port') against patterns 'name', 'name:port' or 'name:*'."""
    name, port = split_host(value.lower())
    for pattern in patterns:
        want_name, want_port = split_host(pattern.lower())
        if want_name == name and (want_port in ("", "*") or want_port == port):
            return True
    return False


def host_allowed(host: str, allowed_hosts: Iterable[str]) -> bool:
    """Whether a request's Host header may be answered (an IP literal, localhost, or a listed name)."""
    name, _ = split_host(host)
    return bool(host) and (
        is_ip_literal(name) or name.lower() == "localhost" or matches_host(host, allowed_hosts)
    )


def origin_allowed(origin: str, allowed_origins: Iterable[str]) -> bool:
    """Whether a request's Origin header (a browser's page) may reach the server."""
    origin = origin.rstrip("/").lower()
    scheme, _, rest = origin.partition("://")
    if scheme in ("http", "https") and rest and is_loopback(split_host(rest)[0]):
        return True
    for allowed in (a.rstrip("/").lower() for a in allowed_origins):
        if origin == allowed or (allowed.endswith(":*") and origin.startswith(allowed[:-1])):
            return True
    return False


def repeated_header(headers: Iterable[tuple[str, str]], names: Iterable[str]) -> str | None:
    """The first of `names` that `headers` (lower-case names) carries more than once. Of a repeated
    header two readers can see different values (a dict keeps the last, Starlette's ``get`` the
    first), so a request repeating one that decides anything is refused."""
    wanted = frozenset(names)
    seen: set[str] = set()
    for name, _ in headers:
        if name in wanted:
            if name in seen:
                return name
            seen.add(name)
    return None


def body_first(receive: Receive, send: Send, headers: Iterable[tuple[str, str]]) -> tuple[Receive, Send]:
    """`receive` and `send` for one request, where the answer starts only once the request's body,
    if the app left some unread, is read and dropped.

    An answer given while the client is still sending (a 413, a 401) races the body: HTTP clients
    that read the answer while they write (hyper's, under the E2B SDK) can fail the whole exchange,
    and a connection closed on unread bytes is reset, the answer lost with it. Reading the rest
    first makes the refusal an ordinary answer, on a connection that can carry the next request.

    What is read is bounded: at most `DISCARD_BYTES`, for at most `DISCARD_SECONDS`, so a flood
    costs no more than that. A body declared larger than `DISCARD_BYTES` is not waited for (it could
    not be read whole anyway), nor one the client holds back until ``100 Continue``, which the app
    never asked for. Where the rest stays unread, the answer says ``Connection: close``, so the
    server stops reading there instead of taking the rest at line speed. `headers` are the
    request's, with lower-case names."""
    declared = ""
    expects_continue = False
    for name, value in headers:
        if name == "content-length":
            declared = value.strip()
        elif name == "expect":
            expects_continue = value.strip().lower() == "100-continue"
    too_big = declared.isdigit() and (len(declared) > 18 or int(declared) > DISCARD_BYTES)
    settled = False  # the body was read to its end, or the answer has begun
    asked = False

    async def receiving() -> Message:
        nonlocal settled, asked
        asked = True
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            settled = True
        return message

    async def sending(message: Message) -> None:
        nonlocal settled
        if message["type"] == "http.response.start" and not settled:
            settled = True
            waited = not too_big and (asked or not expects_continue)
            if not (waited and await _discard(receive)):  # the rest stays unread: end the connection
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return receiving, sending


async def _discard(receive: Receive) -> bool:
    """Whether the rest of the body was read (and dropped) within the bounds."""
    read = 0
    with anyio.move_on_after(DISCARD_SECONDS):
        while read <= DISCARD_BYTES:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return True
            read += len(message.get("body", b""))
    return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (IPv4 or IPv6 by the host's form); port 0 picks a free one.

    Made with the protocol named (``IPPROTO_TCP``, where `socket.create_server` leaves 0): asyncio
    sets ``TCP_NODELAY`` only on connections whose socket says TCP, and without it every response
    whose body follows its head in a second write waited ~40 ms for the client's delayed ACK."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bare, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket, path: str = "") -> str:
    address, port = sock.getsockname()[:2]
    shown = f"[{address}]" if ":" in address else address
    return f"http://{shown}:{port}{path}"
