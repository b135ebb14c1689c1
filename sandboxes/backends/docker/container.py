"""The Docker backend's containers: how one is configured, started (cold or from the warm pool),
talked to (`DockerWorker`: the attach socket, demultiplexed), forked (`ForkedDockerWorker`: a
session forked inside the same container, reached through a ``docker exec`` relay) and removed.
`docker.py` builds the executor on top; see its docstring for why the containers are made this way."""

from __future__ import annotations

import concurrent.futures
import functools
import io
import itertools
import os
import socket
import struct
import tarfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypedDict

import anyio
from pydantic import BaseModel, ConfigDict, Field

from ...errors import BackendUnavailable, ForkError, SandboxFileError, WorkerStartError
from ...images import (
    DEFAULT_IMAGE,
    LABEL_OWNER,
    LABEL_SANDBOX,
    cleanup,
    docker_client,
    image_missing_message,
    owner_label,
)
from ...models import RunUsage
from ...session import UsageProbe
from ...usage import CpuReading, cgroup_paths, make_usage, parse_cpuacct_stat, split_cpu
from ...worker import CappedBytes, ForkPlan, SocketLineReader, Worker, WorkerExit, WorkerExited, take_line
from ..resources import WarmPool, fill, resources

if TYPE_CHECKING:
    from .shared import SharedSessionWorker

WORKDIR = "/workspace"
FORKS_DIR = "/forks"
"""Where forked sessions' working directories live in the container (an anonymous volume of its own,
so the parent's /workspace never lists them and the files API reaches them)."""
RUNNER_COMMAND = ("python3", "-I", "/opt/kodeagent/runtime/runner.py")
HELPER_COMMAND = ("python3", "-I", "-S", "/opt/kodeagent/runtime/forkrelay.py")
SESSION_HOST_COMMAND = ("python3", "-I", "/opt/kodeagent/runtime/sessionhost.py")
SESSION_HOST_CAPABILITIES = ("SETUID", "SETGID", "SETPCAP", "KILL")
"""What the session host of a shared container needs: start sessions as other uids, empty their
bounding sets, kill them. Sessions themselves hold no capability at all."""
SESSIONS_DIR = "/sessions"
"""The working directories of a shared container's sessions (mode 1733 in the image: anyone may
make an entry, nobody may list them)."""
MEMORY_HEADROOM_MB = 128
"""A shared container's memory above `memory_mb`: the session host's, and room for a session's
``MemoryError`` (its address-space rlimit) to come before the container's OOM killer."""
HANDOVER_TIMEOUT = 15.0
"""Seconds a fork waits for its relay's ``docker exec`` to start."""
SANDBOX_UID = "1000:1000"
POOL_SIZE = 2
GO_MODE_SYMLINK = 1 << 27
"""The symlink bit of Go's os.FileMode, as the daemon reports it in an archive's stat header."""
ARCHIVE_HEADER_ROOM = 1 << 20
"""Bytes of a file read's tar stream allowed beyond the file itself: its headers (a long name, the
extended attributes the daemon adds) and padding."""
STDERR_KEPT = 4096
"""Bytes of the runner's own stderr kept to explain a crash (user output never goes there)."""

_client_lock = threading.Lock()
_client: Any = None
_orphans_swept = False
RESOURCES = resources("docker")
"""What the Docker backend keeps for the process: its threads (``background``: pool refills, relays
and removals of collected workers; ``remove``: removals of closed sessions' containers, apart from
refills so they never delay them; the shared containers' ``shared`` and ``clean``), the warm pools
(`CONTAINERS`, `docker.shared`'s `SHARED`) and, at `close()`, the removal of every container left.
Queued work still runs at interpreter exit (the thread pools drain their queues before they end)."""
RESOURCES.declare("background", 2)


def client() -> Any:
    """The process-wide Docker client (connects and pings once), or `BackendUnavailable`."""
    global _client
    with _client_lock:
        if _client is None:
            _client = docker_client()
        return _client


