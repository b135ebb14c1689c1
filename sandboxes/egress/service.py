"""The parent's side of the egress gateway: the gateway process, and each session's link to it.

One gateway process serves every network-on session of this Python process (started on the first
`attach`, again if it died). For a session, `attach(netns)` makes a listening socket *inside* the
session's network namespace (a short-lived thread enters it with ``setns``, binds
``127.0.0.1:3128`` there and comes back), hands it to the gateway over the control channel
(``SCM_RIGHTS``) and closes its own copy: the sandbox can then reach that one socket and nothing
else, and the gateway can reach the sandbox through nothing but it.

Entering another network namespace needs ``CAP_SYS_ADMIN`` over it; `unavailable()` says when
this host cannot, and what to do (the backends then refuse network-on sessions, never falling
back to the host's network).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

from ..errors import EgressUnavailable
from . import PROXY_PORT, PROXY_URL
from .policy import NetworkPolicy, NetworkReport

CLONE_NEWNET = 0x40000000
CONTROL_TIMEOUT = 10.0
REPLY_MAX = 1 << 20
_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)  # sandboxes/

BOOTSTRAP = (
    "import sys, types\n"
    "package = types.ModuleType('sandboxes')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['sandboxes'] = package\n"
    "from sandboxes.egress.gateway import main\n"
    "main(sys.argv[2:])\n"
)
"""Runs `gateway.main` without `sandboxes/__init__.py` (and so without pydantic or anyio)."""


@dataclass(frozen=True)
class GatewaySettings:
    """Where the gateway connects from and how it resolves names (the defaults: the host's network and
    the system's resolver). Tests point both at a fake internet in a namespace of their own.

    netns: a network namespace file (``/run/netns/NAME``, ``/proc/PID/ns/net``) the gateway's outbound
        connections and name lookups start from.
    nameservers: ``(address, port)`` of DNS servers the gateway asks itself (A and AAAA over UDP),
        instead of the system's resolver.
    extra_public: address ranges to treat as public (a test's "internet" addresses).
    head_seconds: how long a request head may take to arrive (default 10 s).
    """

    netns: str | None = None
    nameservers: tuple[tuple[str, int], ...] | None = None
    extra_public: tuple[str, ...] = field(default_factory=tuple)
    head_seconds: float | None = None


def proxy_environment() -> dict[str, str]:
    """What a network-on session's code sees, so that proxy-aware code (urllib, requests, httpx, pip,
    curl) goes through the gateway; its own loopback stays direct."""
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = env[name.lower()] = PROXY_URL
    socks = f"socks5h://127.0.0.1:{PROXY_PORT}"
    env["ALL_PROXY"] = env["all_proxy"] = socks
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    return env


def unavailable() -> str | None:
    """None when network-on sessions can have a gateway here; else why not and the fix."""
    if sys.platform != "linux":
        return "the egress gateway needs Linux network namespaces; use the e2b backend for network access"
    if os.geteuid() != 0:
        return (
            "the egress gateway puts its listener into each session's network namespace, which needs "
            "root (CAP_SYS_ADMIN) here; run the parent as root, or use the docker backend from a root "
            "parent, or the e2b backend"
        )
    return None


def namespace_of(pid: int) -> str:
    return f"/proc/{pid}/ns/net"


def same_namespace_as_ours(path: str) -> bool:
    """True when `path` is this process's own network namespace (a session must never get it)."""
    return os.stat(path).st_ino == os.stat("/proc/self/ns/net").st_ino


def listener_in(netns: str, port: int = PROXY_PORT) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:`port` inside the network namespace `netns` (a path).

    Made in a thread of its own, which alone enters the namespace (network namespaces are per
    thread) and leaves it again; the socket stays in the namespace it was made in."""
    made: list[socket.socket] = []
    problems: list[BaseException] = []

    def make() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(netns, os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"cannot enter the session's network namespace: {os.strerror(errno)}")
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    sock.bind(("127.0.0.1", port))
                    sock.listen(256)
                except BaseException:
                    sock.close()
                    raise
                made.append(sock)
            finally:
                if libc.setns(home, CLONE_NEWNET) != 0:  # the thread ends now either way
                    pass
        except BaseException as exc:
            problems.append(exc)
        finally:
            os.close(home)
            os.close(target)

    thread = threading.Thread(target=make, name="kodeagent-egress-listener")
    thread.start()
    thread.join()
    if problems:
        raise problems[0]
    return made[0]


class _GatewayProcess:
    """The gateway process and its control channel; one request at a time (a lock)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        payload = {
            "netns": settings.netns,
            "nameservers": None if settings.nameservers is None else [list(s) for s in settings.nameservers],
            "extra_public": list(settings.extra_public),
        }
        command = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            BOOTSTRAP,
            _PACKAGE_DIR,
            json.dumps(payload),
            str(theirs.fileno()),
        ]
        try:
            self.process = subprocess.Popen(
                command,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None if os.environ.get("KODEAGENT_EGRESS_DEBUG") else subprocess.DEVNULL,
                env={},
                start_new_session=True,
            )
        except OSError as exc:
            self.control.close()
            raise EgressUnavailable(f"the egress gateway could not start ({exc})") from exc
        finally:
            theirs.close()
        self.lock = threading.Lock()
        self.control.settimeout(CONTROL_TIMEOUT)
        try:
            hello = json.loads(self.control.recv(REPLY_MAX) or b"{}")
        except (OSError, ValueError) as exc:
            self.stop()
            raise EgressUnavailable(f"the egress gateway did not start ({exc})") from exc
        if not hello.get("ok"):
            self.stop()
            raise EgressUnavailable(
                "the egress gateway ended before it was ready (its outbound namespace "
                f"{settings.netns or 'the host'} may be unusable)"
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        with self.lock:
            try:
                socket.send_fds(self.control, [json.dumps(message).encode()], list(fds))
                data = self.control.recv(REPLY_MAX)
            except OSError as exc:
                raise EgressUnavailable(f"the egress gateway is gone ({exc})") from exc
        if not data:
            raise EgressUnavailable("the egress gateway is gone")
        reply = json.loads(data)
        if not isinstance(reply, dict):
            raise EgressUnavailable("the egress gateway answered nonsense")
        return reply

    def stop(self) -> None:
        self.control.close()
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


_SETTINGS = GatewaySettings()
_PROCESS: _GatewayProcess | None = None
_PROCESS_LOCK = threading.Lock()
_IDS = itertools.count(1)


def configure(settings: GatewaySettings) -> None:
    """Use `settings` for the gateway from now on; a running gateway is stopped (its sessions lose
    their network: their next connection has no listener)."""
    global _SETTINGS, _PROCESS
    with _PROCESS_LOCK:
        _SETTINGS = settings
        if _PROCESS is not None:
            _PROCESS.stop()
            _PROCESS = None


def settings() -> GatewaySettings:
    return _SETTINGS


def _gateway() -> _GatewayProcess:
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None or not _PROCESS.alive():
            if _PROCESS is not None:
                _PROCESS.stop()
            _PROCESS = _GatewayProcess(_SETTINGS)
        return _PROCESS


def _checked(reply: dict[str, Any], what: str) -> dict[str, Any]:
    if reply.get("ok") is not True:
        raise EgressUnavailable(f"the egress gateway refused to {what}: {str(reply.get('error'))[:500]}")
    return reply


class EgressLink:
    """One session's place in the gateway: its rules, changed live, and its connection report."""

    def __init__(self, process: _GatewayProcess, ident: int, policy: NetworkPolicy) -> None:
        self._process = process
        self.ident = ident
        self.policy: NetworkPolicy | None = policy
        self.closed = False

    async def set_policy(self, policy: NetworkPolicy | None) -> None:
        """New rules for the session's next connection (None: refuse every connection from now on)."""
        message = {"op": "policy", "id": self.ident, **(policy or NetworkPolicy()).gateway_message()}
        message["off"] = policy is None
        _checked(await anyio.to_thread.run_sync(self._process.request, message), "change the rules")
        self.policy = policy

    async def take_report(self) -> NetworkReport:
        """The connections since the last report (bounded, validated: the gateway parses hostile
        traffic, so its answers are checked like the sandbox's)."""
        try:
            reply = await anyio.to_thread.run_sync(self._process.request, {"op": "report", "id": self.ident})
            _checked(reply, "report")
            return NetworkReport.model_validate(
                {"connections": reply.get("connections"), "omitted": reply.get("omitted")}
            )
        except (EgressUnavailable, ValidationError, ValueError) as exc:
            return NetworkReport(error=f"the gateway's report is unavailable ({str(exc)[:300]})")

    async def close(self) -> None:
        """Close the session's listener and every connection it has open. Idempotent, never raises."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(self._process.request, {"op": "detach", "id": self.ident})
            except EgressUnavailable:
                pass


def attach_blocking(netns: str, policy: NetworkPolicy) -> EgressLink:
    """Give the session whose network namespace is `netns` its gateway (blocking)."""
    problem = unavailable()
    if problem is not None:
        raise EgressUnavailable(problem)
    if same_namespace_as_ours(netns):
        raise EgressUnavailable(
            "the session shares this machine's network namespace, so no gateway could contain it; "
            "the host backend needs its 'namespaces' isolation level (bubblewrap) for network=True"
        )
    process = _gateway()
    listener = listener_in(netns)
    ident = next(_IDS)
    try:
        message = {"op": "attach", "id": ident, **policy.gateway_message()}
        if _SETTINGS.head_seconds is not None:
            message["limits"]["head_seconds"] = _SETTINGS.head_seconds
        _checked(process.request(message, [listener.fileno()]), "take the session")
    finally:
        listener.close()
    return EgressLink(process, ident, policy)


async def attach(netns: str, policy: NetworkPolicy) -> EgressLink:
    """`attach_blocking` off the event loop."""
    return await anyio.to_thread.run_sync(attach_blocking, netns, policy)


def attach_process_blocking(pid: int, still_same: Callable[[], bool], policy: NetworkPolicy) -> EgressLink:
    """Give the session whose runner is host process `pid` its gateway, in that process's network
    namespace: the namespace is held open first, then `still_same()` proves the pid was not reused."""
    try:
        fd = os.open(namespace_of(pid), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise EgressUnavailable(f"the session's network namespace cannot be opened ({exc})") from exc
    try:
        if not still_same():
            raise EgressUnavailable("the session's runner ended before its gateway was attached")
        return attach_blocking(f"/proc/self/fd/{fd}", policy)
    finally:
        os.close(fd)


def with_proxy_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the proxy variables of a network-on session (they win over the caller's)."""
    return {**env, **proxy_environment()}


def stop() -> None:
    """Stop the gateway process (at exit, or in tests)."""
    configure(_SETTINGS)
