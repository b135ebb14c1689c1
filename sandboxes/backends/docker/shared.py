"""Shared containers: one warm container hosting successive sessions (``sessions_per_container > 1``).

The container's main process is the session host (`runtime/sessionhost.py`), reached over the
container's attach stream exactly as a container-per-session runner is (`docker.container`); it forks
each session's runner as a uid of its own (`SHARED_USERS`: unique among this process's sessions,
from a range apart from the host backend's), whose channel is a unix socket of its own to this
process when the daemon is local (`docker.channel`: no byte of it through dockerd) and else relayed
by the host on the stream, and at the session's end kills
and removes everything of that uid and *proves* it did (processes, files in every writable place,
System V IPC objects). Only a container whose clean-up came back clean goes back to the pool; one
that reports a problem, whose host died, that failed to answer, or that has served its
`sessions_per_container`, is removed. One session at a time per container: concurrent sessions
would share its loopback, ``/proc`` and ``/tmp``.

Which bound is whose (cgroup v1 here, so no cgroup per session without privilege):
- the session's, as rlimits set by its runner: address space (`Limits.memory_mb`, so a session
  gets ``MemoryError`` before the container's OOM killer picks a victim), processes
  (`Limits.max_processes`, RLIMIT_NPROC: per uid, and the uid is the session's own), CPU seconds,
  file size, open files;
- the container's, shared by the sessions it hosts one after another: memory (`memory_mb` +
  `MEMORY_HEADROOM_MB` for the host), PIDs, CPU quota, the size of ``/tmp`` and ``/dev/shm``.
"""

from __future__ import annotations

import base64
import binascii
import collections
import functools
import json
import os
import secrets
import select
import socket
import time
import weakref
from typing import Any

import anyio

from ...errors import FileTooLarge, ForkError, ProtocolError, SandboxFileError, WorkerStartError
from ...worker import ForkPlan, SocketLineReader, Worker, WorkerExit, WorkerExited, take_line
from ..host.reap import PrivateUsers, UidBlocks
from ..resources import WarmPool
from ..resources import fill as resources_fill
from . import channel as channels_module
from .channel import ChannelDir, Listener
from .container import ForkedDockerWorker, container_exit_info, create_and_attach, remove_later
from .daemon import RESOURCES, client, remove_container
from .family import Family, drop_relay, listen_answer, run_helper, start_relay
from .probe import ContainerProbe, container_cgroup_dirs
from .settings import SESSIONS_DIR, ContainerSettings
from .stream import Demultiplexer, stream_line, stream_open

SHARED_USERS = PrivateUsers(size=1000, blocks=UidBlocks(first=1_000_000, size=1000, count=1000))
"""Session uids of shared containers: 1,000,001 and up, a block of 1,000 held by this parent process
alone (`UidBlocks`, as the host backend's), so two containers of this process never hold one uid, nor
do two processes' (their channel directories on this machine are owned by those uids), and the host
backend's range (200,000..) is apart."""
READY_TIMEOUT = 60.0
"""Seconds a new container's session host may take to say it is ready (imports, on a loaded machine)."""
CLOSE_TIMEOUT = 15.0
"""Seconds a session's clean-up may take before its container is given up (removed)."""
FILE_LINE_LIMIT = 2 << 20
"""The longest answer line of a file read: one piece of the file (the host's ``FILE_CHUNK``, 1 MiB)
in base64, and its envelope."""

CLEAN_SECONDS: collections.deque[float] = collections.deque(maxlen=10_000)
"""How long the session hosts took to end and clean each recent session (for `bench`)."""
CLEAN_PARTS: collections.deque[dict[str, float]] = collections.deque(maxlen=10_000)
"""Of each: the seconds of its parts (the runner's end, the kill, the sweep, waiting for reaping)."""

RESOURCES.declare("shared", 2)
# Waits for clean-ups run apart from starts and removals, so a container is back in milliseconds
# even while a replacement starts (hundreds of milliseconds of daemon work).
RESOURCES.declare("clean", 8)


def _nonce() -> str:
    return secrets.token_hex(16)