class ContainerSettings(BaseModel):
    """Everything that decides how a sandbox container is created; equal settings share a warm pool."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(DEFAULT_IMAGE, description="The sandbox image (`python -m sandboxes.images build`).")
    memory_mb: int = Field(
        2048, ge=16, description="Memory limit (`Limits.memory_mb`); swap limited to the same."
    )
    cpus: float = Field(1.0, gt=0, description="CPU quota in cores.")
    pids_limit: int = Field(
        128,
        ge=2,
        description="Processes and threads in the container (at most `max_processes` + 1 for its init).",
    )
    network: bool = Field(
        False,
        description="Network on (`Policy.network`): still no network of Docker's (``none``); the egress "
        "gateway's listener is put into the container's namespace, its only way out.",
    )
    read_only: bool = Field(
        True,
        description="Mount the root filesystem read-only (the working directory and /tmp stay writable).",
    )
    tmp_mb: int = Field(64, ge=1, description="Size of the tmpfs at /tmp.")
    user: str = Field(
        SANDBOX_UID,
        description="uid:gid the runner runs as. The image's /workspace must belong to it (the standard "
        "images: 1000:1000); never root unless you mean it. Not for shared containers (a uid per session).",
    )
    drop_capabilities: bool = Field(True, description="Drop every Linux capability.")
    no_new_privileges: bool = Field(True, description="Forbid gaining privileges (setuid binaries).")
    open_files: int = Field(1024, ge=16, description="RLIMIT_NOFILE of the container.")
    file_size_mb: int = Field(1024, ge=1, description="RLIMIT_FSIZE of the container: the largest file.")
    host_workdir: str | None = Field(
        None, description="A host directory bind-mounted as the working directory."
    )
    sessions_per_container: int = Field(
        1,
        ge=1,
        description="Sessions one container hosts, one after another. 1 gives every session a container "
        "of its own, removed at its close: the kernel boundary between any two sessions. Above 1 the "
        "container runs the session host (`docker.shared`): each session a fresh runner as a uid of its "
        "own, everything of it killed, removed and checked at its close, so a fresh session costs "
        "milliseconds instead of a container's life.",
    )

    preload: tuple[tuple[str, str], ...] = Field(
        (), description="Trusted modules (name, source) a shared container's host imports before any session."
    )

    @property
    def shared(self) -> bool:
        """Whether these containers host successive sessions (`docker.shared`)."""
        return self.sessions_per_container > 1

    def create_arguments(self, api: Any) -> dict[str, Any]:
        """Keyword arguments of the low-level `create_container` call."""
        from docker.types import Mount, Ulimit

        if self.host_workdir is not None:
            workspace = Mount(WORKDIR, self.host_workdir, type="bind")
        else:  # anonymous volume: gets /workspace's owner from the image, removed with the container
            workspace = Mount(WORKDIR, None, type="volume")
        mounts = [workspace, Mount(FORKS_DIR, None, type="volume")]
        memory_mb, command, user = self.memory_mb, list(RUNNER_COMMAND), self.user
        cap_add = None
        if self.shared:  # the session host: root with the four capabilities it needs (docker.shared)
            mounts.append(Mount(SESSIONS_DIR, None, type="volume"))
            memory_mb += MEMORY_HEADROOM_MB
            command, user, cap_add = list(SESSION_HOST_COMMAND), "0:0", list(SESSION_HOST_CAPABILITIES)
        file_size = self.file_size_mb * 1024 * 1024
        host_config = api.create_host_config(
            network_mode="none",  # with network on too: the egress gateway is the way out
            read_only=self.read_only,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={self.tmp_mb}m,mode=1777"},
            mounts=mounts,
            cap_drop=["ALL"] if self.drop_capabilities or self.shared else None,
            cap_add=cap_add,
            security_opt=["no-new-privileges"] if self.no_new_privileges else None,
            pids_limit=self.pids_limit,
            mem_limit=f"{memory_mb}m",
            memswap_limit=f"{memory_mb}m",
            nano_cpus=int(self.cpus * 1e9),
            ulimits=[
                Ulimit(name="nofile", soft=self.open_files, hard=self.open_files),
                Ulimit(name="fsize", soft=file_size, hard=file_size),
                Ulimit(name="core", soft=0, hard=0),
            ],
            oom_score_adj=1000,  # under host memory pressure, sandboxes die first
            init=True,
            ipc_mode="private",
        )
        return {
            "image": self.image,
            "command": command,
            "stdin_open": True,
            "detach": False,  # with stdin_open: StdinOnce, so a vanished parent closes the stdin
            "tty": False,
            "user": user,
            "working_dir": WORKDIR,
            "hostname": "sandbox",
            "environment": {"HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
            "labels": {LABEL_SANDBOX: "1", LABEL_OWNER: owner_label()},
            "host_config": host_config,
        }


class ContainerOptions(TypedDict, total=False):
    """The container options a caller sets (`DockerExecutor(**options)`, ``open_executor("docker",
    ...)``), typed for the type checker and an editor: their meanings, defaults and bounds are the
    `ContainerSettings` fields of the same names and types, declared there once (a unit test keeps
    the two equal). The other fields come from the executor's common options: `memory_mb` and
    `network` from the policy, `host_workdir` from `workdir`, `preload` from the executor's own."""

    image: str
    cpus: float
    pids_limit: int
    read_only: bool
    tmp_mb: int
    user: str
    drop_capabilities: bool
    no_new_privileges: bool
    open_files: int
    file_size_mb: int
    sessions_per_container: int


