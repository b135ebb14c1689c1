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
(`_spare`) and hands each request to it.

Protocol, on a SOCK_SEQPACKET socket passed as stdin: once ready the server sends
``{"ready": true, "private_network": bool, "error": str | null}`` (``private_network`` says whether
its children get namespaces of their own; ``error`` why not, when asked for and refused here).
Then the parent sends one datagram per session, ``{"workdir": ..., "argv": [...runner flags...]}``
with the session's channel socket attached (SCM_RIGHTS); the server answers ``{"pid": N}`` once the
child exists. End-of-file ends the server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


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


def _separate(netns: object) -> str | None:
    """Move this child into namespaces of its own: None, or why not (the session's fatal message)."""
    try:
        netns.separate()  # type: ignore[attr-defined]
    except OSError as exc:
        return f"could not give the session network and IPC namespaces of its own ({exc})"
    return None


def _spare(runner: object, control: socket.socket, netns: object) -> tuple[int, socket.socket]:
    """A child forked ahead of its session that has already moved into namespaces of its own (which
    costs the kernel a millisecond or more), waiting on a socket of its own for its session's request
    and channel: handing it over costs a message, and the next spare is made while the parent talks to
    this one. Returns its pid and the server's end of that socket."""
    handoff, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            control.close()
            handoff.close()
            problem = _separate(netns)
            message, fds, _flags, _address = socket.recv_fds(theirs, 1 << 16, 1)
            theirs.close()
            if message and fds:  # end-of-file: the server is gone, or stopped needing this spare
                _become_runner(runner, fds[0], json.loads(message), problem)
        finally:
            os._exit(0)
    theirs.close()
    return pid, handoff


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
    private_network = False
    preloads: list[str] = []
    args = iter(argv)
    for flag in args:
        if flag == "--sys-path":
            sys.path.append(next(args))
        elif flag == "--private-network":
            private_network = True
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
    spare = _spare(runner, control, netns) if netns is not None else None
    while True:
        try:
            message, fds, _flags, _address = socket.recv_fds(control, 1 << 16, 1)
        except InterruptedError:
            continue
        if not message:
            return
        if not fds:
            continue
        pid = None
        if spare is not None:
            try:
                socket.send_fds(spare[1], [message], fds)
                pid = spare[0]
            except OSError:  # the spare died (killed from outside): a child made now does as well
                pass
            spare[1].close()
            spare = None
        if pid is None:
            pid = os.fork()
            if pid == 0:
                control.close()
                problem = _separate(netns) if netns is not None else None
                _become_runner(runner, fds[0], json.loads(message), problem)
        os.close(fds[0])
        control.send(json.dumps({"pid": pid}).encode())
        if netns is not None:
            spare = _spare(runner, control, netns)


if __name__ == "__main__":
    main(sys.argv[1:])
