"""The Docker backend's worker: one container running the runner, talked to over its attach socket
(`DockerWorker`), a session forked inside the same container and reached through a ``docker exec``
relay (`ForkedDockerWorker`), how a container is started and removed, and what removes every container
of this process at exit. `executor.py` builds the executor on top; see its docstring for why the
containers are made this way. Settings, the stream, the family, the pool and the usage probe are the
package's other modules."""

from __future__ import annotations

import concurrent.futures
import io
import os
import socket
import tarfile
import time
import weakref
from typing import Any

import anyio

from ...errors import BackendUnavailable, ForkError, SandboxFileError, WorkerStartError
from ...images import (
    cleanup,
    image_missing_message,
)
from ...worker import CappedBytes, ForkPlan, SocketLineReader, Worker, WorkerExit
from .daemon import RESOURCES, client, connected, remove_container
from .family import Family, close_relay, drop_relay, leave, leave_later, listen_answer, start_exec_relay
from .probe import ContainerProbe, container_cgroup_dirs, oom_kills
from .settings import FORKS_DIR, SANDBOX_UID, SESSIONS_DIR, WORKDIR, ContainerSettings
from .stream import Demultiplexer, stream_line, stream_open

HANDOVER_TIMEOUT = 15.0
"""Seconds a fork waits for its relay's ``docker exec`` to start."""
GO_MODE_SYMLINK = 1 << 27
"""The symlink bit of Go's os.FileMode, as the daemon reports it in an archive's stat header."""
ARCHIVE_HEADER_ROOM = 1 << 20
"""Bytes of a file read's tar stream allowed beyond the file itself: its headers (a long name, the
extended attributes the daemon adds) and padding."""
_orphans_swept = False


