"""What a backend provides: a started runner somewhere, and the channel to it.

A backend is only transport and isolation. It starts `sandboxes/runtime/runner.py` inside its
boundary (a local process, a container, a microVM) with the runner's stdin and stdout connected to
the parent, and hands the parent a `Worker`. Everything a run *means* (policy, capture, state,
tools, results) lives in the runner and in `Executor`, so every backend behaves alike.

The channel carries one JSON object per line in each direction (see `runtime/runner.py`).
"""

from __future__ import annotations

import socket
import struct
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel

from . import polling
from .errors import FileTooLarge

if TYPE_CHECKING:
    from .usage import UsageProbe

MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""The default bound of one protocol line. The executor sets each worker's `line_limit` from its output
limit (`runtime.bounds.line_limit`); a longer line means a broken or forged runner, and no worker buffers
more than that before giving up on it."""


class WorkerExited(Exception):
    """The channel reached end-of-file: the runner is gone (crashed, killed or stopped)."""


@dataclass
class WorkerExit:
    """How a worker ended, as far as the backend can tell."""

    detail: str
    oom: bool = False


@dataclass
class ForkPlan:
    """A fork in preparation (`Worker.prepare_fork`): where the copy lives inside the sandbox, how
    its channel reaches the runner (``"fd"``: a descriptor passed on the channel socket; ``"listen"``:
    the runner listens on a unix socket inside the sandbox, which a relay the backend starts there
    connects to, see `runtime/sessionfork.py`), and what the backend keeps until `Worker.forked` or
    `Worker.abandon_fork`. `answer` is the runner's ``fork_channel`` message, set before
    `Worker.hand_over` (listen: the socket's path, the secret and the runner's pid)."""

    workdir: str
    channel: Literal["fd", "listen"] = "fd"
    state: dict[str, Any] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)


class Worker(ABC):
    """One live runner and the channel to it. Backends subclass this."""

    isolation: str = "process"
    line_limit: int = MAX_MESSAGE_BYTES
    """Bytes of one protocol line this worker buffers at most; `receive_line` ends the worker past it."""
    channel_token: str | None = None
    """The runner's channel token, learnt from its `init` reply before any code runs (set by `Executor`)."""

    def usage_probe(self) -> UsageProbe | None:
        """A probe that measures a run of this worker from outside it (see `usage.UsageProbe`), or None
        where the backend cannot."""
        return None

    @abstractmethod
    async def send(self, data: bytes) -> None:
        """Write bytes (whole protocol lines) to the runner's stdin."""

    @abstractmethod
    async def receive_line(self) -> bytes:
        """Return the next line the runner wrote on its channel; raise `WorkerExited` at end-of-file."""

    async def alive(self) -> bool:
        """Cheap liveness check before a run, so a worker that died while idle is replaced *before*
        the next snippet is sent (the snippet then runs normally, with `state_lost`). Backends that
        cannot tell cheaply keep this default; their dead workers are noticed by `receive_line`."""
        return True

    @abstractmethod
    async def kill(self) -> None:
        """Kill the runner and everything it started. Idempotent; never raises for a dead worker."""

    @abstractmethod
    async def exit_info(self) -> WorkerExit:
        """After the channel closed: why the worker ended (exit code, signal, OOM kill...)."""

    async def wait_reaped(self, timeout: float = 30.0) -> bool:
        """After a close that ends the worker in the background: wait until nothing of it is left
        (False past `timeout`). Default: closes end everything before they return."""
        return True

    async def prepare_fork(self) -> ForkPlan:
        """Make what a fork of this runner needs (its working directory, its channel's other end);
        raise `ForkError` where this worker cannot be forked. Default: it cannot."""
        from .errors import ForkError

        raise ForkError(f"this backend's workers ({type(self).__name__}) cannot be forked")

    async def hand_over(self, plan: ForkPlan) -> None:  # noqa: B027 - optional: "fd" channels only
        """The runner asked for the fork's channel (``fork_channel``): give it."""

    def forked(self, plan: ForkPlan, pid: int) -> Worker:
        """The fork's own worker, once the runner said it forked. `pid` is what the runner claims (a
        checked int, as the runner sees it), so never an identity to act on alone: the worker proves
        which process its fork is from something the sandbox cannot forge (host: the kernel's
        credentials on the greeting, refused with `ProtocolError` by `receive_line` when they do not
        match the claim) or acts on it only with the session's own rights (inside its container or
        microVM, as its user), so that a lie reaches nothing the code could not reach itself."""
        raise NotImplementedError

    async def abandon_fork(self, plan: ForkPlan) -> None:  # noqa: B027 - optional: nothing to undo
        """Undo `prepare_fork` for a fork that did not happen. Never raises."""

    @abstractmethod
    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file at `path`, relative to the working directory (already validated)."""

    @abstractmethod
    async def read_file(self, path: str, max_bytes: int) -> bytes:
        """Read a file at `path`, relative to the working directory (already validated), counting its
        bytes as they arrive (`CappedBytes`): `FileTooLarge` once more than `max_bytes` came, having
        read at most one byte more; a size the sandbox reports (a stat, a header) is never trusted."""


class CappedBytes:
    """A download's bytes, gathered as they arrive and refused past the cap: read no more than `room`
    at a time, so at most `max_bytes` + 1 bytes are ever read, whatever the file claims or becomes."""

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._buffer = bytearray()

    @property
    def room(self) -> int:
        """Bytes still worth reading: one past the cap is enough to know the file is too large."""
        return self.max_bytes + 1 - len(self._buffer)

    def add(self, chunk: bytes) -> None:
        """Keep `chunk` (its part within the room); `FileTooLarge` once more than `max_bytes` came."""
        self._buffer += chunk[: self.room]
        if len(self._buffer) > self.max_bytes:
            raise FileTooLarge.over(self.path, self.max_bytes)

    def value(self) -> bytes:
        return bytes(self._buffer)


class SocketLineReader:
    """Reads newline-terminated lines from a non-blocking socket without blocking the event loop.

    Works under any anyio backend, and for any socket (a local socketpair, a Docker attach socket).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self._buffer = bytearray()
        self.quick = True
        """Whether the last wait for bytes ended within `polling.POLL_SECONDS` (the next one may poll)."""
        self._woken = 0  # `wake_waiters` calls: a wait that began before the last one ends
        self._poll_owed = False
        # One poll per message sent: an answer to it is what comes quickly. The other side may send
        # a byte at a time (a runner the code replaced), and a poll per wait would then keep this
        # process's loop polling as long as it trickles.
        self.sender: int | None = None
        """The sender's pid of the last `exchange_blocking` answer, where the socket passes credentials."""

    async def receive_line(self, limit: int = MAX_MESSAGE_BYTES) -> bytes:
        """The next line; `WorkerExited` at end-of-file or once more than `limit` bytes lack a newline."""
        while True:
            line = take_line(self._buffer, limit)
            if line is not None:
                return line
            chunk = await self.receive_some()
            if not chunk:
                raise WorkerExited("the runner closed its channel")
            self._buffer += chunk

    def exchange_blocking(self, data: bytes, timeout: float, limit: int = MAX_MESSAGE_BYTES) -> bytes:
        """Blocking: send `data`, then return the next line; `WorkerExited` at end-of-file, past `limit`
        bytes or past `timeout` seconds. Only for a thread that has the socket to itself before any
        event loop reads it (a pool's refill: the warm-up, the handshake ahead). On a socket that
        passes credentials (``SO_PASSCRED``), `sender` is then the pid the kernel gave with the
        answer's first chunk, in our PID namespace (None otherwise)."""
        deadline = time.monotonic() + timeout
        self.sender = None
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(data)
            while (line := take_line(self._buffer, limit)) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WorkerExited(f"the runner did not answer within {timeout:g} s")
                self.sock.settimeout(remaining)
                chunk, ancillary, _, _ = self.sock.recvmsg(1 << 16, _CREDENTIALS_SPACE)
                if not chunk:
                    raise WorkerExited("the runner closed its channel")
                self.sender = self.sender or _sender_pid(ancillary)
                self._buffer += chunk
            return line
        except OSError as exc:  # a timeout included
            raise WorkerExited(f"the runner's channel failed ({type(exc).__name__}: {exc})") from exc
        finally:
            self.sock.setblocking(False)

    async def receive_some(self) -> bytes:
        """The next bytes on the socket (b"" at end-of-file): read at once, else after a short poll
        where `polling` allows one, else once the socket is readable."""
        try:
            return self.sock.recv(1 << 20)
        except BlockingIOError:
            pass
        except OSError:  # reset, or closed by a kill
            return b""
        started = time.perf_counter()
        woken = self._woken
        may_poll = polling.begin_wait()
        try:
            if may_poll and self.quick and self._poll_owed:
                self._poll_owed = False
                deadline = started + polling.POLL_SECONDS
                while True:
                    await anyio.lowlevel.checkpoint()  # the loop's other tasks run between looks
                    if self._woken != woken:  # `wake_waiters` while this wait polled
                        return b""
                    try:
                        return self.sock.recv(1 << 20)
                    except BlockingIOError:
                        if time.perf_counter() > deadline or not polling.sole_waiter():
                            break
                    except OSError:
                        return b""
            while True:
                if self._woken != woken:
                    return b""
                try:
                    await anyio.wait_readable(self.sock)
                except anyio.ClosedResourceError:  # `wake_waiters`: the socket is being closed
                    return b""
                try:
                    chunk = self.sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                except OSError:
                    return b""
                self.quick = time.perf_counter() - started <= polling.POLL_SECONDS
                return chunk
        finally:
            polling.end_wait()

    def wake_waiters(self) -> None:
        """End a wait on this socket (it then reads as end-of-file): call it on the event loop's thread
        before the socket is closed from elsewhere (a kill in a worker thread).

        A closed descriptor never becomes readable, so a task parked on it would wait for good, and
        anyio would keep its registration under the descriptor's number: the next socket that reuses
        the number could not be read on that event loop at all ("Another task is already reading").
        A killed runner's own end does not always close first (a large process takes a while to die).
        """
        self._woken += 1  # a wait that polls (not registered with the loop) ends at its next look
        if self.sock.fileno() >= 0:
            anyio.notify_closing(self.sock)

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self.sock.send(view)
            except BlockingIOError:
                try:
                    await anyio.wait_writable(self.sock)
                except anyio.ClosedResourceError as exc:
                    raise WorkerExited("the runner's channel was closed") from exc
                continue
            except (BrokenPipeError, ConnectionResetError, OSError) as exc:
                raise WorkerExited(f"the runner's channel is closed ({exc})") from exc
            view = view[sent:]
        self._poll_owed = True


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CREDENTIALS_SPACE = socket.CMSG_SPACE(_UCRED.size)


def _sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            pid = _UCRED.unpack(data[: _UCRED.size])[0]
            return pid if pid > 0 else None
    return None


def peek_sender(sock: socket.socket) -> int | None:
    """The pid the kernel gave with the first byte waiting on `sock` (a unix socket with
    ``SO_PASSCRED`` set before that byte was sent), in our PID namespace, without consuming it; None
    at end-of-file or without credentials. Blocking: call it once the socket is readable."""
    try:
        _, ancillary, _, _ = sock.recvmsg(1, _CREDENTIALS_SPACE, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return None
    return _sender_pid(ancillary)


def take_line(buffer: bytearray, limit: int) -> bytes | None:
    """Remove and return the first whole line of `buffer`, or None when there is none yet. Raises
    `WorkerExited` when the line is, or already would be, longer than `limit` bytes."""
    newline = buffer.find(b"\n", 0, limit + 1)
    if newline < 0:
        if len(buffer) > limit:
            raise WorkerExited(f"the runner sent a protocol line longer than {limit:,} bytes")
        return None
    line = bytes(buffer[: newline + 1])
    del buffer[: newline + 1]
    return line
