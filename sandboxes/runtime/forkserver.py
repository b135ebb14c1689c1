"""A fork server: one runner-to-be that has paid for its imports, forking a fresh runner per session.

Starting Python and importing RestrictedPython costs tens of milliseconds of CPU, which dominates a
short session (HumanEval runs one program per session). The fork server does that once, then
forks: each child is a brand-new runner process with its own session id, its own working
directory and (when the server runs as root) its own unprivileged user, and nothing of any other
session. The server itself never runs user code, never installs the audit hook and keeps no
state between sessions.

With ``--private-network`` (the ``namespaces`` level without network) every child moves into network
and IPC namespaces of its own before anything else (`netns.py`): without that, sessions of one server
would share the sandbox's loopback, abstract unix sockets and System V IPC. The kernel takes a
millisecond or more to make them, so the server keeps one child forked and separated ahead of need
(`_spare`) and hands each request to it. With ``--recycle-network`` too (network off) a spare takes,
instead of a new network namespace, one an earlier session has left once nothing shows that session
used it (`Recycler`); its IPC namespace is always new.

Protocol, on a SOCK_SEQPACKET socket passed as stdin: once ready the server sends
``{"ready": true, "private_network": bool, "error": str | null}`` (``private_network`` says whether
its children get namespaces of their own; ``error`` why not, when asked for and refused here).
Then the parent sends one datagram per session, ``{"workdir": ..., "argv": [...runner flags...]}``
with the session's channel socket attached (SCM_RIGHTS); the server answers ``{"pid": N, "lease": L}``
once the child exists (``lease``: its network namespace's, when held for recycling, else null). With
nothing attached, ``{"release": L}`` says that lease's session has no process left (no answer).
End-of-file ends the server.
"""

from __future__ import annotations

import collections
import fcntl
import importlib.util
import json
import os
import signal
import socket
import sys
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
RECYCLE_LIMIT = 32
"""Network namespaces of sessions at most held for later ones; past it the oldest is let go."""


