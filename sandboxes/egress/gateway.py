"""The gateway process: HTTP CONNECT, plain-HTTP forwarding and SOCKS5 for every network-on session.

Started by `service.py` as ``python -I -S -c BOOTSTRAP SETTINGS_JSON CONTROL_FD`` (standard library
only). It enters the outbound network namespace it is given (the host's by default; a test's fake
internet), drops root for ``nobody`` with no new privileges and no core dumps, and then serves:

- the control channel (a ``SOCK_SEQPACKET`` socket to the parent, who is trusted): ``attach`` hands
  over a session's listening socket (made by the parent inside the session's namespace) and its
  rules; ``policy`` replaces the rules (the next connection uses them); ``report`` returns and
  forgets the connections seen since the last one; ``detach`` closes the listener and every
  connection of that session;
- each session's listener: hostile traffic from the sandbox. Everything is bounded: the request
  head (bytes, lines, the time it may take to arrive: slowloris), concurrent connections per session
  and in all, bytes per second per session (a token bucket over both directions), idle time of a
  tunnel, connection set-up time. A refusal answers at once: HTTP 403 (SOCKS5 reply 2) with the
  rule's name, never a timeout.

Nothing the code sends decides where the gateway connects but the destination it names, checked
by `match.decide` on the address the gateway's own resolver returned. For a session's secret hosts
(`intercept.py`) a tunnel is terminated: the upstream verified first, the code's TLS ended with the
session CA's certificate, one request head rewritten with the secret's headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import json
import os
import re
import resource
import socket
import ssl
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from . import dns
from .intercept import Intercept, host_matches, parse_secrets, rewrite_head, upstream_context
from .match import IPAddress, IPNetwork, Rule, Verdict, decide, literal, normal_host, parse_rules

CONTROL_MAX = 1 << 20
HEAD_BYTES = 16 * 1024
HEAD_LINES = 100
HEAD_SECONDS = 10.0
CONNECT_SECONDS = 10.0
IDLE_SECONDS = 300.0
MAX_CONNECTIONS = 64
MAX_ALL_CONNECTIONS = 1024
RATE_BYTES = 128 * 1024 * 1024
REPORT_ENTRIES = 256
CHUNK = 64 * 1024
LOCAL_REFRESH = 2.0

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_METHOD = re.compile(r"[A-Z]{1,20}")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
        b"host",
    }
)


# ---------------------------------------------------------------------- settings and session state


@dataclass
class Limits:
    """Per-session bounds (the parent may set them at attach)."""

    max_connections: int = MAX_CONNECTIONS
    head_bytes: int = HEAD_BYTES
    head_seconds: float = HEAD_SECONDS
    connect_seconds: float = CONNECT_SECONDS
    idle_seconds: float = IDLE_SECONDS
    rate_bytes: int = RATE_BYTES
    report_entries: int = REPORT_ENTRIES

    @classmethod
    def from_json(cls, data: Any) -> Limits:
        limits = cls()
        if isinstance(data, dict):
            for name in limits.__dataclass_fields__:
                value = data.get(name)
                if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                    setattr(limits, name, type(getattr(limits, name))(value))
        return limits


class Bucket:
    """A token bucket: `take(n)` waits until `n` bytes fit the rate (a quarter second of burst)."""

    def __init__(self, rate: int) -> None:
        self.rate = float(rate)
        self.tokens = self.rate / 4
        self.stamp = time.monotonic()

    async def take(self, count: int) -> None:
        now = time.monotonic()
        self.tokens = min(self.rate / 4, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= count
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


@dataclass
class Entry:
    """One connection in the report."""

    host: str
    port: int
    protocol: str
    address: str | None = None
    allowed: bool = False
    rule: str = ""
    reason: str = ""
    sent: int = 0
    received: int = 0
    done: bool = False
    secret: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "protocol": self.protocol,
            "address": self.address,
            "allowed": self.allowed,
            "rule": self.rule,
            "reason": self.reason,
            "bytes_sent": self.sent,
            "bytes_received": self.received,
            "open": not self.done,
            "secret": self.secret,
        }


@dataclass
class SessionState:
    ident: int
    allow: tuple[Rule, ...]
    deny: tuple[Rule, ...]
    limits: Limits
    off: bool
    bucket: Bucket
    secrets: dict[tuple[str, int], Intercept] = field(default_factory=dict)
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    entries: list[Entry] = field(default_factory=list)
    omitted: int = 0

    def record(self, entry: Entry) -> Entry:
        if len(self.entries) < self.limits.report_entries:
            self.entries.append(entry)
        else:
            self.omitted += 1
        return entry


class Refused(Exception):
    """A connection the rules (or a bound) refuse; `verdict` names the rule."""

    def __init__(self, verdict: Verdict, status: int = 403) -> None:
        super().__init__(verdict.reason or verdict.rule)
        self.verdict = verdict
        self.status = status


class BadRequest(Exception):
    """The client's request is not one the gateway speaks; answered with 400 and closed."""