CONTAINER_OPTIONS: Final = frozenset(ContainerOptions.__annotations__)
"""The names of `ContainerOptions`, at run time."""


# ---------------------------------------------------------------------- the channel


class Demultiplexer:
    """Splits Docker's multiplexed attach stream (8-byte header: stream, 0, 0, 0, big-endian size)."""

    def __init__(self) -> None:
        self._raw = bytearray()
        self.stdout = bytearray()
        self.stderr_tail = bytearray()

    def feed(self, data: bytes) -> None:
        self._raw += data
        while len(self._raw) >= 8:
            stream, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + size:
                return
            payload = bytes(self._raw[8 : 8 + size])
            del self._raw[: 8 + size]
            if stream == 1:
                self.stdout += payload
            else:
                self.stderr_tail += payload
                del self.stderr_tail[:-STDERR_KEPT]


def stream_open(sock: socket.socket) -> bool:
    """Whether a container's attach stream is still open. No daemon call: the daemon ends the stream
    when the container stops, is removed, or the daemon itself goes away, so this is cheap and
    sufficient."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


async def stream_line(channel: SocketLineReader, demux: Demultiplexer, limit: int) -> bytes:
    """The next line of a container's stdout on its attach stream (`WorkerExited` at its end)."""
    while True:
        line = take_line(demux.stdout, limit)
        if line is not None:
            return line
        chunk = await channel.receive_some()
        if not chunk:
            raise WorkerExited("the container's attach stream ended")
        demux.feed(chunk)


def container_cgroup_dirs(container_id: str) -> tuple[str, str] | None:
    """The container's cpuacct and memory cgroup directories on this host, from its init's pid
    (blocking), or None where they cannot be read from here."""
    try:
        pid = client().api.inspect_container(container_id)["State"]["Pid"]
    except Exception:
        pid = 0
    return find_cgroup_dirs(pid) if pid else None


