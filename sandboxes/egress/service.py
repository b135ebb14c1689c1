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

import contextlib
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
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import ValidationError

from ..errors import EgressUnavailable
from . import PROXY_PORT, PROXY_URL
from .policy import NetworkPolicy, NetworkReport

if TYPE_CHECKING:
    from .ca import SessionAuthority

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
    upstream_ca: a PEM file of the authorities the gateway verifies upstream servers with where it
        adds secrets (default: this machine's); tests name the authority of their fake internet.
    """

    netns: str | None = None
    nameservers: tuple[tuple[str, int], ...] | None = None
    extra_public: tuple[str, ...] = field(default_factory=tuple)
    head_seconds: float | None = None
    upstream_ca: str | None = None


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


CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "AWS_CA_BUNDLE",
)
"""Where common clients (OpenSSL and Python's ssl, requests, curl, pip, git, Node, boto) look for the
authorities they trust: a session with secrets gets its bundle (this machine's + the session's CA)."""


def ca_bundle_path() -> str:
    """A new name for a session's CA bundle, in the session's own ``/tmp`` (a fork server's sessions
    share one: the name is random, the file root's and read-only to them)."""
    return f"/tmp/kodeagent-egress-ca-{os.urandom(16).hex()}.pem"


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
            "upstream_ca": settings.upstream_ca,
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


def _policy_message(policy: NetworkPolicy, authority: SessionAuthority | None) -> dict[str, Any]:
    """`policy` as the gateway takes it, each secret with a leaf certificate of the session's CA."""
    message = policy.gateway_message()
    if policy.secrets:
        if authority is None:
            raise ValueError(
                "this session was opened without secrets, so it trusts no authority of the gateway's and "
                "a secret cannot be added to its HTTPS; open the executor with NetworkPolicy(secrets=...)"
            )
        for item in message["secrets"]:
            item["certificate"] = authority.leaf(item["host"])
    return message


class EgressLink:
    """One session's place in the gateway: its rules, changed live, and its connection report."""

    def __init__(
        self,
        process: _GatewayProcess,
        ident: int,
        policy: NetworkPolicy,
        authority: SessionAuthority | None = None,
        bundle: tuple[int, str] | None = None,
    ) -> None:
        self._process = process
        self.ident = ident
        self.policy: NetworkPolicy | None = policy
        self.authority = authority
        self._bundle = bundle  # (the session's /tmp, held open; the bundle's name there)
        self.closed = False

    async def set_policy(self, policy: NetworkPolicy | None) -> None:
        """New rules (and secrets) for the session's next connection (None: refuse every connection
        from now on). `ValueError` for secrets on a session opened without any."""
        message = {
            "op": "policy",
            "id": self.ident,
            **_policy_message(policy or NetworkPolicy(), self.authority),
        }
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
        if self._bundle is not None:
            folder, name = self._bundle
            self._bundle = None
            try:
                os.unlink(name, dir_fd=folder)
            except OSError:
                pass  # the session's /tmp went with its container or namespace
            finally:
                os.close(folder)


def attach_blocking(
    netns: str,
    policy: NetworkPolicy,
    authority: SessionAuthority | None = None,
    bundle: tuple[int, str] | None = None,
) -> EgressLink:
    """Give the session whose network namespace is `netns` its gateway (blocking); the link owns
    `bundle` (the session's CA bundle, removed at close) from then on."""
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
        message = {"op": "attach", "id": ident, **_policy_message(policy, authority)}
        if _SETTINGS.head_seconds is not None:
            message["limits"]["head_seconds"] = _SETTINGS.head_seconds
        _checked(process.request(message, [listener.fileno()]), "take the session")
    finally:
        listener.close()
    return EgressLink(process, ident, policy, authority, bundle)


async def attach(netns: str, policy: NetworkPolicy) -> EgressLink:
    """`attach_blocking` off the event loop."""
    return await anyio.to_thread.run_sync(attach_blocking, netns, policy)


def attach_process_blocking(
    pid: int, still_same: Callable[[], bool], policy: NetworkPolicy, bundle_path: str | None = None
) -> EgressLink:
    """Give the session whose runner is host process `pid` its gateway, in that process's network
    namespace: the namespace is held open first, then `still_same()` proves the pid was not reused.

    With `bundle_path` (where the session's CA variables point, `ca_bundle_path`), the session gets
    a certificate authority of its own and its bundle there, in the process's own file system."""
    try:
        fd = os.open(namespace_of(pid), os.O_RDONLY | os.O_CLOEXEC)
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise EgressUnavailable(f"the session's network namespace cannot be opened ({exc})") from exc
    bundle: tuple[int, str] | None = None
    try:
        if not still_same():
            raise EgressUnavailable("the session's runner ended before its gateway was attached")
        authority = None
        if bundle_path is not None:
            from .ca import SessionAuthority

            authority = SessionAuthority()
            bundle = _write_bundle(root, bundle_path, authority.bundle())
        link = attach_blocking(f"/proc/self/fd/{fd}", policy, authority, bundle)
        bundle = None
        return link
    finally:
        if bundle is not None:
            with contextlib.suppress(OSError):
                os.unlink(bundle[1], dir_fd=bundle[0])
            os.close(bundle[0])
        os.close(root)
        os.close(fd)


def _write_bundle(root: int, path: str, data: bytes) -> tuple[int, str]:
    """Write the session's CA bundle at `path` below the session's root `root` (a new file, root's,
    readable by all); the folder stays open for the removal at close."""
    folder_path, _, name = path.strip("/").rpartition("/")
    try:
        folder = os.open(
            folder_path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root
        )
    except OSError as exc:
        raise EgressUnavailable(f"the session has no /{folder_path} for its CA bundle ({exc})") from exc
    try:
        out = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder
        )
        try:
            os.fchmod(out, 0o644)
            os.write(out, data)
        finally:
            os.close(out)
    except OSError as exc:
        os.close(folder)
        raise EgressUnavailable(f"the session's CA bundle could not be written ({exc})") from exc
    return folder, name


def with_proxy_environment(env: Mapping[str, str], bundle_path: str | None = None) -> dict[str, str]:
    """`env` with the proxy variables of a network-on session (they win over the caller's), and with
    `bundle_path` the CA variables pointing at the session's bundle."""
    extra = {name: bundle_path for name in CA_VARIABLES} if bundle_path is not None else {}
    return {**env, **proxy_environment(), **extra}


def stop() -> None:
    """Stop the gateway process (at exit, or in tests)."""
    configure(_SETTINGS)