class Gateway:
    """Every session's listener and the rules they are checked against, in one event loop."""

    def __init__(
        self,
        nameservers: list[tuple[str, int]] | None,
        extra_public: list[IPNetwork],
        upstream_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.nameservers = nameservers
        self.extra_public = extra_public
        self.upstream_tls = upstream_tls or upstream_context(None)
        self.sessions: dict[int, SessionState] = {}
        self.open_connections = 0
        self._local: frozenset[IPAddress] = frozenset()
        self._local_stamp = 0.0

    # ------------------------------------------------------------------ control

    async def control(self, message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        op = message.get("op")
        ident = message.get("id")
        if not isinstance(ident, int):
            raise ValueError("a control message needs an integer id")
        if op == "attach":
            if len(fds) != 1 or ident in self.sessions:
                raise ValueError("attach takes one listening socket for a new id")
            allow, deny = self._rules(message)
            secrets = parse_secrets(message.get("secrets", []))
            limits = Limits.from_json(message.get("limits"))
            new = SessionState(
                ident, allow, deny, limits, message.get("off") is True, Bucket(limits.rate_bytes), secrets
            )
            listener = socket.socket(fileno=fds.pop())
            listener.setblocking(False)
            self.sessions[ident] = new
            new.server = await asyncio.start_server(
                lambda r, w: self._accepted(new, r, w), sock=listener, limit=limits.head_bytes
            )
            return {"ok": True}
        found = self.sessions.get(ident)
        if found is None:
            return {"ok": False, "error": f"no session {ident}"}
        state = found
        if op == "policy":
            state.allow, state.deny = self._rules(message)
            state.secrets = parse_secrets(message.get("secrets", []))
            state.off = message.get("off") is True
            return {"ok": True}
        if op == "report":
            done = [e for e in state.entries]
            omitted, state.entries, state.omitted = state.omitted, [], 0
            return {"ok": True, "connections": [e.as_json() for e in done], "omitted": omitted}
        if op == "detach":
            del self.sessions[ident]
            if state.server is not None:
                state.server.close()
            for task in list(state.tasks):
                task.cancel()
            return {"ok": True}
        raise ValueError(f"unknown control operation {op!r}")

    @staticmethod
    def _rules(message: dict[str, Any]) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
        allow, deny = message.get("allow", []), message.get("deny", [])
        if not (isinstance(allow, list) and isinstance(deny, list)):
            raise ValueError("allow and deny are lists of rules")
        return parse_rules(allow), parse_rules(deny)

    # ------------------------------------------------------------------ the rules on a destination

    def local_addresses(self) -> frozenset[IPAddress]:
        """This machine's own addresses (in the outbound namespace), read again every few seconds."""
        now = time.monotonic()
        if now - self._local_stamp > LOCAL_REFRESH:
            self._local, self._local_stamp = read_local_addresses(), now
        return self._local

    def verdict(self, state: SessionState, host: str, address: IPAddress | None, port: int) -> Verdict:
        if state.off:
            return Verdict(False, "network-off", "the session's network was turned off (set_network)")
        return decide(host, address, port, state.allow, state.deny, self.local_addresses(), self.extra_public)

    async def open_upstream(
        self, state: SessionState, entry: Entry
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Resolve, check each address, connect to the first allowed one; `Refused` names the rule."""
        host = normal_host(entry.host)
        if host is None or not 0 < entry.port < 65536:
            raise Refused(
                Verdict(False, "invalid-destination", f"{entry.host!r} is not a host name or address"), 400
            )
        entry.host = host
        written = literal(host)
        if host == "localhost" or host.endswith(".localhost"):  # RFC 6761: loopback, never asked of DNS
            written = ipaddress.IPv4Address("127.0.0.1")
        entry.address = None if written is None else str(written)
        first = self.verdict(state, host, written, entry.port)
        if not first.allowed:
            raise Refused(first)
        if written is not None:
            addresses: list[IPAddress] = [written]
        else:
            try:
                addresses = await dns.resolve(host, self.nameservers)
            except dns.ResolveError as exc:
                raise Refused(
                    Verdict(False, "unresolvable", f"{host} cannot be resolved: {exc}"), 502
                ) from None
        candidates: list[tuple[IPAddress, Verdict]] = []
        refusal: Verdict | None = None
        for address in addresses:
            verdict = self.verdict(state, host, address, entry.port)
            if verdict.allowed:
                candidates.append((address, verdict))
            elif refusal is None:
                refusal = verdict
        if not candidates:
            assert refusal is not None
            entry.address = str(addresses[0])
            raise Refused(refusal)
        deadline = time.monotonic() + state.limits.connect_seconds
        problem = ""
        for address, verdict in candidates:
            entry.address, entry.rule = str(address), verdict.rule
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(str(address), entry.port, limit=CHUNK),
                    max(0.1, deadline - time.monotonic()),
                )
            except (OSError, TimeoutError) as exc:
                problem = str(exc) or type(exc).__name__
        raise Refused(Verdict(False, "unreachable", f"{host} port {entry.port}: {problem}"), 502)

    # ------------------------------------------------------------------ one client connection

    def _accepted(
        self, state: SessionState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(state, reader, writer))
        state.tasks.add(task)
        task.add_done_callback(state.tasks.discard)

    async def _serve(
        self, state: SessionState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        over = len(state.tasks) > state.limits.max_connections or self.open_connections >= MAX_ALL_CONNECTIONS
        self.open_connections += 1
        try:
            if over:
                entry = state.record(Entry("", 0, "unknown", rule="connection-limit"))
                entry.reason = f"more than {state.limits.max_connections} connections at once"
                entry.done = True
                writer.write(_http_answer(503, entry.rule, entry.reason))
                return
            try:
                first = await asyncio.wait_for(reader.readexactly(1), state.limits.head_seconds)
            except (asyncio.IncompleteReadError, TimeoutError):
                return
            if first == b"\x05":
                await self._socks(state, reader, writer)
            else:
                await self._http(state, first, reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # never let one connection end the gateway
            print(f"egress gateway: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            self.open_connections -= 1
            writer.close()

    async def _http(
        self, state: SessionState, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            head = first + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), state.limits.head_seconds)
        except (asyncio.LimitOverrunError, ValueError):
            writer.write(
                _http_answer(
                    431, "head-too-large", f"the request head is over {state.limits.head_bytes} bytes"
                )
            )
            return
        except (asyncio.IncompleteReadError, TimeoutError):
            writer.write(_http_answer(408, "head-timeout", "the request head did not arrive in time"))
            return
        try:
            method, target, version, headers = parse_head(head)
            if method == "CONNECT":
                host, port = split_authority(target, None)
                path = ""
            else:
                host, port, path = split_url(target)
        except BadRequest as exc:
            writer.write(_http_answer(400, "bad-request", str(exc)))
            return
        entry = state.record(Entry(host, port, "connect" if method == "CONNECT" else "http"))
        try:
            named = normal_host(host)
            if method != "CONNECT" and any(named == secret_host for secret_host, _ in state.secrets):
                entry.host = named or host
                entry.rule = "secret-needs-https"
                entry.reason = (
                    f"{named} carries a secret, which the gateway adds over HTTPS only (to a server whose "
                    "certificate it verified); plain HTTP would hand it to whoever answers: use https://"
                )
                writer.write(_http_answer(403, entry.rule, entry.reason))
                return
            try:
                up_reader, up_writer = await self.open_upstream(state, entry)
            except Refused as exc:
                entry.rule, entry.reason = exc.verdict.rule, exc.verdict.reason
                writer.write(_http_answer(exc.status, exc.verdict.rule, exc.verdict.reason))
                return
            entry.allowed = True
            try:
                intercept = state.secrets.get((entry.host, entry.port)) if method == "CONNECT" else None
                if intercept is not None:
                    await self._intercept(
                        state,
                        entry,
                        intercept,
                        (reader, writer),
                        (up_reader, up_writer),
                        b"HTTP/1.1 200 Connection established\r\n\r\n",
                        lambda rule, reason: _http_answer(502, rule, reason),
                    )
                    return
                if method == "CONNECT":
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    forwarded = forward_head(method, path, version, host, port, headers)
                    entry.sent += len(forwarded)  # the relay counts only what follows the head
                    up_writer.write(forwarded)
                await self._relay(state, entry, reader, writer, up_reader, up_writer)
            finally:
                up_writer.close()
        finally:
            entry.done = True

    async def _socks(
        self, state: SessionState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """SOCKS5 (RFC 1928): no authentication, CONNECT only; names resolved here (socks5h)."""
        seconds = state.limits.head_seconds

        async def exactly(count: int) -> bytes:
            return await asyncio.wait_for(reader.readexactly(count), seconds)

        try:
            methods = await exactly((await exactly(1))[0])
            if 0 not in methods:
                writer.write(b"\x05\xff")
                return
            writer.write(b"\x05\x00")
            version, command, _, kind = await exactly(4)
            if kind == 1:
                host = str(ipaddress.IPv4Address(await exactly(4)))
            elif kind == 4:
                host = str(ipaddress.IPv6Address(await exactly(16)))
            elif kind == 3:
                host = (await exactly((await exactly(1))[0])).decode("ascii", "replace")
            else:
                writer.write(_socks_reply(8))
                return
            port = struct.unpack("!H", await exactly(2))[0]
        except (asyncio.IncompleteReadError, TimeoutError):
            return
        if version != 5 or command != 1:
            writer.write(_socks_reply(7))
            return
        entry = state.record(Entry(host, port, "socks5"))
        try:
            try:
                up_reader, up_writer = await self.open_upstream(state, entry)
            except Refused as exc:
                entry.rule, entry.reason = exc.verdict.rule, exc.verdict.reason
                writer.write(_socks_reply(2 if exc.status == 403 else 4))
                return
            entry.allowed = True
            try:
                intercept = state.secrets.get((entry.host, entry.port))
                if intercept is not None:
                    await self._intercept(
                        state,
                        entry,
                        intercept,
                        (reader, writer),
                        (up_reader, up_writer),
                        _socks_reply(0),
                        lambda rule, reason: _socks_reply(1),
                    )
                    return
                writer.write(_socks_reply(0))
                await self._relay(state, entry, reader, writer, up_reader, up_writer)
            finally:
                up_writer.close()
        finally:
            entry.done = True

    async def _intercept(
        self,
        state: SessionState,
        entry: Entry,
        intercept: Intercept,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        established: bytes,
        failed: Callable[[str, str], bytes],
    ) -> None:
        """A tunnel to a secret host: TLS to the upstream verified for the host first, then TLS with
        the code (the session CA's certificate for the host), then one request head read (bounded),
        checked and rewritten with the secret's headers; the rest is relayed as it is."""
        reader, writer = client
        up_reader, up_writer = upstream
        seconds = state.limits.head_seconds
        try:
            await asyncio.wait_for(
                up_writer.start_tls(self.upstream_tls, server_hostname=intercept.host),
                state.limits.connect_seconds,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            entry.allowed, entry.rule = False, "upstream-unverified"
            entry.reason = f"TLS to {intercept.host} port {intercept.port} did not verify: {str(exc)[:300]}"
            writer.write(failed(entry.rule, entry.reason))
            return
        writer.write(established)
        try:
            await asyncio.wait_for(
                writer.start_tls(intercept.context, ssl_handshake_timeout=seconds), seconds
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            entry.rule = "tls-handshake"
            entry.reason = f"the code's TLS handshake for {intercept.host} failed: {str(exc)[:300]}"
            return
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), seconds)
        except (asyncio.LimitOverrunError, ValueError):
            entry.rule, entry.reason = (
                "head-too-large",
                f"the request head is over {state.limits.head_bytes} bytes",
            )
            writer.write(_http_answer(431, entry.rule, entry.reason))
            return
        except TimeoutError:
            entry.rule, entry.reason = "head-timeout", "the request head did not arrive in time"
            writer.write(_http_answer(408, entry.rule, entry.reason))
            return
        except asyncio.IncompleteReadError:
            return
        try:
            method, target, version, headers = parse_head(head)
            if method == "CONNECT" or not (target.startswith("/") or (target == "*" and method == "OPTIONS")):
                raise BadRequest("send origin-form requests ('GET /path HTTP/1.1') to an intercepted host")
        except BadRequest as exc:
            entry.rule, entry.reason = "bad-request", str(exc)
            writer.write(_http_answer(400, entry.rule, entry.reason))
            return
        if not host_matches(intercept, headers):
            entry.rule = "host-mismatch"
            entry.reason = (
                f"the request's Host is not {intercept.authority}, the host this connection reached"
            )
            writer.write(_http_answer(421, entry.rule, entry.reason))
            return
        entry.secret = True
        entry.sent += len(head)
        up_writer.write(rewrite_head(intercept, method, target, version, headers))
        await self._relay(state, entry, reader, writer, up_reader, up_writer)

    async def _relay(
        self,
        state: SessionState,
        entry: Entry,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        """Copy both ways until both ends are done or the tunnel idles past the bound."""
        last = [time.monotonic()]
        idle = state.limits.idle_seconds

        async def pump(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, count: Callable[[int], None]
        ) -> None:
            while True:
                try:
                    data = await asyncio.wait_for(source.read(CHUNK), idle)
                except TimeoutError:
                    if time.monotonic() - last[0] < idle:
                        continue
                    raise
                if not data:
                    break
                last[0] = time.monotonic()
                await state.bucket.take(len(data))
                sink.write(data)
                count(len(data))
                await sink.drain()
            if sink.can_write_eof():
                with contextlib.suppress(OSError):
                    sink.write_eof()
            else:  # TLS (an intercepted tunnel) has no half-close: the close tells the other end
                sink.close()

        def sent(n: int) -> None:
            entry.sent += n

        def received(n: int) -> None:
            entry.received += n

        up = asyncio.ensure_future(pump(reader, up_writer, sent))
        down = asyncio.ensure_future(pump(up_reader, writer, received))
        try:
            await _both(up, down)
        finally:
            up.cancel()
            down.cancel()


async def _both(first: Awaitable[None], second: Awaitable[None]) -> None:
    """Wait for both; the first failure (a reset, the idle bound) ends both."""
    done, pending = await asyncio.wait(
        [asyncio.ensure_future(first), asyncio.ensure_future(second)], return_when=asyncio.FIRST_EXCEPTION
    )
    for task in done:
        if task.exception() is not None:
            for other in pending:
                other.cancel()
            return
    if pending:
        await asyncio.wait(pending)


# ---------------------------------------------------------------------- parsing


def parse_head(head: bytes) -> tuple[str, str, str, list[tuple[bytes, bytes]]]:
    """The request line and headers of an HTTP/1.x request head (ending in CRLF CRLF)."""
    lines = head[:-4].split(b"\r\n")
    if len(lines) > HEAD_LINES:
        raise BadRequest(f"the request has more than {HEAD_LINES} header lines")
    try:
        request_line = lines[0].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("the request line is not ASCII") from None
    parts = request_line.split(" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]) or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest("the request line is not 'METHOD TARGET HTTP/1.x'")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadRequest("a header line is not 'Name: value'")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise BadRequest("a header value holds control characters")
        headers.append((name, value))
    return parts[0], parts[1], parts[2], headers


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (the port may be left out where there is a default)."""
    if "@" in authority or not authority or len(authority) > 300:
        raise BadRequest("the destination must be host:port")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise BadRequest("an IPv6 destination needs its closing ']'")
        host, rest = authority[1:end], authority[end + 1 :]
    else:
        host, sep, port_text = authority.rpartition(":")
        if not sep:
            host, rest = authority, ""
        else:
            rest = ":" + port_text
    if not rest:
        if default_port is None:
            raise BadRequest("the destination needs a port")
        return host, default_port
    if not rest.startswith(":") or not rest[1:].isdigit() or len(rest) > 6:
        raise BadRequest("the destination's port is not a number")
    port = int(rest[1:])
    if not 0 < port < 65536:
        raise BadRequest("the destination's port is out of range")
    return host, port


def split_url(target: str) -> tuple[str, int, str]:
    """Host, port and origin-form path of an absolute ``http://`` request target."""
    if target[:7].lower() != "http://":
        if target[:8].lower() == "https://":
            raise BadRequest("send https:// requests through CONNECT (an HTTPS_PROXY does)")
        raise BadRequest("a proxy request names an absolute http:// URL")
    rest = target[7:]
    cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0], default=len(rest))
    host, port = split_authority(rest[:cut], 80)
    path = rest[cut:] or "/"
    if not path.startswith("/"):
        path = "/" + path
    return host, port, path


def forward_head(
    method: str, path: str, version: str, host: str, port: int, headers: list[tuple[bytes, bytes]]
) -> bytes:
    """The request head sent upstream: origin-form, the URL's own Host, hop-by-hop headers gone."""
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    shown = f"[{host}]" if ":" in host else host
    lines = [
        f"{method} {path} {version}".encode(),
        b"Host: " + (shown if port == 80 else f"{shown}:{port}").encode(),
    ]
    for name, value in headers:
        lower = name.lower()
        if lower not in HOP_BY_HOP and lower not in named:
            lines.append(name + b": " + value)
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _http_answer(status: int, rule: str, reason: str) -> bytes:
    titles = {
        400: "Bad Request",
        403: "Forbidden",
        408: "Request Timeout",
        421: "Misdirected Request",
        431: "Request Header Fields Too Large",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }
    body = json.dumps({"refused_by": rule, "reason": reason}).encode() + b"\n"
    clean = rule.encode("ascii", "replace").replace(b"\r", b"").replace(b"\n", b"")
    return (
        f"HTTP/1.1 {status} {titles.get(status, 'Error')}\r\n".encode()
        + b"X-Kodeagent-Egress-Rule: "
        + clean
        + b"\r\n"
        + b"Content-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])


# ---------------------------------------------------------------------- this machine's addresses


def read_local_addresses() -> frozenset[IPAddress]:
    """Every address of this network namespace's interfaces (``/proc/net``: IPv4 LOCAL routes of the
    FIB, and ``if_inet6``)."""
    found: set[IPAddress] = set()
    with contextlib.suppress(OSError):
        with open("/proc/net/fib_trie", encoding="ascii", errors="replace") as trie:
            previous = ""
            for line in trie:
                stripped = line.strip()
                if stripped.startswith("/32 host LOCAL") and previous.startswith("|--"):
                    with contextlib.suppress(ValueError):
                        found.add(ipaddress.IPv4Address(previous[3:].strip()))
                previous = stripped
    with contextlib.suppress(OSError):
        with open("/proc/net/if_inet6", encoding="ascii", errors="replace") as inet6:
            for line in inet6:
                text = line.split(" ", 1)[0]
                if len(text) == 32:
                    with contextlib.suppress(ValueError):
                        found.add(ipaddress.IPv6Address(int(text, 16)))
    return frozenset(found)


# ---------------------------------------------------------------------- the process


CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE = 38, 4
NOBODY = 65534


def enter_netns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def preload() -> None:
    """Import what is otherwise loaded lazily: after the switch to ``nobody`` the interpreter's own
    files may be unreadable (an installation under /root)."""
    import concurrent.futures.thread  # noqa: F401 - asyncio's getaddrinfo executor
    import encodings.ascii  # noqa: F401
    import encodings.idna  # noqa: F401
    import encodings.latin_1  # noqa: F401
    import encodings.utf_8  # noqa: F401

    for codec in ("ascii", "utf-8", "latin-1", "idna"):
        "x".encode(codec).decode(codec)


def drop_privileges() -> None:
    """Root gives way to ``nobody``; no new privileges, no core dumps, no ptrace by that user."""
    preload()
    libc = ctypes.CDLL(None, use_errno=True)
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


async def serve(control: socket.socket, gateway: Gateway) -> None:
    """Answer the parent's control messages until it closes the channel."""
    loop = asyncio.get_running_loop()
    control.setblocking(False)
    while True:
        readable = loop.create_future()
        loop.add_reader(control.fileno(), readable.set_result, None)
        try:
            await readable
        finally:
            loop.remove_reader(control.fileno())
        try:
            data, fds, _, _ = socket.recv_fds(control, CONTROL_MAX, 4)
        except BlockingIOError:
            continue
        if not data:
            return
        try:
            reply = await gateway.control(json.loads(data), fds)
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        control.setblocking(True)
        control.sendall(json.dumps(reply).encode())
        control.setblocking(False)


def main(argv: list[str]) -> None:
    settings = json.loads(argv[0])
    control = socket.socket(fileno=int(argv[1]))
    if settings.get("netns"):
        enter_netns(settings["netns"])
    upstream_tls = upstream_context(settings.get("upstream_ca"))  # its files may be root's alone
    drop_privileges()
    servers = settings.get("nameservers")
    nameservers = None if servers is None else [(str(h), int(p)) for h, p in servers]
    extra = [ipaddress.ip_network(n) for n in settings.get("extra_public", [])]
    gateway = Gateway(nameservers, extra, upstream_tls)
    control.sendall(json.dumps({"ok": True, "pid": os.getpid(), "uid": os.getuid()}).encode())
    asyncio.run(serve(control, gateway))


if __name__ == "__main__":  # pragma: no cover - started through service.BOOTSTRAP
    main(sys.argv[1:])