def _runner() -> Any:
    """`runner.py`, loaded by path under its sibling name; it brings the runtime's one loader
    (`siblings.py`, as ``runner.siblings``), which this server takes from it."""
    name = "_kodeagent_runner"
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "runner.py"))
    assert spec is not None and spec.loader is not None
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _become_runner(runner: object, channel_fd: int, request: dict, problem: str | None = None) -> None:
    """In a forked child: become an ordinary runner whose stdin/stdout is the session's channel."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        os.dup2(channel_fd, 0)
        os.dup2(channel_fd, 1)
        os.close(channel_fd)
        if problem is not None:  # fail closed: this session must not share the server's namespaces
            _fatal(problem)
            return
        os.chdir(request["workdir"])
        runner.main(list(request["argv"]))  # type: ignore[attr-defined]
    finally:
        os._exit(0)


def _separate(netns: object, network: int | None = None) -> tuple[str | None, bool]:
    """Move this child into namespaces of its own (or a new IPC namespace and the recycled network
    namespace open as `network`): None, or why not (the session's fatal message), and whether the
    new network namespace is owned by a user namespace of its own (then it is never recycled)."""
    try:
        if network is not None:
            netns.rejoin(network)  # type: ignore[attr-defined]
            return None, False
        return None, netns.separate()  # type: ignore[attr-defined]
    except OSError as exc:
        return f"could not give the session network and IPC namespaces of its own ({exc})", False


class Held(NamedTuple):
    """A network namespace the server holds: its descriptor and its `netns.Usage`, opened when new."""

    network: int
    usage: Any

    def let_go(self) -> None:
        os.close(self.network)
        self.usage.close()


class Recycler:
    """The network namespaces of sessions this server handed out, each handed to a later session
    once the caller has released it and its `netns.Usage` reads as it did when it was new: nothing
    was sent, refused for want of a route, left bound or in TIME_WAIT, or leased in it. Making a
    namespace and tearing it down cost the kernel about three times a bare fork; joining one costs
    a ``setns``.

    Each held namespace has a lease, named in the server's answer for its session. The caller
    releases it (``{"release": lease}``) once every process of that session's private user is shown
    gone: only those processes can be in it (the session's runner is the child that joined it, and
    no process of that user can take another uid). A namespace not released, or not shown
    unchanged, is let go, never handed out. Only namespaces made as root are held (`netns.separate`).
    Everything held is at descriptors from `LOWEST` on, which a child closes in one call."""

    LOWEST = 256

    def __init__(self, netns: Any) -> None:
        self.netns = netns
        self.home = self._high(os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        self._leases = 0
        self.live: dict[int, Held] = {}
        """By lease, the namespaces of sessions handed out and not yet released."""
        self.released: collections.deque[Held] = collections.deque()

    def _high(self, fd: int) -> int:
        try:
            return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, self.LOWEST)
        finally:
            os.close(fd)

    @staticmethod
    def close_in_child() -> None:
        """In a child, once it has joined its namespace: close everything the server holds, so that
        no session holds another's namespace or the server's."""
        os.closerange(Recycler.LOWEST, 1 << 20)

    def adopt(self, network: int) -> Held | None:
        """A new namespace (its descriptor, sent by its spare before its session starts), read now:
        what new reads like. None, and let go, when it cannot be held."""
        try:
            network = self._high(network)
        except OSError:
            return None
        try:
            usage = self.netns.usage_of(network, self.home, self.LOWEST)
        except OSError:
            os.close(network)
            if os.stat("/proc/thread-self/ns/net").st_ino != os.fstat(self.home).st_ino:
                os._exit(70)  # stuck in a session's namespace: end; the caller starts a new server
            return None
        return Held(network, usage)

    def lend(self, held: Held) -> int:
        """Hold `held` for its session; its lease. Past `RECYCLE_LIMIT` the oldest unreleased go."""
        self._leases += 1
        self.live[self._leases] = held
        while len(self.live) > RECYCLE_LIMIT:
            self.live.pop(next(iter(self.live))).let_go()
        return self._leases

    def release(self, lease: object) -> None:
        """The caller's word that `lease`'s session has no process left (an unknown lease is ignored)."""
        held = self.live.pop(lease, None) if isinstance(lease, int) else None
        if held is not None:
            self.released.append(held)
            while len(self.released) > RECYCLE_LIMIT:
                self.released.popleft().let_go()

    def take(self) -> Held | None:
        """A released namespace that reads as it did when new, or None; the changed ones are let go."""
        while self.released:
            held = self.released.popleft()
            try:
                unchanged = held.usage.read() == held.usage.when_opened
            except OSError:
                unchanged = False
            if unchanged:
                return held
            held.let_go()
        return None


def _spare(
    runner: object, control: socket.socket, netns: object, recycler: Recycler | None
) -> tuple[int, socket.socket, Held | None]:
    """A child forked ahead of its session that has already moved into namespaces of its own (which
    costs the kernel a millisecond or more), waiting on a socket of its own for its session's request
    and channel: handing it over costs a message, and the next spare is made while the parent talks to
    this one. Once separated it says so on that socket, with its new network namespace attached when
    the `recycler` may hold it. Returns its pid, the server's end of that socket, and the recycled
    namespace it joined (None: a new one)."""
    reused = recycler.take() if recycler is not None else None
    handoff, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            control.close()
            handoff.close()
            problem, own_user = _separate(netns, reused.network if reused else None)
            if recycler is not None:
                Recycler.close_in_child()
            attached = []
            if problem is None and reused is None and recycler is not None and not own_user:
                attached = [os.open("/proc/self/ns/net", os.O_RDONLY)]
            socket.send_fds(theirs, [b"separated"], attached)
            for fd in attached:
                os.close(fd)
            message, fds, _flags, _address = socket.recv_fds(theirs, 1 << 16, 1)
            theirs.close()
            if message and fds:  # end-of-file: the server is gone, or stopped needing this spare
                _become_runner(runner, fds[0], json.loads(message), problem)
        finally:
            os._exit(0)
    theirs.close()
    return pid, handoff, reused


def _hand_over(
    spare: tuple[int, socket.socket, Held | None],
    message: bytes,
    channel: int,
    recycler: Recycler | None,
) -> tuple[int | None, int | None]:
    """Give `spare` its session (once it has separated): its pid (None if it died first) and the
    lease of its network namespace (None: not held), the recycled one it joined or its new one."""
    pid, handoff, held = spare
    attached: list[int] = []
    try:
        status, attached, _flags, _address = socket.recv_fds(handoff, 64, 1)
        if not status:
            raise ConnectionError("the spare is gone")
        if recycler is not None and attached and held is None:
            held = recycler.adopt(attached.pop())  # before its session starts: what new reads like
        socket.send_fds(handoff, [message], [channel])
    except OSError:  # the spare died (killed from outside): a child made now does as well
        for fd in attached:
            os.close(fd)
        if held is not None:
            held.let_go()
        return None, None
    finally:
        handoff.close()
    lease = recycler.lend(held) if recycler is not None and held is not None else None
    return pid, lease


def _fatal(message: str) -> None:
    """A startup failure, as the runner reports one (the parent reads it as the answer to its first request)."""
    line = json.dumps({"op": "fatal", "message": message, "token": os.urandom(16).hex()}) + "\n"
    os.write(1, line.encode())


def _probe(netns: object) -> str | None:
    """None if a child can take namespaces of its own here, else why not (checked once, at start)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            netns.separate()  # type: ignore[attr-defined]
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent as text
            os.write(write_end, f"{type(exc).__name__}: {exc}".encode()[:2000])
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        error = reader.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return None if status == 0 else error or f"the probe ended with status {status}"


def main(argv: list[str]) -> None:
    private_network = recycle_network = False
    preloads: list[str] = []
    args = iter(argv)
    for flag in args:
        if flag == "--sys-path":
            sys.path.append(next(args))
        elif flag == "--private-network":
            private_network = True
        elif flag == "--recycle-network":
            recycle_network = True
        elif flag == "--preload":
            preloads.append(next(args))
    runner = _runner()
    siblings = runner.siblings
    for path in preloads:  # trusted code of the caller's (`HostExecutor(preload=...)`), never a session's
        runner.preload(path)
    runner.preimport()

    netns = siblings.load("netns") if private_network else None
    error = _probe(netns) if netns is not None else None
    if error is not None:
        netns = None  # the parent starts each session in a sandbox of its own instead
    elif netns is not None:
        netns.prepare()
    control = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control.send(json.dumps({"ready": True, "private_network": netns is not None, "error": error}).encode())
    recycler = None
    if netns is not None and recycle_network:
        try:
            recycler = Recycler(netns)
        except OSError:  # no descriptor free from `Recycler.LOWEST` on (RLIMIT_NOFILE): every namespace new
            pass
    spare = _spare(runner, control, netns, recycler) if netns is not None else None
    while True:
        try:
            message, fds, _flags, _address = socket.recv_fds(control, 1 << 16, 1)
        except InterruptedError:
            continue
        if not message:
            return
        if not fds:
            if recycler is not None:
                try:
                    recycler.release(json.loads(message).get("release"))
                except (ValueError, AttributeError):  # the caller's own messages: not expected
                    pass
            continue
        pid, lease = _hand_over(spare, message, fds[0], recycler) if spare is not None else (None, None)
        spare = None
        if pid is None:
            pid = os.fork()
            if pid == 0:
                control.close()
                if recycler is not None:
                    Recycler.close_in_child()
                problem = _separate(netns)[0] if netns is not None else None
                _become_runner(runner, fds[0], json.loads(message), problem)
        os.close(fds[0])
        control.send(json.dumps({"pid": pid, "lease": lease}).encode())
        if netns is not None:
            spare = _spare(runner, control, netns, recycler)


if __name__ == "__main__":
    main(sys.argv[1:])
