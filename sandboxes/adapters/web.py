"""What every HTTP adapter (`kodeagent mcp --http`, `kodeagent serve`) checks before it reads a
request, and how it listens: the Host and Origin checks against DNS rebinding, refusing repeated
headers, loopback addresses, the listening socket.

DNS rebinding needs a domain name that resolves to this machine, so a Host that is an IP literal or
``localhost`` is accepted, and any other name only when listed. A request with an Origin (a browser)
is accepted only from a loopback origin or a listed one.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable


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