class Family:
    """The sessions sharing one container: its first session and the forks made in it (`fork()`).

    Members are plain tokens (a finalizer may leave on a worker's behalf). Only the last member to
    leave removes the container (or, in a shared container, calls `finish` with its stream: the
    session host then ends and cleans the family's uid); the others end their own runner's
    processes (`forkrelay.py`)."""

    _tokens = itertools.count(1)

    def __init__(self, container_id: str, finish: Callable[[socket.socket], None] | None = None) -> None:
        self.container_id = container_id
        self.members: set[int] = set()
        self.lock = threading.Lock()
        self.finish = finish

    def join(self) -> int:
        with self.lock:
            token = next(self._tokens)
            self.members.add(token)
            return token

    def leave(self, token: int) -> bool:
        """Remove `token`; True when nobody is left (the caller then removes the container)."""
        with self.lock:
            self.members.discard(token)
            return not self.members


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
            self._close_attach()  # the socket itself closes in `remove_container` / `_leave`, in their order
            if self.family is None:
                remove_container(self.container_id, self.sock)
            else:
                _leave(self.family, self.member, self.user, self.sock, self._ending())

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
        return ForkPlan(f"{FORKS_DIR}/{os.urandom(8).hex()}", "listen")

    async def hand_over(self, plan: ForkPlan) -> None:
        path, secret, pid = listen_answer(plan)
        if self.runner_pid is None:
            self.runner_pid = pid
        plan.state["relay"] = await anyio.to_thread.run_sync(self._connect_relay, path, secret)

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
                attach = _start_relay(self.container_id, self.user)
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
                self._spare = RESOURCES.submit("background", _start_relay, self.container_id, self.user)
            except RuntimeError:  # interpreter shutting down
                pass

    def _drop_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:  # closing its stream ends it (end-of-file before its first line)
            spare.add_done_callback(_close_relay)

    def forked(self, plan: ForkPlan, pid: int) -> ForkedDockerWorker:
        if self.family is None:
            self.family = Family(self.container_id)
            self.member = self.family.join()
            # From now on a collected worker leaves the family instead of removing the container.
            self._finalizer.detach()
            self._finalizer = weakref.finalize(
                self, _leave_later, self.family, self.member, self.user, self.sock, self._ending()
            )
            self._finalizer.atexit = False
        child = ForkedDockerWorker(
            self.container_id, plan.state.pop("relay"), self.user, self.family, pid, plan.workdir
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
        self, container_id: str, attach: Any, user: str, family: Family, pid: int, workdir: str
    ) -> None:
        self.container_id = container_id
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
        self._cgroups = None
        self._spare = None
        self.stats_peak = None
        self._finalizer = weakref.finalize(self, _leave_later, family, self.member, user, raw, self._ending())
        self._finalizer.atexit = False
        _LIVE_FORKS.add(self)

    def __repr__(self) -> str:
        return f"<ForkedDockerWorker {self.container_id[:12]} pid {self.runner_pid}>"

    def usage_probe(self) -> None:  # type: ignore[override]
        # The container's cgroup counts the whole family: no figure of this session alone.
        return None

    def _ending(self) -> tuple[str, ...]:
        return ("end", str(self.runner_pid), self.workdir)

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


def drop_relay(plan: ForkPlan) -> None:
    """Close the relay of a fork given up (it then ends; the runner removed the directory itself)."""
    relay = plan.state.pop("relay", None)
    if relay is not None:
        try:
            getattr(relay, "_sock", relay).close()
        except OSError:
            pass


def listen_answer(plan: ForkPlan) -> tuple[str, str, int]:
    """The socket path, secret and runner pid of a ``listen`` fork's answer, checked (`ForkError`)."""
    path, secret, pid = plan.answer.get("path"), plan.answer.get("secret"), plan.answer.get("pid")
    if (
        not isinstance(path, str)
        or not isinstance(secret, str)
        or isinstance(pid, bool)
        or not isinstance(pid, int)
        or not 1 < pid < 1 << 22  # Linux's PID_MAX_LIMIT; 1 is the container's init
        or any(c in path for c in "\n ")  # one line "PATH SECRET" for the relay
        or not secret.isalnum()
    ):
        raise ForkError(f"the runner's fork_channel answer is malformed: {str(plan.answer)[:200]}")
    return path, secret, pid


def start_relay(container_id: str, user: str, path: str, secret: str) -> Any:
    """A fresh relay for a fork, told where to connect (blocking): its attach socket."""
    attach = _start_relay(container_id, user)
    raw: socket.socket = getattr(attach, "_sock", attach)
    try:
        raw.sendall(f"{path} {secret}\n".encode())
    except OSError as exc:
        raw.close()
        raise ForkError("the fork's relay closed its stream at once") from exc
    return attach


def _start_relay(container_id: str, user: str) -> Any:
    """``forkrelay.py relay`` in the container, as the session's user: its attach socket (blocking).
    It waits for its first line (where to connect) on that stream."""
    import docker.errors

    api = client().api
    try:
        created = api.exec_create(
            container_id, [*HELPER_COMMAND, "relay"], stdin=True, stdout=True, stderr=True, user=user
        )
        return api.exec_start(created["Id"], socket=True)
    except docker.errors.APIError as exc:
        raise ForkError(f"Docker could not start the fork's relay: {exc.explanation or exc}") from exc


def _close_relay(future: concurrent.futures.Future[Any]) -> None:
    try:
        attach = future.result()
    except Exception:
        return
    try:
        getattr(attach, "_sock", attach).close()
    except OSError:
        pass


