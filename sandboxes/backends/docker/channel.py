"""A shared container's sessions reached without the daemon: a unix socket per session.

On the attach stream dockerd relays every byte between this process and the container (two copies
and a daemon's scheduling per message). With a local daemon a session's runner instead connects to
a socket this process listens on, in a directory bind-mounted into its container:

- this process's directory (``kodeagent-channels-*`` in the temporary directory, root's, 0711)
  holds one directory per container (0711: it may be entered, never listed), bind-mounted read-only
  at `IN_CONTAINER`, so a container sees its own sessions' entries only, and can change none;
- per session a directory of a random name, 0700 and owned by the session's uid and gid, holding
  the listening socket (the session's too, 0600): no other uid may reach it, list it or replace it;
- on `Listener.accept` the peer's credentials (``SO_PEERCRED``, set by the kernel at its
  ``connect``) are checked before a byte is read: its uid and gid are the session's, and its pid is
  the session's runner in that container's PID namespace; anything else is closed, unread. Then the
  session's directory is removed: once connected, nobody else may connect again.

It needs a daemon on this machine that sees this machine's files (its socket, not TCP or SSH) and a
parent that may give a directory to another uid (root); otherwise (`available`) the shared
containers use the attach stream as before, as they do when asked: ``KODEAGENT_DOCKER_CHANNEL=attach``.
"""

from __future__ import annotations

import atexit
import os
import secrets
import select
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable

from ...errors import WorkerStartError
from .settings import CHANNELS_DIR

IN_CONTAINER = CHANNELS_DIR
"""Where a shared container sees its channels directory (read-only)."""
SOCKET_NAME = "sock"
ACCEPT_TIMEOUT = 90.0
"""Seconds a session's runner may take to connect once its host started it: a fork, dropping to its
uid and a ``connect`` (milliseconds), generous for a loaded 2-core machine."""
ENV_SWITCH = "KODEAGENT_DOCKER_CHANNEL"
"""``attach`` keeps Docker's attach stream (`available`); unset, or anything else, the channel where it can be."""

_UCRED = struct.Struct("3i")
_base_lock = threading.Lock()
_base: str | None = None


def available() -> bool:
    """Whether shared containers of this process use socket channels: nobody asked for the attach
    stream (``KODEAGENT_DOCKER_CHANNEL=attach``), the daemon is reached by a local unix socket (so
    it bind-mounts this machine's directories), and this process may give a directory to a
    session's uid (root)."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "attach":
        return False
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return False  # TCP or SSH: the daemon's files are not ours
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _base_dir() -> str:
    global _base
    with _base_lock:
        if _base is None or not os.path.isdir(_base):
            _base = tempfile.mkdtemp(prefix="kodeagent-channels-")
            os.chmod(_base, 0o711)
            atexit.register(shutil.rmtree, _base, True)
        return _base


class ChannelDir:
    """One container's channels directory on this machine (bind-mounted at `IN_CONTAINER`)."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="c-", dir=_base_dir())
        os.chmod(self.path, 0o711)
        # The session host checks that it sees this file: a daemon whose files are not ours (a
        # socket forwarded from elsewhere) would mount an empty directory of its own.
        self.token = secrets.token_hex(16)
        with open(os.path.join(self.path, self.token), "x"):
            pass
        os.chmod(os.path.join(self.path, self.token), 0o444)
        self.pidns: tuple[int, int] | None = None  # the container's PID namespace (`bind_to`)

    def bind_to(self, init_pid: int) -> None:
        """Learn the container's PID namespace from its first process (this machine's pid)."""
        info = os.stat(f"/proc/{init_pid}/ns/pid")
        self.pidns = (info.st_dev, info.st_ino)

    def listen(self, uid: int) -> Listener:
        """A new session's listening socket, reachable by `uid` only."""
        return Listener(self, uid)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class Listener:
    """One session's listening socket, in its own 0700 directory owned by the session's uid."""

    def __init__(self, directory: ChannelDir, uid: int) -> None:
        self.directory = directory
        self.uid = uid
        self.name = secrets.token_hex(12)
        self.path = os.path.join(directory.path, self.name)
        self.refused: list[str] = []  # why each refused peer was refused (for tests and errors)
        os.mkdir(self.path, 0o700)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            address = os.path.join(self.path, SOCKET_NAME)
            self.sock.bind(address)
            os.chmod(address, 0o600)
            os.chown(address, uid, uid)
            os.chown(self.path, uid, uid)
            self.sock.listen(8)
        except BaseException:
            self.close()
            raise

    def accept(
        self, runner_pid: int, timeout: float = ACCEPT_TIMEOUT, gone: Callable[[], str | None] | None = None
    ) -> socket.socket:
        """The runner's connection, its credentials checked before anything is read; then the
        directory goes. `gone` (polled) says why the runner will never connect (it exited): the wait
        ends at once. `WorkerStartError` when no right peer came within `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    refused = f" (refused: {'; '.join(self.refused[-3:])})" if self.refused else ""
                    raise WorkerStartError(
                        f"the session's runner did not connect to its channel within {timeout:.0f} s"
                        f"{refused}; on a machine this loaded, retry later, or set {ENV_SWITCH}=attach "
                        "to use Docker's attach stream instead"
                    )
                readable, _, _ = select.select([self.sock], [], [], min(left, 0.25))
                if not readable:
                    why = gone() if gone is not None else None
                    if why:
                        raise WorkerStartError(
                            f"the session's runner {why} before it connected to its channel"
                        )
                    continue
                try:
                    conn, _ = self.sock.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                problem = self.check_peer(conn, runner_pid)
                if problem is None:
                    return conn
                self.refused.append(problem)
                conn.close()  # unread
        finally:
            self.close()

    def check_peer(self, conn: socket.socket, runner_pid: int) -> str | None:
        """Why the peer on `conn` is not this session's runner, or None when it is."""
        pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if uid != self.uid or gid != self.uid:
            return f"a peer of uid {uid} and gid {gid} is not the session's ({self.uid})"
        if pid <= 0:
            return "the peer's pid is not visible here"
        try:
            info = os.stat(f"/proc/{pid}/ns/pid")
            with open(f"/proc/{pid}/status") as status:
                inner = next((line.split()[-1] for line in status if line.startswith("NSpid:")), "")
        except (OSError, StopIteration):
            return f"the peer's process {pid} is gone"
        if self.directory.pidns is None or (info.st_dev, info.st_ino) != self.directory.pidns:
            return f"the peer's process {pid} is not in the session's container"
        if inner != str(runner_pid):
            return f"the peer's process (pid {inner} in the container) is not the session's runner ({runner_pid})"
        return None

    def close(self) -> None:
        """Stop listening and remove the session's directory (idempotent)."""
        try:
            self.sock.close()
        except OSError:
            pass
        shutil.rmtree(self.path, ignore_errors=True)
