"""The gateway's own resolver: A and AAAA queries over UDP to configured name servers (stdlib only).

The gateway resolves every name itself and connects to the address it checked, so what the code
inside believes a name means never matters. Replies are hostile input too (a name server can be
spoofed or lie): each is bounded (one datagram of at most 4 KiB), must come from the server asked,
carry the query's random id and question, and is parsed with every offset checked; compression
pointers may only point backwards. Only A and AAAA answers are taken; CNAME chains are followed
inside the reply (the server's recursion), never by new queries.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import socket
import struct
from collections.abc import Sequence

from .match import IPAddress

MAX_REPLY = 4096
MAX_ANSWERS = 16
QUERY_TIMEOUT = 2.0
TYPE_A, TYPE_AAAA, TYPE_CNAME = 1, 28, 5


class ResolveError(Exception):
    """The name could not be resolved (no answer, a malformed or refused reply, a timeout)."""


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        data = label.encode("ascii")
        if not 0 < len(data) < 64:
            raise ResolveError(f"{name!r} is not a domain name")
        out += bytes([len(data)]) + data
    return out + b"\x00"


def build_query(name: str, qtype: int, ident: int) -> bytes:
    header = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)  # recursion desired, one question
    return header + encode_name(name) + struct.pack("!HH", qtype, 1)


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    """The name at `offset` and the offset after it; pointers must point strictly backwards."""
    labels: list[str] = []
    end = None
    position = offset
    hops = 0
    while True:
        if position >= len(data):
            raise ResolveError("the reply ends inside a name")
        length = data[position]
        if length & 0xC0 == 0xC0:
            if position + 1 >= len(data):
                raise ResolveError("the reply ends inside a name pointer")
            target = ((length & 0x3F) << 8) | data[position + 1]
            if end is None:
                end = position + 2
            if target >= position or hops > 32:
                raise ResolveError("a name pointer in the reply loops")
            position, hops = target, hops + 1
            continue
        if length & 0xC0:
            raise ResolveError("the reply uses an unknown label type")
        position += 1
        if length == 0:
            break
        if position + length > len(data):
            raise ResolveError("the reply ends inside a label")
        labels.append(data[position : position + length].decode("ascii", "replace").lower())
        position += length
        if len(labels) > 127:
            raise ResolveError("a name in the reply is too long")
    return ".".join(labels), end if end is not None else position


def parse_reply(data: bytes, ident: int, name: str, qtype: int) -> list[IPAddress]:
    """The addresses of type `qtype` a reply gives for `name` (following CNAMEs within the reply)."""
    if len(data) < 12 or len(data) > MAX_REPLY:
        raise ResolveError("the reply is not a DNS message")
    rid, flags, qdcount, ancount, _, _ = struct.unpack("!HHHHHH", data[:12])
    if rid != ident or not flags & 0x8000:
        raise ResolveError("the reply does not answer the query")
    if flags & 0x0200:
        raise ResolveError("the reply was truncated")
    rcode = flags & 0xF
    if rcode == 3:
        raise ResolveError("no such name")
    if rcode != 0:
        raise ResolveError(f"the name server answered with error code {rcode}")
    if qdcount != 1:
        raise ResolveError("the reply does not repeat the question")
    qname, offset = _read_name(data, 12)
    if offset + 4 > len(data) or qname != name.rstrip(".").lower():
        raise ResolveError("the reply answers another question")
    if struct.unpack("!HH", data[offset : offset + 4]) != (qtype, 1):
        raise ResolveError("the reply answers another question")
    offset += 4
    wanted = {qname}
    found: list[IPAddress] = []
    for _ in range(min(ancount, 64)):
        rname, offset = _read_name(data, offset)
        if offset + 10 > len(data):
            raise ResolveError("the reply ends inside a record")
        rtype, rclass, _ttl, rdlength = struct.unpack("!HHIH", data[offset : offset + 10])
        offset += 10
        if offset + rdlength > len(data):
            raise ResolveError("the reply ends inside a record")
        rdata = data[offset : offset + rdlength]
        if rclass == 1 and rname in wanted:
            if rtype == TYPE_CNAME:
                wanted.add(_read_name(data, offset)[0])
            elif rtype == qtype == TYPE_A and rdlength == 4:
                found.append(ipaddress.IPv4Address(rdata))
            elif rtype == qtype == TYPE_AAAA and rdlength == 16:
                found.append(ipaddress.IPv6Address(rdata))
        offset += rdlength
        if len(found) >= MAX_ANSWERS:
            break
    return found


class _Query(asyncio.DatagramProtocol):
    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if (str(addr[0]), int(addr[1])) == self.server and not self.reply.done():
            self.reply.set_result(data[: MAX_REPLY + 1])

    def error_received(self, exc: Exception) -> None:
        if not self.reply.done():
            self.reply.set_exception(ResolveError(f"the name server cannot be reached ({exc})"))


async def query(
    server: tuple[str, int], name: str, qtype: int, timeout: float = QUERY_TIMEOUT
) -> list[IPAddress]:
    """One query to one server: its addresses, or `ResolveError`."""
    loop = asyncio.get_running_loop()
    ident = secrets.randbits(16)
    family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: _Query(server), remote_addr=server, family=family
    )
    try:
        transport.sendto(build_query(name, qtype, ident))
        try:
            data = await asyncio.wait_for(protocol.reply, timeout)
        except TimeoutError:
            raise ResolveError(f"the name server {server[0]} did not answer") from None
        return parse_reply(data, ident, name, qtype)
    finally:
        transport.close()


async def resolve(name: str, servers: Sequence[tuple[str, int]] | None) -> list[IPAddress]:
    """The IPv4 then IPv6 addresses of `name`: from `servers`, or the system's resolver when None."""
    if servers is None:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), QUERY_TIMEOUT * 3
            )
        except (OSError, TimeoutError) as exc:
            raise ResolveError(f"{name} cannot be resolved ({exc})") from None
        seen: list[IPAddress] = []
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            if address not in seen:
                seen.append(address)
        return sorted(seen, key=lambda a: a.version)[:MAX_ANSWERS]
    problem: ResolveError | None = None
    for server in servers:
        results = await asyncio.gather(
            query(server, name, TYPE_A), query(server, name, TYPE_AAAA), return_exceptions=True
        )
        addresses: list[IPAddress] = []
        for outcome in results:
            if isinstance(outcome, list):
                addresses += outcome
            elif isinstance(outcome, ResolveError):
                problem = outcome
            elif isinstance(outcome, BaseException):
                problem = ResolveError(f"{type(outcome).__name__}: {outcome}")
        if addresses:
            return addresses[:MAX_ANSWERS]
    raise problem or ResolveError(f"{name} has no address")
