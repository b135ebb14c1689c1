"""Secrets at egress, the gateway's side (standard library only): TLS terminated for the hosts that
carry secrets, and the request head rewritten with the secret's headers.

The gateway decides to intercept on the destination it connects to itself (the host and port of the
``CONNECT`` or SOCKS5 request, resolved and checked by the rules), never on an SNI or ``Host`` the
code wrote: an SNI naming another host fails the handshake, a ``Host`` naming another host is
answered 421, and the upstream's certificate must verify for the host (`upstream_context`) before the
code gets its ``200``. One request per intercepted connection (``Connection: close`` upstream): what
follows it on the same connection goes to the same verified host, never with a secret added twice.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from typing import Any

MAX_SECRETS = 64
MAX_HEADERS = 32
MAX_VALUE = 8 * 1024
MAX_CERTIFICATE = 64 * 1024

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_HOST = re.compile(r"[a-z0-9_.-]{1,253}")
HOP_BY_HOP = frozenset(
    {b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization", b"te", b"trailer", b"upgrade"}
)


class SecretError(ValueError):
    """A secret in a control message the gateway cannot use (the message never holds its value)."""


@dataclass(frozen=True)
class Intercept:
    """One secret host of a session: the headers to add and the TLS context presented to the code."""

    host: str
    port: int
    headers: tuple[tuple[bytes, bytes], ...]
    context: ssl.SSLContext

    @property
    def authority(self) -> str:
        return self.host if self.port == 443 else f"{self.host}:{self.port}"


def server_context(host: str, chain_pem: str) -> ssl.SSLContext:
    """A TLS server context with the session CA's certificate for `host`; an SNI naming anything
    else fails the handshake (``unrecognized_name``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])  # one request head to rewrite, not HTTP/2 frames
    fd = os.memfd_create("kodeagent-egress-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, chain_pem.encode("ascii"))
        context.load_cert_chain(f"/proc/self/fd/{fd}")  # the stdlib loads a chain from a path only
    finally:
        os.close(fd)

    def check_sni(connection: Any, name: str | None, _context: ssl.SSLContext) -> int | None:
        if name is not None and name.lower().rstrip(".") != host:
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        return None

    context.sni_callback = check_sni
    return context


def upstream_context(cafile: str | None) -> ssl.SSLContext:
    """The context the gateway verifies upstream servers with: the system's authorities, or `cafile`
    (a test's authority for the fake internet). Made before the switch to ``nobody``."""
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    return context


def parse_secrets(items: Any) -> dict[tuple[str, int], Intercept]:
    """The secrets of an ``attach`` or ``policy`` message, each with its leaf certificate."""
    if not isinstance(items, list) or len(items) > MAX_SECRETS:
        raise SecretError(f"secrets are a list of at most {MAX_SECRETS}")
    found: dict[tuple[str, int], Intercept] = {}
    for item in items:
        if not isinstance(item, dict):
            raise SecretError("a secret is an object")
        host, port, pairs, chain = (
            item.get("host"),
            item.get("port"),
            item.get("headers"),
            item.get("certificate"),
        )
        if not (isinstance(host, str) and _HOST.fullmatch(host)) or not (
            isinstance(port, int) and 0 < port < 65536
        ):
            raise SecretError("a secret names a host name and a port")
        if not isinstance(chain, str) or len(chain) > MAX_CERTIFICATE:
            raise SecretError(f"the secret for {host} has no certificate")
        if not isinstance(pairs, list) or not 0 < len(pairs) <= MAX_HEADERS:
            raise SecretError(f"the secret for {host} needs 1 to {MAX_HEADERS} headers")
        headers = []
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise SecretError(f"a header of the secret for {host} is not [name, value]")
            name, value = pair
            if not _TOKEN.fullmatch(name) or len(value) > MAX_VALUE or _BAD_VALUE.search(value):
                raise SecretError(f"a header of the secret for {host} is not a valid header")  # no value
            headers.append((name.encode("ascii"), value.encode("latin-1", "replace")))
        try:
            context = server_context(host, chain)
        except (OSError, ssl.SSLError) as exc:
            raise SecretError(f"the certificate for {host} does not load ({type(exc).__name__})") from None
        found[(host, port)] = Intercept(host, port, tuple(headers), context)
    return found


def host_matches(intercept: Intercept, headers: list[tuple[bytes, bytes]]) -> bool:
    """True when the request's ``Host`` headers (none, or one) name the intercepted host."""
    hosts = [value for name, value in headers if name.lower() == b"host"]
    if not hosts:
        return True
    if len(hosts) > 1:
        return False
    written = hosts[0].decode("latin-1").lower()
    accepted = {intercept.host, f"{intercept.host}:{intercept.port}", f"{intercept.host}.:{intercept.port}"}
    if intercept.port == 443:
        accepted.add(f"{intercept.host}.")
    return written in accepted


def rewrite_head(
    intercept: Intercept, method: str, target: str, version: str, headers: list[tuple[bytes, bytes]]
) -> bytes:
    """The request head sent to the verified host: its own ``Host``, the code's headers without
    hop-by-hop ones and without any the secret sets (replaced, never duplicated), then the secret's,
    and ``Connection: close``."""
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    replaced = {name.lower() for name, _ in intercept.headers}
    lines = [f"{method} {target} {version}".encode("ascii"), b"Host: " + intercept.authority.encode("ascii")]
    for name, value in headers:
        lower = name.lower()
        if lower == b"host" or lower in HOP_BY_HOP or lower in named or lower in replaced:
            continue
        lines.append(name + b": " + value)
    lines.extend(name + b": " + value for name, value in intercept.headers)
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"