def run_helper(container_id: str, user: str, args: tuple[str, ...]) -> None:
    """Run ``forkrelay.py ARGS`` in the container as `user` and wait for it (blocking). Never raises."""
    try:
        api = client().api
        created = api.exec_create(container_id, [*HELPER_COMMAND, *args], stdout=True, stderr=True, user=user)
        api.exec_start(created["Id"])  # returns once the helper has exited
    except Exception:  # the container is gone already, or the daemon is down
        pass


def _leave(family: Family, member: int, user: str, sock: socket.socket, ending: tuple[str, ...]) -> None:
    """One session of `family` ends (blocking): the last removes the container, any other its own
    processes (`ending`: the helper's arguments), then its stream closes."""
    if family.leave(member):
        if family.finish is not None:
            family.finish(sock)
        else:
            remove_container(family.container_id, sock)
        return
    run_helper(family.container_id, user, ending)
    try:
        sock.close()
    except OSError:
        pass


def _leave_later(
    family: Family, member: int, user: str, sock: socket.socket, ending: tuple[str, ...]
) -> None:
    """Finalizer of a family member nobody closed: `_leave` in the background."""
    try:
        RESOURCES.submit("background", _leave, family, member, user, sock, ending)
    except RuntimeError:  # interpreter shutting down
        _leave(family, member, user, sock, ending)


_LIVE_FORKS: weakref.WeakSet[DockerWorker] = weakref.WeakSet()
"""Forked sessions of this process; their containers are removed at interpreter exit."""


# ---------------------------------------------------------------------- containers: start, remove, pool

_LIVE: weakref.WeakValueDictionary[str, DockerWorker] = weakref.WeakValueDictionary()
"""Containers of sessions and pools of this process, removed at interpreter exit. Weak, so that an
executor nobody closed can still be garbage collected (its finalizer removes the container)."""


CGROUP_ROOT = "/sys/fs/cgroup"


class ContainerProbe(UsageProbe):
    """`session.UsageProbe` for a container: its cgroup v1 as the host sees it (``cpuacct.usage``,
    ``cpuacct.stat``, ``memory.max_usage_in_bytes``, reset before each run for a per-run peak),
    or, where this process cannot read the host's cgroups (it runs in a container itself), the
    daemon's stats of the container (CPU exact; memory the session's peak)."""

    def __init__(self, worker: DockerWorker | SharedSessionWorker) -> None:
        self.worker = worker
        self.started = 0.0
        self.before: tuple[int, CpuReading] | None = None
        self.scope = "session"

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._start)
        self.started = time.perf_counter()

    def _start(self) -> None:
        paths = self.worker.cgroup_dirs()
        if paths is not None:
            self.scope = (
                "run" if _write(os.path.join(paths[1], "memory.max_usage_in_bytes"), "0") else "session"
            )
            self.before = _cgroup_cpu(paths[0])
        else:
            self.before = _stats_cpu(self.worker.container_id)

    async def stop(self) -> RunUsage | None:
        wall = time.perf_counter() - self.started
        return await anyio.to_thread.run_sync(self._stop, wall)

    def _stop(self, wall: float) -> RunUsage | None:
        paths = self.worker.cgroup_dirs()
        peak: int | None = None
        if paths is not None:
            after = _cgroup_cpu(paths[0])
            text = _read_text(os.path.join(paths[1], "memory.max_usage_in_bytes"))
            peak = int(text) if text and text.strip().isdigit() else None
            source = "cgroup"
        else:
            after = _stats_cpu(self.worker.container_id, self.worker)
            source = "docker-stats"
        if after is None or self.before is None:
            return make_usage(None, None, peak, wall, self.scope, source, cpu_exact=True, peak_exact=True)
        if paths is None:
            peak = self.worker.stats_peak
        total = max(0, after[0] - self.before[0]) / 1e9
        user, system = split_cpu(total, CpuReading(*after[1].since(self.before[1])))
        return make_usage(
            user, system, peak, wall, self.scope, source, cpu_exact=True, peak_exact=True, total=total
        )


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return None


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(text)
        return True
    except OSError:
        return False