class DockerWorker(Worker):
    """One container running the runner, and the attach socket to it."""

    isolation = "container"

    def __init__(self, container_id: str, attach: Any, user: str = SANDBOX_UID) -> None:
        self.container_id = container_id
        self.user = user  # uploaded files get this owner, so the code can change them
        self.workdir = WORKDIR
        self.runner_pid: int | None = None  # as the container sees it; learnt at the first fork
        self.family: Family | None = None  # set at the first fork
        self.member = 0
        self._spare: concurrent.futures.Future[Any] | None = None  # a relay started for the next fork
        self.forks_dir = FORKS_DIR
        self._attach = attach  # the SDK's socket object; holding it keeps the HTTP response alive
        raw = getattr(attach, "_sock", attach)
        self.sock: socket.socket = raw
        self.channel = SocketLineReader(raw)
        self.demux = Demultiplexer()
        self._removed = False
        self._cgroups: tuple[str, str] | None | bool = False  # False: not looked up yet
        self.stats_peak: int | None = None
        self._finalizer: weakref.finalize[Any, Any] = weakref.finalize(self, remove_later, container_id, raw)
        self._finalizer.atexit = False  # at exit, `_remove_all_at_exit` removes it synchronously
        _LIVE[container_id] = self

    def __repr__(self) -> str:
        return f"<DockerWorker {self.container_id[:12]}>"

    def usage_probe(self) -> ContainerProbe:
        return ContainerProbe(self)

    def cgroup_dirs(self) -> tuple[str, str] | None:
        """The container's cpuacct and memory cgroup directories on this host (looked up once, from
        its init's pid: blocking), or None where they cannot be read from here."""
        if self._cgroups is False:
            self._cgroups = container_cgroup_dirs(self.container_id)
        return self._cgroups if isinstance(self._cgroups, tuple) else None

    async def send(self, data: bytes) -> None:
        await self.channel.send(data)

    async def receive_line(self) -> bytes:
        return await stream_line(self.channel, self.demux, self.line_limit)

    async def alive(self) -> bool:
        return self.socket_open()

    def socket_open(self) -> bool:
        """Whether the attach stream is still open (`stream_open`)."""
        return stream_open(self.sock)

    def remove_now(self) -> None:
        """Kill and remove the container and its volume (blocking); in a family with other live
        members, end only this session's processes. Idempotent, never raises."""
        if _LIVE.get(self.container_id) is self:
            _LIVE.pop(self.container_id, None)
        _LIVE_FORKS.discard(self)
        if not self._removed:
            self._removed = True
            self._finalizer.detach()
            self._drop_spare()
            self._close_attach()  # the socket itself closes in `remove_container` / `leave`, in their order
            if self.family is None:
                remove_container(self.container_id, self.sock)
            else:
                leave(self.family, self.member, self.user, self.sock, self._ending())

    def _ending(self) -> tuple[str, ...]:
        """`forkrelay.py`'s arguments that end this session while others live in its container: the
        first runner is the container's main process (its exit would stop the container), so it is
        stopped, not killed, and its descendants killed; the container goes with the family's last."""
        return ("retire", str(self.runner_pid))

    def _close_attach(self) -> None:
        """Drop the SDK's file object over the attach socket (`_attach`, which the HTTP response reads
        through): it holds the descriptor open after the socket's own close until garbage collection
        finds the worker, and between collections a soak's closed sessions piled up descriptors."""
        try:
            self._attach.close()
        except OSError:
            pass

    def _close_stream(self) -> None:
        """Close the attach socket's descriptor now (the socket and the SDK's file object over it)."""
        self._close_attach()
        try:
            self.sock.close()
        except OSError:
            pass

    async def kill(self) -> None:
        self.channel.wake_waiters()
        await anyio.to_thread.run_sync(self.remove_now)

    def release(self) -> None:
        """End the session without waiting: close the stream, remove the container in the background.

        Only for an idle runner (it is blocked reading its stdin): the closed stream is end-of-file
        for it, so it exits at once and the container stops; the removal (a few hundred ms of daemon
        work) then happens off the caller's path. A busy runner needs `kill()`. In a family, the
        container stays for the others and this session's processes end in the background (`remove_now`).
        """
        if self.family is not None:
            try:
                RESOURCES.submit("remove", self.remove_now)
            except RuntimeError:  # interpreter shutting down
                self.remove_now()
            return
        _LIVE.pop(self.container_id, None)
        if not self._removed:
            self._removed = True
            self._finalizer.detach()
            self._close_stream()
            try:
                RESOURCES.submit("remove", remove_container, self.container_id, None)
            except RuntimeError:  # interpreter shutting down
                remove_container(self.container_id, None)

    async def exit_info(self) -> WorkerExit:
        return await anyio.to_thread.run_sync(self._exit_info)

    def _exit_info(self) -> WorkerExit:
        return container_exit_info(self.container_id, bytes(self.demux.stderr_tail))

    # ------------------------------------------------------------------ fork (runtime/sessionfork.py)

    async def prepare_fork(self) -> ForkPlan:
        if self._removed:
            raise ForkError("this session's container is being removed")
        # The runner makes it (as the session's user): a fresh name in the container's fork volume.
        return ForkPlan(f"{self.forks_dir}/{os.urandom(12).hex()}", "listen")

    async def hand_over(self, plan: ForkPlan) -> None:
        path, secret, pid = listen_answer(plan)
        if self.runner_pid is None:
            self.runner_pid = pid
        plan.state["relay"] = await anyio.to_thread.run_sync(self._connect_relay, path, secret)
        plan.state["memory_watch"] = await anyio.to_thread.run_sync(self._memory_watch)

    def _memory_watch(self) -> tuple[str, int] | None:
        """The container's memory cgroup and its OOM-kill count now (blocking): a fork's runner that
        dies while the container lives was killed for memory if the count has grown since."""
        dirs = self.cgroup_dirs()
        count = oom_kills(dirs[1] if dirs else None)
        return (dirs[1], count) if dirs and count is not None else None

    def _connect_relay(self, path: str, secret: str) -> Any:
        """A relay for this fork (the spare one started after the previous fork, if it is still there:
        starting a process with ``docker exec`` costs most of a fork), told where to connect."""
        attach = None
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                attach = spare.result(timeout=HANDOVER_TIMEOUT)
            except Exception:
                attach = None
        for _ in range(2):  # a spare that died meanwhile: one fresh try
            if attach is None:
                attach = start_exec_relay(self.container_id, self.user)
            raw: socket.socket = getattr(attach, "_sock", attach)
            try:
                raw.sendall(f"{path} {secret}\n".encode())
                return attach
            except OSError:
                raw.close()
                attach = None
        raise ForkError("the fork's relay closed its stream at once")

    def _spare_soon(self) -> None:
        """Start the relay of this session's next fork in the background (one idle process)."""
        if self._spare is None and not self._removed:
            try:
                self._spare = RESOURCES.submit("background", start_exec_relay, self.container_id, self.user)
            except RuntimeError:  # interpreter shutting down
                pass

    def _drop_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:  # closing its stream ends it (end-of-file before its first line)
            spare.add_done_callback(close_relay)

    def forked(self, plan: ForkPlan, pid: int) -> ForkedDockerWorker:
        if self.family is None:
            self.family = Family(self.container_id)
            self.member = self.family.join()
            # From now on a collected worker leaves the family instead of removing the container.
            self._finalizer.detach()
            self._finalizer = weakref.finalize(
                self, leave_later, self.family, self.member, self.user, self.sock, self._ending()
            )
            self._finalizer.atexit = False
        child = ForkedDockerWorker(
            self.container_id,
            plan.state.pop("relay"),
            self.user,
            self.family,
            pid,
            plan.workdir,
            memory_watch=plan.state.pop("memory_watch", None),
        )
        self._spare_soon()
        return child

    async def abandon_fork(self, plan: ForkPlan) -> None:
        drop_relay(plan)

    # ------------------------------------------------------------------ files, through the Docker API

    def _refuse_symlinks(self, path: str) -> None:
        """Refuse `path` if it, or a directory on the way to it, is a symbolic link (blocking).

        Docker resolves links inside the container's root, so a link cannot reach the host; but it
        can point out of the working directory, and the files API promises the working directory
        only. Asked with HEAD requests: the stat header, no content.
        """
        import docker.errors
        from docker.utils import decode_json_header

        api = client().api
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            response = api.head(
                api._url("/containers/{0}/archive", self.container_id),
                params={"path": f"{self.workdir}/{prefix}"},
            )
            if response.status_code == 404:
                try:
                    api.inspect_container(self.container_id)
                except docker.errors.NotFound as exc:
                    raise SandboxFileError("the sandbox container is gone") from exc
                return  # nothing there yet: the rest will be created as plain directories and files
            api._raise_for_status(response)
            header = response.headers.get("x-docker-container-path-stat")
            stat = decode_json_header(header) if header else {}
            if stat.get("mode", 0) & GO_MODE_SYMLINK or stat.get("linkTarget"):
                raise SandboxFileError(f"{prefix!r} in the sandbox is a symbolic link; refused")

    async def write_file(self, path: str, data: bytes) -> None:
        await anyio.to_thread.run_sync(self._write_file, path, data)

    def _write_file(self, path: str, data: bytes) -> None:
        import docker.errors

        self._refuse_symlinks(path)
        uid_text, _, gid_text = self.user.partition(":")
        uid = int(uid_text) if uid_text.isdigit() else 1000  # a user name: the image's sandbox user
        gid = int(gid_text) if gid_text.isdigit() else uid
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            parts = path.split("/")
            for depth in range(1, len(parts)):  # parent directories, owned by the sandbox user
                directory = tarfile.TarInfo("/".join(parts[:depth]))
                directory.type, directory.mode = tarfile.DIRTYPE, 0o755
                directory.uid, directory.gid, directory.mtime = uid, gid, int(time.time())
                archive.addfile(directory)
            entry = tarfile.TarInfo(path)
            entry.size, entry.mode, entry.mtime = len(data), 0o644, int(time.time())
            entry.uid, entry.gid = uid, gid
            archive.addfile(entry, io.BytesIO(data))
        try:
            client().api.put_archive(self.container_id, self.workdir, buffer.getvalue())
        except docker.errors.NotFound as exc:
            raise SandboxFileError(f"cannot write {path!r}: the sandbox container is gone ({exc})") from exc
        except docker.errors.APIError as exc:
            raise SandboxFileError(f"cannot write {path!r} in the sandbox: {exc.explanation or exc}") from exc

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        return await anyio.to_thread.run_sync(self._read_file, path, max_bytes)

    def _read_file(self, path: str, max_bytes: int) -> bytes:
        """The file through the archive API, as a tar streamed off the daemon: the member's bytes are
        counted as they are read (its header's size is not trusted), the stream's too, and the
        response is closed at the cap, so the rest of a huge or growing file is never read here."""
        import docker.errors
        import urllib3.exceptions

        self._refuse_symlinks(path)
        api = client().api
        try:
            response = api._get(
                api._url("/containers/{0}/archive", self.container_id),
                params={"path": f"{self.workdir}/{path}"},
                stream=True,
                headers={"Accept-Encoding": "identity"},
            )
        except OSError as exc:  # the daemon's socket, before any answer
            raise SandboxFileError(f"cannot read {path!r} from the sandbox: {exc}") from exc
        try:
            api._raise_for_status(response)
            stream = _CountedStream(response.raw, max_bytes + 1 + ARCHIVE_HEADER_ROOM)
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                member = archive.next()
                if member is None or not member.isfile():
                    raise SandboxFileError(f"{path!r} in the sandbox is not a regular file")
                extracted = archive.extractfile(member)
                assert extracted is not None
                gathered = CappedBytes(path, max_bytes)
                while chunk := extracted.read(min(1 << 20, gathered.room)):
                    gathered.add(chunk)
                return gathered.value()
        except docker.errors.NotFound as exc:
            raise SandboxFileError(f"no file {path!r} in the sandbox's working directory") from exc
        except docker.errors.APIError as exc:
            raise SandboxFileError(
                f"cannot read {path!r} from the sandbox: {exc.explanation or exc}"
            ) from exc
        except (tarfile.TarError, OSError, urllib3.exceptions.HTTPError) as exc:  # cut, malformed, broken
            raise SandboxFileError(f"cannot read {path!r} from the sandbox: {exc}") from exc
        finally:
            response.close()  # mid-body: the connection is dropped, the daemon stops sending