class SharedContainer:
    """One container running the session host, and the attach stream to it (parent side)."""

    def __init__(
        self, settings: ContainerSettings, container_id: str, attach: Any, channels: ChannelDir | None = None
    ) -> None:
        self.settings = settings
        self.channels = channels  # the sessions' own sockets (`docker.channel`); None: the stream
        self.container_id = container_id
        self._attach = attach
        raw: socket.socket = getattr(attach, "_sock", attach)
        self.sock = raw
        self.channel = SocketLineReader(raw)
        self.demux = Demultiplexer()
        self.sessions = 0  # sessions started in it
        self.removed = False
        self.last_problems: list[str] = []  # what the last clean-up could not prove
        # The next session, started by the host at the last close: (nonce, uid, its open answer, its
        # channel when it has a socket of its own).
        self.ready: tuple[str, int, dict[str, Any], SocketLineReader | None] | None = None
        self._cgroups: tuple[str, str] | None | bool = False
        self._finalizer = weakref.finalize(self, remove_later, container_id, raw)
        self._finalizer.atexit = False
        _LIVE[container_id] = self

    def __repr__(self) -> str:
        return f"<SharedContainer {self.container_id[:12]} sessions={self.sessions}>"

    # ------------------------------------------------------------------ the stream

    async def next_line(self, limit: int) -> bytes:
        return await stream_line(self.channel, self.demux, limit)

    def wait_for(self, nonce: str | None, timeout: float, limit: int = 1 << 20) -> dict[str, Any]:
        """The host's message answering `nonce` (None: its ready message), skipping everything else
        (a previous session's last words); blocking, for threads. `WorkerExited` if none comes."""
        deadline = time.monotonic() + timeout
        while (line := self._line_before(deadline, limit)) is not None:
            message = host_message(line)
            if message is not None and message.get("nonce") == nonce:
                return message
        raise WorkerExited(f"the session host did not answer within {timeout:.0f} s")

    def _line_before(self, deadline: float, limit: int) -> bytes | None:
        """The stream's next line, or None once `deadline` (monotonic) passed; blocking, for threads.
        `WorkerExited` at the stream's end."""
        while (line := take_line(self.demux.stdout, limit)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([self.sock], [], [], left)
            if not readable:
                continue
            try:
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                raise WorkerExited("the shared container's attach stream ended")
            self.demux.feed(chunk)
        return line

    def send_blocking(self, message: dict[str, Any]) -> None:
        self._send_blocking(host_request(message))

    def _send_blocking(self, payload: bytes) -> None:
        data = memoryview(payload)
        while data:
            try:
                data = data[self.sock.send(data) :]
            except BlockingIOError:
                select.select([], [self.sock], [], 5)
            except OSError as exc:
                raise WorkerExited(f"the shared container's stream is closed ({exc})") from exc

    def exit_notice(self, nonce: str) -> int | None:
        """The exit status in a host notice for session `nonce` already sent, or None (reads what
        is waiting without blocking and consumes nothing)."""
        while True:
            try:
                chunk = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not chunk:
                break
            self.demux.feed(chunk)
        marker = nonce.encode()
        if marker not in self.demux.stdout:
            return None
        for line in bytes(self.demux.stdout).split(b"\n"):
            status = exit_status(host_message(line), nonce) if marker in line else None
            if status is not None:
                return status
        return None

    def socket_open(self) -> bool:
        return stream_open(self.sock)

    def cgroup_dirs(self) -> tuple[str, str] | None:
        """`container_cgroup_dirs`, looked up once for all the sessions it hosts."""
        if self._cgroups is False:
            self._cgroups = container_cgroup_dirs(self.container_id)
        return self._cgroups if isinstance(self._cgroups, tuple) else None

    # ------------------------------------------------------------------ sessions

    async def open_session(self) -> SharedSessionWorker:
        """Start a session in this (idle) container: a fresh runner as a fresh uid (the one its host
        started ahead at the previous close, if there is one)."""
        _IN_USE.add(self)
        ready, self.ready = self.ready, None
        if ready is not None:
            self.sessions += 1
            self.demux.stderr_tail.clear()
            return SharedSessionWorker(self, *ready)
        uid = SHARED_USERS.take()
        nonce = _nonce()
        link: SocketLineReader | None = None
        listener: Listener | None = None
        try:
            request: dict[str, Any] = {"op": "open", "nonce": nonce, "uid": uid}
            listener = self._listen(request, uid)
            await self.channel.send(host_request(request))
            while True:
                message = host_message(await self.next_line(1 << 20))
                if message is not None and message.get("nonce") == nonce:
                    break
            if listener is not None and "error" not in message:
                link = await anyio.to_thread.run_sync(self._accept, listener, nonce, message)
        except BaseException:
            if listener is not None:
                listener.close()
            SHARED_USERS.release(uid)  # never started, or the container goes: nothing of it lives on
            self.remove_now()
            raise
        if listener is not None:
            listener.close()  # accepted (its directory gone) or never to be
        if "error" in message:
            SHARED_USERS.release(uid)
            self.remove_now()
            raise WorkerStartError(f"the shared container could not start a session: {message['error']}")
        self.sessions += 1
        self.demux.stderr_tail.clear()
        return SharedSessionWorker(self, nonce, uid, message, link)

    def _listen(self, request: dict[str, Any], uid: int) -> Listener | None:
        """With socket channels: the session's listening socket, named in its open `request`."""
        if self.channels is None:
            return None
        listener = self.channels.listen(uid)
        request["channel"] = listener.name
        return listener

    def _accept(
        self, listener: Listener | None, nonce: str, opened: dict[str, Any]
    ) -> SocketLineReader | None:
        """The connection of the runner the host started (`opened`), its peer checked (blocking)."""
        if listener is None:
            return None
        if not opened.get("channel") or "pid" not in opened:
            listener.close()
            raise WorkerStartError("the session host did not start the runner on its channel")

        def gone() -> str | None:
            if not self.socket_open():
                return "'s container ended"
            status = self.exit_notice(nonce)
            return None if status is None else f"exited (status {status})"

        return SocketLineReader(listener.accept(int(opened["pid"]), gone=gone))

    def end_session(self, worker: SharedSessionWorker) -> None:
        """Ask the host to end `worker`'s session and wait, in the background, for its clean-up: the
        container then goes back to the pool, or (unclean, spent, silent) is removed (non-blocking)."""
        nonce = _nonce()
        request: dict[str, Any] = {"op": "close", "nonce": nonce}
        following: tuple[str, int] | None = None
        listener: Listener | None = None
        if self.sessions < self.settings.sessions_per_container:
            try:
                following = (_nonce(), SHARED_USERS.take())
                request["next"] = {"nonce": following[0], "uid": following[1]}
                listener = self._listen(request["next"], following[1])
            except WorkerStartError:  # every uid is held: the next session asks for one itself
                pass
            except OSError:  # no socket for it: the next session is opened when it is asked for
                request.pop("next", None)
                if following is not None:
                    SHARED_USERS.release(following[1])
                following = None
        worker.close_link()
        with _pool:
            _IN_USE.discard(self)
            _CLEANING.add(self)
        try:
            self.send_blocking(request)
            RESOURCES.submit("clean", self._after_close, worker.uid, nonce, following, listener)
        except (WorkerExited, RuntimeError):  # a dead stream, or the interpreter is shutting down
            if listener is not None:
                listener.close()
            self.remove_now()
            SHARED_USERS.release(worker.uid)
            if following is not None:
                SHARED_USERS.release(following[1])
            _give_back(self, reusable=False)

    def _after_close(
        self, uid: int, nonce: str, following: tuple[str, int] | None, listener: Listener | None = None
    ) -> None:
        reply: dict[str, Any] = {}
        try:
            reply = self.wait_for(nonce, CLOSE_TIMEOUT)
            clean = bool(reply.get("clean"))
            self.last_problems = [str(p) for p in reply.get("problems", [])]
            CLEAN_SECONDS.append(float(reply.get("seconds", 0.0)))
            parts = reply.get("parts")
            if isinstance(parts, dict):
                CLEAN_PARTS.append(
                    {str(k): float(v) for k, v in parts.items() if isinstance(v, (int, float))}
                )
        except WorkerExited as exc:
            clean, self.last_problems = False, [str(exc)]
        if not clean:
            self.remove_now()  # every process in it dies with the container
        SHARED_USERS.release(uid)  # proved gone by the host, or gone with the container
        if following is not None:
            opened = reply.get("next")
            link = None
            if clean and isinstance(opened, dict) and "pid" in opened:
                link = self._accept_quietly(listener, following[0], opened)
            if listener is not None:
                listener.close()
            if (
                clean
                and isinstance(opened, dict)
                and opened.get("nonce") == following[0]
                and "pid" in opened
                and (listener is None or link is not None)
                and self._warm_up(link)
            ):
                self.ready = (following[0], following[1], opened, link)
            elif clean and isinstance(opened, dict) and "pid" in opened:  # started, but not right
                clean = False
                self.remove_now()
                SHARED_USERS.release(following[1])
            else:  # not started (or the container went): nothing of that uid exists
                SHARED_USERS.release(following[1])
        elif listener is not None:
            listener.close()
        _give_back(self, reusable=clean)

    def _accept_quietly(
        self, listener: Listener | None, nonce: str, opened: dict[str, Any]
    ) -> SocketLineReader | None:
        """`_accept`, None for a runner that did not connect rightly (its container is not reused)."""
        try:
            return self._accept(listener, nonce, opened)
        except WorkerStartError as exc:
            self.last_problems = [str(exc)]
            return None

    def open_ahead(self) -> None:
        """Start the first session of a new container now, warmed up, so that its first taker finds
        it ready as every later one does (blocking; without it the taker starts it, slower)."""
        nonce, uid = _nonce(), SHARED_USERS.take()
        request: dict[str, Any] = {"op": "open", "nonce": nonce, "uid": uid}
        link: SocketLineReader | None = None
        listener = self._listen(request, uid)
        try:
            self.send_blocking(request)
            opened = self.wait_for(nonce, READY_TIMEOUT)
        except WorkerExited:
            opened = {}
        if "pid" in opened:
            link = self._accept_quietly(listener, nonce, opened)
        if listener is not None:
            listener.close()
        if "pid" in opened and (listener is None or link is not None) and self._warm_up(link):
            self.ready = (nonce, uid, opened, link)
            return
        if "pid" in opened:  # started but did not answer: nothing may reuse this container
            self.remove_now()
        SHARED_USERS.release(uid)

    def _warm_up(self, link: SocketLineReader | None = None) -> bool:
        """Have the next session's runner touch what a session uses (its first requests then run at
        full speed: a fork's copy-on-write pages, lazily built caches), here, off every caller's
        path. True when it answered as a runner does. On its own channel `link` if it has one."""
        deadline = time.monotonic() + CLOSE_TIMEOUT
        if link is not None:
            try:
                answer = link.exchange_blocking(b'{"op": "warmup"}\n', CLOSE_TIMEOUT)
                return bool(json.loads(answer).get("op") == "reply")
            except (WorkerExited, ValueError, AttributeError):
                link.sock.close()
                return False
        try:
            self._send_blocking(b'{"op": "warmup"}\n')
            while (line := self._line_before(deadline, 1 << 20)) is not None:
                if not line.strip() or host_message(line) is not None:
                    continue
                try:
                    return json.loads(line).get("op") == "reply"
                except ValueError:
                    return False
        except WorkerExited:
            pass
        return False

    async def file_request(self, message: dict[str, Any], limit: int = 1 << 20) -> dict[str, Any]:
        nonce = _nonce()
        await self.channel.send(host_request({**message, "nonce": nonce}))
        while True:
            reply = host_message(await self.next_line(limit))
            if reply is not None and reply.get("nonce") == nonce:
                return reply

    def remove_now(self) -> None:
        """Kill and remove the container (blocking). Idempotent, never raises."""
        _LIVE.pop(self.container_id, None)
        _IN_USE.discard(self)
        if not self.removed:
            self.removed = True
            self._finalizer.detach()
            try:
                self._attach.close()
            except OSError:
                pass
            remove_container(self.container_id, self.sock)
            if self.channels is not None:
                self.channels.remove()
            ready, self.ready = self.ready, None
            if ready is not None:  # its processes died with the container
                if ready[3] is not None:
                    ready[3].sock.close()
                SHARED_USERS.release(ready[1])


def host_request(message: dict[str, Any]) -> bytes:
    """`message` as a request line to the session host (``!{json}``)."""
    return b"!" + json.dumps(message).encode() + b"\n"


def host_message(line: bytes) -> dict[str, Any] | None:
    """The session host's message on `line` (``!{json}``), or None for any other line."""
    if not line.startswith(b"!"):
        return None
    try:
        message = json.loads(line[1:])
    except (ValueError, RecursionError):  # a session can write such a line too: it is not the host's
        return None
    return message if type(message) is dict else None


def exit_status(message: dict[str, Any] | None, nonce: str) -> int | None:
    """The exit status a host message reports for session `nonce`, or None (another message, or an
    'exited' that is not an int: a session can write a line that looks like the host's)."""
    if message is None or message.get("nonce") != nonce:
        return None
    status = message.get("exited")
    return status if type(status) is int else None


class SharedSessionWorker(Worker):
    """One session in a `SharedContainer`: its runner, reached on its own socket (`link`,
    `docker.channel`) or through the session host's relay on the attach stream."""

    isolation = "container"

    def __init__(
        self,
        container: SharedContainer,
        nonce: str,
        uid: int,
        opened: dict[str, Any],
        link: SocketLineReader | None = None,
    ) -> None:
        self.container = container
        self.link = link
        self.container_id = container.container_id
        self.nonce = nonce  # the host's exit notice for this session carries it
        self.uid = uid
        self.runner_pid = int(opened["pid"])
        self.workdir = str(opened["workdir"])
        self.tmpdir = str(opened["tmpdir"])
        self.user = f"{uid}:{uid}"  # forks' relays run as the session's uid
        self.family: Family | None = None  # set at the first fork
        self.member = 0
        self.exit_status: int | None = None
        self.ended = False
        self.stats_peak: int | None = None
        self._finalizer = weakref.finalize(self, _end_quietly, container, self.uid)
        self._finalizer.atexit = False

    def __repr__(self) -> str:
        return f"<SharedSessionWorker {self.container_id[:12]} uid {self.uid}>"

    def usage_probe(self) -> ContainerProbe:
        # One session at a time: the container's cgroup counts this session (and its idle host).
        return ContainerProbe(self)

    def cgroup_dirs(self) -> tuple[str, str] | None:
        return self.container.cgroup_dirs()

    async def send(self, data: bytes) -> None:
        if self.ended or self.exit_status is not None:
            raise WorkerExited("this session has ended")
        await (self.link or self.container.channel).send(data)

    async def receive_line(self) -> bytes:
        if self.link is not None:
            if self.ended:
                raise WorkerExited("this session has ended")
            try:
                return await self.link.receive_line(self.line_limit)
            except WorkerExited:
                await self._exit_status_soon()
                raise
        while True:
            if self.ended:
                raise WorkerExited("this session has ended")
            line = await self.container.next_line(self.line_limit)
            if not line.strip():
                continue  # the newline that precedes each of the host's messages
            message = host_message(line)
            if message is None:
                return line
            status = exit_status(message, self.nonce)
            if status is not None:
                self.exit_status = status
                raise WorkerExited("the session's runner exited")
            # anything else that looks like the host's was written by the session itself: dropped

    async def _exit_status_soon(self, seconds: float = 2.0) -> None:
        """The runner's channel ended: its exit status from the host's notice, when it comes soon."""
        deadline = time.monotonic() + seconds
        while self.exit_status is None and time.monotonic() < deadline and self.container.socket_open():
            self.exit_status = self.container.exit_notice(self.nonce)
            if self.exit_status is None:
                await anyio.sleep(0.02)

    async def alive(self) -> bool:
        if self.ended or self.exit_status is not None:
            return False
        # The host's notice of the runner's exit waits unread in the stream while the session is idle.
        status = self.container.exit_notice(self.nonce)
        if status is not None:
            self.exit_status = status
            return False
        if self.link is not None and not stream_open(self.link.sock):
            return False
        return self.container.socket_open()

    async def kill(self) -> None:
        self.container.channel.wake_waiters()
        if self.link is not None:
            self.link.wake_waiters()
        await anyio.to_thread.run_sync(self.end)

    def close_link(self) -> None:
        """Close the runner's own channel (its end is the host's to see to)."""
        if self.link is not None:
            try:
                self.link.sock.close()
            except OSError:
                pass

    def end(self) -> None:
        """End the session (the host kills and cleans it; the container's fate is decided in the
        background). Idempotent, blocking only for a short send. While forks of it live, only its
        own runner ends; the last of the family to go has the host clean up."""
        if not self.ended:
            self.ended = True
            self._finalizer.detach()
            if self.family is None or self.family.leave(self.member):
                self.container.end_session(self)
                return
            self.close_link()
            ending = ("end", str(self.runner_pid), self.workdir)
            try:
                RESOURCES.submit("shared", run_helper, self.container_id, self.user, ending)
            except RuntimeError:
                run_helper(self.container_id, self.user, ending)

    async def exit_info(self) -> WorkerExit:
        if self.link is not None and self.exit_status is None:
            await self._exit_status_soon()
        if self.exit_status is not None and self.container.socket_open():
            status = self.exit_status
            if os.WIFSIGNALED(status):
                how = f"was killed by signal {os.WTERMSIG(status)}"
            else:
                how = f"exited with code {os.WEXITSTATUS(status)}"
            stderr = self.container.demux.stderr_tail.decode(errors="replace").strip()
            suffix = f"; runner stderr: {stderr[-500:]}" if stderr else ""
            return WorkerExit(detail=f"the session's runner {how}{suffix}")
        return await anyio.to_thread.run_sync(
            container_exit_info, self.container_id, bytes(self.container.demux.stderr_tail)
        )

    # ------------------------------------------------------------------ fork (runtime/sessionfork.py)
    # A fork lives in this container as this session's uid (`ForkedDockerWorker`, reached through a
    # relay started with ``docker exec``); the family shares the container, which stays out of the
    # pool until the last of them ends, and then the host cleans the uid as for any session.

    async def prepare_fork(self) -> ForkPlan:
        if self.ended or self.exit_status is not None:
            raise ForkError("this session has ended")
        return ForkPlan(f"{SESSIONS_DIR}/{secrets.token_hex(12)}", "listen")

    async def hand_over(self, plan: ForkPlan) -> None:
        path, secret, _pid = listen_answer(plan)
        plan.state["relay"] = await anyio.to_thread.run_sync(
            start_relay, self.container_id, self.user, path, secret
        )

    def forked(self, plan: ForkPlan, pid: int) -> ForkedDockerWorker:
        if self.family is None:
            self.family = Family(self.container_id, finish=self._family_ended)
            self.member = self.family.join()
        return ForkedDockerWorker(
            self.container_id,
            plan.state.pop("relay"),
            self.user,
            self.family,
            pid,
            plan.workdir,
            in_shared_container=True,
        )

    async def abandon_fork(self, plan: ForkPlan) -> None:
        drop_relay(plan)

    def _family_ended(self, sock: socket.socket) -> None:
        """The last fork left after this session: close its relay, end the uid in the host."""
        try:
            sock.close()
        except OSError:
            pass
        self.container.end_session(self)

    async def write_file(self, path: str, data: bytes) -> None:
        reply = await self._file({"op": "write", "path": path, "data": base64.b64encode(data).decode()})
        if "error" in reply:
            raise SandboxFileError(f"cannot write {path!r} in the sandbox: {reply['error']}")

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        """The file in the host's pieces, counted here as they arrive: the host stops at `max_bytes`
        + 1 bytes (``too_large``: the stream is in step, the session intact); a host that sends more
        than that, or anything but the answer, is not the protocol."""
        if self.ended or self.exit_status is not None:
            raise SandboxFileError("the sandbox session has ended")
        nonce = _nonce()
        request = {"op": "read", "nonce": nonce, "path": path, "max_bytes": max_bytes}
        await self.container.channel.send(host_request(request))
        gathered = bytearray()
        while True:
            reply = await self._file_answer(nonce)
            if "error" in reply:
                if reply.get("missing"):
                    raise SandboxFileError(f"no file {path!r} in the sandbox's working directory")
                raise SandboxFileError(f"cannot read {path!r} from the sandbox: {str(reply['error'])[:500]}")
            if reply.get("too_large"):
                raise FileTooLarge.over(path, max_bytes)
            gathered += _piece(reply.get("data"))
            if len(gathered) > max_bytes:
                raise ProtocolError(
                    f"the session host sent more of {path!r} than the {max_bytes:,} bytes asked for"
                )
            if not reply.get("more"):
                return bytes(gathered)

    async def _file_answer(self, nonce: str) -> dict[str, Any]:
        """The host's next message for `nonce`; other lines are skipped (what the session wrote), this
        session's exit notice ends the read as the runner's end."""
        while True:
            message = host_message(await self.container.next_line(max(FILE_LINE_LIMIT, self.line_limit)))
            if message is None:
                continue
            if message.get("nonce") == nonce:
                return message
            if message.get("nonce") == self.nonce and "exited" in message:
                self.exit_status = int(message["exited"])
                raise WorkerExited("the session's runner exited")

    async def _file(self, message: dict[str, Any], limit: int = 1 << 20) -> dict[str, Any]:
        if self.ended or self.exit_status is not None:
            raise SandboxFileError("the sandbox session has ended")
        try:
            return await self.container.file_request(message, limit)
        except WorkerExited as exc:
            raise SandboxFileError(f"the sandbox container is gone ({exc})") from exc


def _piece(data: Any) -> bytes:
    """One piece of a read, decoded; anything but base64 text is not the protocol."""
    if not isinstance(data, str) or len(data) > FILE_LINE_LIMIT:
        raise ProtocolError("the session host answered a file read with something other than base64")
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ProtocolError(f"the session host sent a file piece that is not base64 ({exc})") from None


def _end_quietly(container: SharedContainer, uid: int) -> None:
    """Finalizer of a session nobody closed: its container is removed (nothing to wait on here)."""
    try:
        RESOURCES.submit("shared", container.remove_now)
    except RuntimeError:
        container.remove_now()
    SHARED_USERS.release(uid)


# ---------------------------------------------------------------------- start and pool

_LIVE: weakref.WeakValueDictionary[str, SharedContainer] = weakref.WeakValueDictionary()
_CLEANING: weakref.WeakSet[SharedContainer] = weakref.WeakSet()
_IN_USE: weakref.WeakSet[SharedContainer] = weakref.WeakSet()
_POOL_SIZE: dict[ContainerSettings, int] = {}


def _usable(container: SharedContainer) -> bool:
    return not container.removed and container.socket_open()


def _remove_off_path(container: SharedContainer) -> None:
    RESOURCES.submit("shared", container.remove_now)


SHARED: WarmPool[ContainerSettings, SharedContainer] = WarmPool(_usable, _remove_off_path)
"""Idle shared containers per settings (the next session started ahead in each). Its lock also
guards `_CLEANING`, `_IN_USE` and `_POOL_SIZE`, and is waited on for a container being cleaned."""
_pool = SHARED.lock


def start_shared(settings: ContainerSettings) -> SharedContainer:
    """Create and start a shared container and wait for its session host (blocking)."""
    channels = ChannelDir() if channels_module.available() else None
    try:
        container_id, attach = create_and_attach(
            settings, None if channels is None else (channels.path, channels.token)
        )
    except BaseException:
        if channels is not None:
            channels.remove()
        raise
    container = SharedContainer(settings, container_id, attach, channels)
    try:
        client().api.start(container_id)
        ready = container.wait_for(None, READY_TIMEOUT)
    except BaseException as exc:
        container.remove_now()
        if isinstance(exc, WorkerExited):
            raise WorkerStartError(f"the shared container's session host did not start: {exc}") from exc
        raise
    if not ready.get("ready"):
        container.remove_now()
        raise WorkerStartError(f"the shared container's session host failed: {ready.get('error')}")
    if channels is not None:
        _bind_channels(container, bool(ready.get("channels")))
    if settings.preload:
        nonce = _nonce()
        try:
            container.send_blocking({"op": "preload", "nonce": nonce, "modules": settings.preload})
            answer = container.wait_for(nonce, READY_TIMEOUT)
        except WorkerExited as exc:
            answer = {"error": str(exc)}
        if "error" in answer:
            container.remove_now()
            raise WorkerStartError(f"the shared container could not preload the modules: {answer['error']}")
    container.open_ahead()
    if container.removed:
        raise WorkerStartError("the shared container's first session did not start")
    return container


def _bind_channels(container: SharedContainer, seen: bool) -> None:
    """Keep the container's socket channels if its host sees their directory and the container's
    PID namespace is known here (its peers are checked against it); else use the attach stream."""
    channels = container.channels
    assert channels is not None
    try:
        if not seen:
            raise OSError("the session host does not see this machine's channels directory")
        pid = int(client().api.inspect_container(container.container_id)["State"]["Pid"])
        channels.bind_to(pid)
    except Exception:  # the attach stream works wherever the daemon is
        container.channels = None
        channels.remove()


def take_shared(settings: ContainerSettings, wait: float = 0.0) -> SharedContainer | None:
    """An idle container for `settings`; with `wait`, up to that many seconds for one being cleaned
    (cheaper than starting a container) — blocking then, so call it in a thread."""
    deadline = time.monotonic() + wait
    with _pool:
        while True:
            container = SHARED.take(settings)
            if container is not None:
                return container
            left = deadline - time.monotonic()
            if left <= 0 or not any(c.settings == settings for c in _CLEANING):
                return None
            _pool.wait(left)


def _give_back(container: SharedContainer, reusable: bool) -> None:
    settings = container.settings
    with _pool:
        _CLEANING.discard(container)
        # Room for as many as are in use now besides the pool: what a steady concurrency needs,
        # so that containers are not removed only to be started again a moment later.
        # And one for this container itself, which was in use until now: a container coming back clean
        # is kept rather than one started meanwhile (the pool's refill while it was in use), so
        # that sessions at an agent's pace do take turns in one container.
        in_use = sum(1 for c in _IN_USE if c.settings == settings)
        room = max(1, _POOL_SIZE.get(settings, 1)) + in_use + 1
        keep = (
            reusable
            and not container.removed
            and container.sessions < settings.sessions_per_container
            and SHARED.put(settings, container, limit=room)
        )
        _pool.notify_all()
    if not keep:
        container.remove_now()
        refill_shared(settings, _POOL_SIZE.get(settings, 0))


def refill_shared(settings: ContainerSettings, size: int) -> None:
    """Top up the containers of `settings` that are idle or on their way back (being cleaned, with
    sessions left) to `size`, in the background."""
    _POOL_SIZE[settings] = max(_POOL_SIZE.get(settings, 0), size)

    def fill() -> None:
        # One being cleaned is back in tens of milliseconds, while a start costs hundreds of
        # milliseconds of the daemon's and the cores' time: counting only idle ones, sessions opened
        # back to back (a grader) started a container every few programs and waited anyway.
        resources_fill(
            SHARED,
            settings,
            size,
            functools.partial(_started_shared, settings),
            returning=functools.partial(_cleaning_count, settings),
        )

    if size > 0:
        try:
            RESOURCES.submit("shared", fill)
        except RuntimeError:
            pass


def _cleaning_count(settings: ContainerSettings) -> int:
    """Containers of `settings` being cleaned that have sessions left (the pool's if clean)."""
    with _pool:
        return sum(
            1 for c in _CLEANING if c.settings == settings and c.sessions < settings.sessions_per_container
        )


def _started_shared(settings: ContainerSettings) -> SharedContainer | None:
    try:
        return start_shared(settings)
    except Exception:  # the next session's cold start reports the problem properly
        return None


def idle_count(settings: ContainerSettings) -> int:
    """How many idle shared containers wait for `settings` (benchmarks wait for a full pool with it)."""
    return SHARED.count(settings)


@RESOURCES.on_close
def drain_shared() -> None:
    """Remove every shared container of this process (blocking)."""
    # Hold them before the pool lets go: at exit weakref finalizers no longer run (`weakref.finalize`
    # shuts down first), so an idle container collected here would be left behind, not removed.
    with _pool:
        containers = list(_LIVE.values())
        SHARED.drain()
        _POOL_SIZE.clear()
    for container in containers:
        container.remove_now()