def _cgroup_cpu(directory: str) -> tuple[int, CpuReading] | None:
    usage = _read_text(os.path.join(directory, "cpuacct.usage"))
    stat = _read_text(os.path.join(directory, "cpuacct.stat"))
    if not usage or not stat or not usage.strip().isdigit():
        return None
    return int(usage), parse_cpuacct_stat(stat)


def _stats_cpu(
    container_id: str, worker: DockerWorker | SharedSessionWorker | None = None
) -> tuple[int, CpuReading] | None:
    """The daemon's one-shot stats: CPU in ns (total, user, kernel); with `worker`, the memory peak is
    kept on it (cgroup v1's max_usage, of the container's life)."""
    try:
        stats = client().api.stats(container_id, stream=False, one_shot=True)
        usage = stats["cpu_stats"]["cpu_usage"]
    except Exception:
        return None
    if worker is not None:
        peak = (stats.get("memory_stats") or {}).get("max_usage")
        worker.stats_peak = int(peak) if isinstance(peak, int) else None
    return int(usage.get("total_usage", 0)), CpuReading(
        usage.get("usage_in_usermode", 0) / 1e9, usage.get("usage_in_kernelmode", 0) / 1e9
    )


def find_cgroup_dirs(pid: int, root: str = CGROUP_ROOT) -> tuple[str, str] | None:
    """The cpuacct and memory cgroup v1 directories of host process `pid`, if this process can read them."""
    text = _read_text(f"/proc/{pid}/cgroup")
    if not text:
        return None
    paths = cgroup_paths(text)
    found = []
    for controller, mounts in (
        ("cpuacct", ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")),
        ("memory", ("memory",)),
    ):
        relative = paths.get(controller)
        if relative is None:
            return None
        directory = next(
            (
                os.path.join(root, mount, relative.lstrip("/"))
                for mount in mounts
                if os.path.isdir(os.path.join(root, mount, relative.lstrip("/")))
            ),
            None,
        )
        if directory is None:
            return None
        found.append(directory)
    return found[0], found[1]


def remove_container(container_id: str, sock: socket.socket | None) -> None:
    """Close `sock` and remove the container and its volumes (blocking; never raises)."""
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass
    try:
        client().api.remove_container(container_id, force=True, v=True)
    except Exception:  # already gone, or the daemon is down (then stdin_once stops it anyway)
        pass


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


def create_and_attach(settings: ContainerSettings) -> tuple[str, Any]:
    """Create a container and attach to its stdio before it starts, so no byte is missed (blocking):
    its id and the SDK's attach socket."""
    import docker.errors

    api = client().api
    try:
        created = api.create_container(**settings.create_arguments(api))
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


def _remove_off_path(worker: DockerWorker) -> None:
    RESOURCES.submit("background", worker.remove_now)


CONTAINERS: WarmPool[ContainerSettings, DockerWorker] = WarmPool(
    DockerWorker.socket_open, _remove_off_path, oldest_first=True
)
"""Started containers (one session each) waiting for sessions, per settings."""


def take_pooled(settings: ContainerSettings) -> DockerWorker | None:
    """A warm container for `settings`, if the pool has a live one (dead ones are removed)."""
    return CONTAINERS.take(settings)


def _started(settings: ContainerSettings) -> DockerWorker | None:
    try:
        return start_container(settings)
    except Exception:  # the next session's cold start reports the problem properly
        return None


def refill(settings: ContainerSettings, size: int) -> None:
    """Top up the pool of `settings` to `size` in a background thread; nobody waits for it."""
    RESOURCES.submit("background", fill, CONTAINERS, settings, size, functools.partial(_started, settings))


def pooled_count(settings: ContainerSettings) -> int:
    """How many warm containers wait for `settings` (benchmarks wait for a full pool with it)."""
    return CONTAINERS.count(settings)


def drain_pools() -> None:
    """Remove every pooled container of this process (blocking)."""
    for worker in CONTAINERS.drain():
        worker.remove_now()


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
    if _client is None:
        return
    drain_pools()
    families = {w.container_id: w for w in list(_LIVE_FORKS) if w.family is not None}
    for worker in list(_LIVE.values()):
        worker.remove_now()
    for container_id, worker in families.items():  # at exit, every container goes with its family
        worker._finalizer.detach()
        remove_container(container_id, worker.sock)