class _CountedStream(io.RawIOBase):
    """A response body read as a file, refused past `limit` bytes: bounds what tarfile reads, headers
    included (a PAX header states its own size, and tarfile reads all of it)."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._limit = limit
        self._count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        want = self._limit + 1 - self._count
        data: bytes = self._raw.read(want if size < 0 else min(size, want))
        self._count += len(data)
        if self._count > self._limit:
            raise SandboxFileError(
                f"the daemon's archive of the file ran past {self._limit:,} bytes (the cap and room "
                "for its headers); refused"
            )
        return data


class ForkedDockerWorker(DockerWorker):
    """A session forked inside its parent's container (`runtime/sessionfork.py`, ``listen`` channel):
    its runner is a grandchild of the forked one, reached through `forkrelay.py` started with
    ``docker exec``, whose attach stream (multiplexed as the container's) is this worker's channel.

    Ending it never touches the container while the family has other members: it kills its runner's
    process group and tree and removes its working directory (``forkrelay.py end``)."""

    def __init__(
        self,
        container_id: str,
        attach: Any,
        user: str,
        family: Family,
        pid: int,
        workdir: str,
        *,
        memory_watch: tuple[str, int] | None = None,
        in_shared_container: bool = False,
    ) -> None:
        self.container_id = container_id
        self._memory_watch_at_fork = memory_watch
        # A shared container's sessions make forks where their uid may (the fork volume is the
        # container-per-session user's), and share its memory cgroup with strangers: no OOM count.
        self.forks_dir = SESSIONS_DIR if in_shared_container else FORKS_DIR
        self.user = user
        self.workdir = workdir
        self.runner_pid = pid
        self.family = family
        self.member = family.join()
        self._attach = attach
        raw = getattr(attach, "_sock", attach)
        self.sock = raw
        self.channel = SocketLineReader(raw)
        self.demux = Demultiplexer()
        self._removed = False
        self._cgroups = None if in_shared_container else False  # False: looked up if it forks in turn
        self._spare = None
        self.stats_peak = None
        self._finalizer = weakref.finalize(self, leave_later, family, self.member, user, raw, self._ending())
        self._finalizer.atexit = False
        _LIVE_FORKS.add(self)

    def __repr__(self) -> str:
        return f"<ForkedDockerWorker {self.container_id[:12]} pid {self.runner_pid}>"

    def usage_probe(self) -> None:  # type: ignore[override]
        # The container's cgroup counts the whole family: no figure of this session alone.
        return None

    def _ending(self) -> tuple[str, ...]:
        return ("end", str(self.runner_pid), self.workdir)

    def _killed_for_memory(self) -> bool:
        """Whether the container's memory cgroup OOM-killed a process since this fork was made (the
        kernel's count, read on this host; False where it cannot be read). A sibling's OOM kill in
        the same moment would count too: the family shares one limit."""
        if self._memory_watch_at_fork is None:
            return False
        memory_dir, at_fork = self._memory_watch_at_fork
        now = oom_kills(memory_dir)
        return now is not None and now > at_fork

    def _exit_info(self) -> WorkerExit:
        stderr = self.demux.stderr_tail.decode(errors="replace").strip()
        suffix = f"; relay stderr: {stderr[-500:]}" if stderr else ""
        try:
            state = client().api.inspect_container(self.container_id)["State"]
        except Exception as exc:  # removed, or the daemon is down
            return WorkerExit(detail=f"the family's container is gone ({exc.__class__.__name__})" + suffix)
        if not state.get("Running"):
            return WorkerExit(
                detail=f"the family's container stopped (exit code {state.get('ExitCode')})" + suffix,
                oom=bool(state.get("OOMKilled")),
            )
        if self._killed_for_memory():
            return WorkerExit(
                detail="killed for exceeding the container's memory limit (OOM; the limit is shared by "
                "the sessions forked in it)" + suffix,
                oom=True,
            )
        return WorkerExit(
            detail="the forked session's runner ended (killed, crashed, or killed for memory: the "
            "container's memory limit is shared by its family)" + suffix
        )


def container_exit_info(container_id: str, stderr_tail: bytes) -> WorkerExit:
    """Why a container's stream ended, from the daemon (blocking; never raises)."""
    import docker.errors

    stderr = stderr_tail.decode(errors="replace").strip()
    suffix = f"; runner stderr: {stderr[-500:]}" if stderr else ""
    try:
        api = client().api
        deadline = time.monotonic() + 3
        while True:  # the stream can end a moment before the daemon records the exit
            state = api.inspect_container(container_id)["State"]
            if not state.get("Running") or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    except docker.errors.NotFound:
        return WorkerExit(detail="the container was removed from outside" + suffix)
    except Exception as exc:  # daemon down or restarting: say so, never raise here
        return WorkerExit(detail=f"the Docker daemon did not answer ({exc.__class__.__name__})" + suffix)
    if state.get("OOMKilled"):
        return WorkerExit(detail="killed for exceeding the container's memory limit (OOM)", oom=True)
    if state.get("Running"):
        return WorkerExit(detail="the container closed its stream but is still running" + suffix)
    return WorkerExit(detail=f"the container exited with code {state.get('ExitCode')}" + suffix)


_LIVE_FORKS: weakref.WeakSet[DockerWorker] = weakref.WeakSet()
"""Forked sessions of this process; their containers are removed at interpreter exit."""


# ---------------------------------------------------------------------- containers: start, remove, pool

_LIVE: weakref.WeakValueDictionary[str, DockerWorker] = weakref.WeakValueDictionary()
"""Containers of sessions and pools of this process, removed at interpreter exit. Weak, so that an
executor nobody closed can still be garbage collected (its finalizer removes the container)."""


def remove_later(container_id: str, sock: socket.socket) -> None:
    """Finalizer of a worker nobody closed: closing the socket stops it, the removal runs in the background."""
    _LIVE.pop(container_id, None)
    try:
        sock.close()
    except OSError:
        pass
    try:
        RESOURCES.submit("background", remove_container, container_id, None)
    except RuntimeError:  # interpreter shutting down: no more threads, remove it here
        remove_container(container_id, None)


def create_and_attach(
    settings: ContainerSettings, channels: tuple[str, str] | None = None
) -> tuple[str, Any]:
    """Create a container and attach to its stdio before it starts, so no byte is missed (blocking):
    its id and the SDK's attach socket. `channels`: `ContainerSettings.create_arguments`'."""
    import docker.errors

    api = client().api
    try:
        created = api.create_container(**settings.create_arguments(api, channels))
    except docker.errors.ImageNotFound as exc:
        raise BackendUnavailable(image_missing_message(settings.image)) from exc
    except docker.errors.APIError as exc:
        raise WorkerStartError(
            f"Docker could not create the sandbox container: {exc.explanation or exc}"
        ) from exc
    container_id = created["Id"]
    try:
        return container_id, api.attach_socket(
            container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
    except BaseException:
        remove_container(container_id, None)
        raise


def start_container(settings: ContainerSettings) -> DockerWorker:
    """Create a container, attach to its stdio, start it (blocking; run in a thread)."""
    import docker.errors

    container_id, attach = create_and_attach(settings)
    try:
        worker = DockerWorker(container_id, attach, settings.user)
    except BaseException:
        remove_container(container_id, None)
        raise
    try:
        client().api.start(container_id)
    except BaseException as exc:
        worker.remove_now()
        if isinstance(exc, docker.errors.APIError):
            raise WorkerStartError(
                f"Docker could not start the sandbox container: {exc.explanation or exc}"
            ) from exc
        raise
    return worker


def sweep_orphans_soon() -> None:
    """Once per process, in the background: remove containers left behind by parents that died
    without cleaning up."""
    global _orphans_swept
    if not _orphans_swept:
        _orphans_swept = True
        RESOURCES.submit("background", _sweep_orphans)


def _sweep_orphans() -> None:
    try:
        cleanup(progress=lambda _message: None)
    except Exception:
        pass


@RESOURCES.on_close
def _remove_all_at_exit() -> None:
    """Remove every container of this process (blocking): sessions', and forks' with their family
    (the pools drain first: `pool.py` registers that clean-up later, so it runs before this one)."""
    if not connected():
        return
    families = {w.container_id: w for w in list(_LIVE_FORKS) if w.family is not None}
    for worker in list(_LIVE.values()):
        worker.remove_now()
    for container_id, worker in families.items():  # at exit, every container goes with its family
        worker._finalizer.detach()
        remove_container(container_id, worker.sock)
