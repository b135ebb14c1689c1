"""The session host: the main process of a shared sandbox container, serving successive sessions.

A container per session costs a container's life per session (create, start, the interpreter's
imports, stop, remove: hundreds of milliseconds). In a shared container this process, started once,
pays for the imports and then hosts one session after another, each a fresh runner forked from it:

- its own unprivileged uid and gid (chosen by the parent, unique on the host), no capabilities, an
  empty bounding set, no new privileges (the container's), no supplementary groups;
- its own working directory ``/sessions/<random>`` and temporary directory ``/tmp/<random>``
  (mode 0700, HOME and TMPDIR), a fresh process environment, a new process session;
- and at its end: every process of its uid killed, everything it owned in the container's writable
  places (``/tmp``, ``/dev/shm``, ``/dev/mqueue``, ``/sessions``) removed, its System V IPC objects
  removed — then *checked*, and the parent told whether the container is as it was. A container
  whose clean-up cannot be proved is recycled by the parent, never handed to another session.

The host runs as root with only CAP_SETUID, CAP_SETGID, CAP_SETPCAP (to empty a session's bounding
set) and CAP_KILL (to kill the runner at once); it never runs user code. Standard library only.

The stream: the container's stdin/stdout (Docker's attach socket on the parent's side). Lines that
start with ``!`` are the parent's requests to the host; every other line goes to the open session's
runner, and everything the runner writes comes back as it is. The host's own messages are
``\\n!{json}\\n`` (the leading newline ends any half line a session left) and carry the nonce of the
request they answer, so nothing a session writes can pass for one. A close may carry the next
session's open: once the container is proved clean, that session is started at once and waits for
its parent, so taking a warm container costs no round trip to the host:

    !{"op": "open", "nonce": N, "uid": U}          -> {"nonce": N, "pid", "workdir", "tmpdir"} | {"nonce": N, "error"}
    !{"op": "close", "nonce": N[, "next": OPEN]}    -> {"nonce": N, "closed": true, "clean": bool, "problems": [...],
                                                      "seconds": S[, "next": OPEN's answer]}
    !{"op": "preload", "nonce": N, "modules": [[name, source], ...]}  (before any session)
                                                  -> {"nonce": N, "ok": true} | {"nonce": N, "error"}
    !{"op": "write", "nonce": N, "path", "data"}   -> {"nonce": N, "ok": true} | {"nonce": N, "error", "missing"}
    !{"op": "read", "nonce": N, "path", "max_bytes": M}
                                                  -> {"nonce": N, "data", "more": true}... then {"nonce": N, "data"}
                                                     | {"nonce": N, "too_large": true} | {"nonce": N, "error", "missing"}
    (the runner exited)                           -> {"nonce": <the open's N>, "exited": status}

With a local daemon the parent has each runner connect to a socket of its own instead (the open's
``"channel"``: its directory's name in ``/run/kodeagent/channels``, bind-mounted read-only from the
parent; `docker.channel`): that runner's bytes never pass this host or dockerd, and the stream
carries only the host's requests and messages. The ready message's ``channels`` says whether this
host sees the parent's directory (its token file, named by ``KODEAGENT_CHANNELS``).

Files are placed and read *as the session's uid* below its working directory without following a
symbolic link anywhere on the way (`proctools.open_beneath`), as on the host backend. End-of-file on
stdin ends the host (and so the container).
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import secrets
import selectors
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SESSIONS = "/sessions"
CHANNELS = "/run/kodeagent/channels"
"""The parent's channels directory, bind-mounted read-only (`docker.channel`): one 0700 directory per
session, its uid's, holding the socket the parent listens on."""
WRITABLE = ("/tmp", "/dev/shm", "/dev/mqueue", SESSIONS)
"""Every place a session can write in the container (the root filesystem is read-only; /workspace
and /forks belong to the container-per-session mode's user and are closed to session uids)."""
REAP_DEADLINE = 3.0
"""Seconds the clean-up waits for a killed session's processes to be gone before it gives up."""
PR_CAPBSET_DROP = 24
PR_SET_DUMPABLE = 4
IPC_RMID = 0
ENV = {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}

_libc = ctypes.CDLL(None, use_errno=True)


def _runner() -> Any:
    """`runner.py`, loaded by path under its sibling name; it brings the runtime's one loader
    (`siblings.py`, as ``runner.siblings``), which the host takes from it."""
    import importlib.util

    name = "_kodeagent_runner"
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "runner.py"))
    assert spec is not None and spec.loader is not None
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def say(message: dict[str, Any]) -> None:
    _write_all(1, b"\n!" + json.dumps(message).encode() + b"\n")


# ---------------------------------------------------------------------- becoming a session


def become_user(uid: int) -> None:
    """Drop to `uid` for good: an empty bounding set first (needs CAP_SETPCAP), then the ids; the
    kernel clears every capability when all of a root process's uids become non-zero."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"cannot drop capability {cap} from the bounding set")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("CapEff:", "CapPrm:", "CapBnd:", "CapAmb:")) and int(line.split()[1], 16):
                raise OSError(f"the session still holds capabilities ({line.strip()})")


def start_session(
    runner: Any, uid: int, channel: int | None, workdir: str, tmpdir: str, socket_path: str | None = None
) -> None:
    """In a forked child of the host: become the session's user and then its runner, on `channel`
    (the host's relay) or, with `socket_path`, on the parent's own socket (`docker.channel`),
    connected *as the session's uid*: the parent checks that identity before it reads a byte."""
    connected = socket_path is None
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if channel is not None:
            os.dup2(channel, 0)
            os.dup2(channel, 1)
        os.closerange(3, 1 << 16)  # the host's selector, pidfds and old sockets stay with the host
        become_user(uid)
        if socket_path is not None:
            import socket

            link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            link.connect(socket_path)
            fd = link.detach()
            os.dup2(fd, 0)
            os.dup2(fd, 1)
            os.close(fd)
            connected = True
        # Dropping root without an exec left the process non-dumpable: its /proc entries (environ,
        # fd, mem) would be root's. Its own uid may read them, as in a container per session.
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        os.umask(0o077)
        os.mkdir(workdir, 0o700)
        os.mkdir(tmpdir, 0o700)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update(ENV, HOME=tmpdir, TMPDIR=tmpdir)
        runner.main(["--subreaper"])
    except BaseException as exc:  # noqa: BLE001 - reported as the runner's fatal message
        line = json.dumps({"op": "fatal", "message": f"the session could not start: {exc}"}) + "\n"
        try:
            _write_all(1, line.encode())
        except OSError:
            pass
    finally:
        # Not connected: nobody reads that message (fd 1 is /dev/null); the exit code says it.
        os._exit(0 if connected else 3)


# ---------------------------------------------------------------------- ending a session


def processes_of(uid: int) -> list[int]:
    """Pids in this container whose real, effective or saved uid is `uid` (zombies included)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as status:
                for line in status:
                    if line.startswith("Uid:"):
                        if str(uid) in line.split()[1:4]:
                            found.append(int(name))
                        break
        except OSError:
            continue
    return found


def owned_entries(uid: int) -> list[str]:
    """Top-level entries of the writable places that belong to `uid` (nothing else of a session's
    can exist: the only directories it can write in are these and its own)."""
    found = []
    for place in WRITABLE:
        try:
            names = os.listdir(place)
        except OSError:
            continue
        for name in names:
            path = os.path.join(place, name)
            try:
                if os.lstat(path).st_uid == uid:
                    found.append(path)
            except OSError:
                continue
    return found


def ipc_objects(uid: int) -> list[tuple[str, int]]:
    """System V IPC objects (kind, id) owned or created by `uid` in the container's IPC namespace."""
    found = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as table:
                header = table.readline().split()
                for row in table:
                    fields = dict(zip(header, row.split(), strict=False))
                    if str(uid) in (fields.get("uid"), fields.get("cuid")):
                        found.append(
                            (kind, int(fields.get("shmid") or fields.get("msqid") or fields["semid"]))
                        )
        except (OSError, KeyError, ValueError):
            continue
    return found


def _remove_tree(path: str) -> None:
    """Remove `path` (its owner's: the caller runs as that uid), making its directories writable
    first. Walked by directory descriptors, never by path names, so a tree deeper than PATH_MAX
    goes too (a tree deeper than the open-files limit does not: the check after reports it)."""
    # O_PATH: /sessions grants others search, not read (nobody may list it)
    parent = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        _remove_at(parent, os.path.basename(path))
    finally:
        os.close(parent)


def _remove_at(parent: int, name: str) -> None:
    """Remove entry `name` of directory `parent` and everything below it (iteratively)."""
    try:
        os.unlink(name, dir_fd=parent)
        return
    except FileNotFoundError:
        return
    except IsADirectoryError:
        pass
    stack: list[tuple[int, str, int]] = []  # (parent's fd, name in it, the directory's own fd)

    def descend(into: int, entry: str) -> None:
        os.chmod(entry, 0o700, dir_fd=into)  # a directory: the unlink said so, and no process is left
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=into)
        stack.append((into, entry, fd))

    descend(parent, name)
    try:
        while stack:
            into, entry, fd = stack[-1]
            with os.scandir(fd) as entries:
                child = next((item.name for item in entries), None)
            if child is None:
                stack.pop()
                os.close(fd)
                os.rmdir(entry, dir_fd=into)
                continue
            try:
                os.unlink(child, dir_fd=fd)
            except IsADirectoryError:
                descend(fd, child)
    finally:
        for _, _, fd in stack:
            os.close(fd)


class _AccessAs:
    """Within it, this (single-threaded) process reaches files as `uid` (its filesystem uid and
    gid), so the clean-up removes a session's files with exactly the session's rights and no more:
    whatever links or names a session left, it cannot make the clean-up remove anyone else's file.
    No fork (a helper process cost 10-50 ms of a session's close under load); signals and ``/proc``
    are not reached through the filesystem uid, so nothing of the session may act on this host."""

    def __init__(self, uid: int) -> None:
        self.uid = uid

    def __enter__(self) -> None:
        _libc.setfsgid(self.uid)
        _libc.setfsuid(self.uid)
        # setfsuid reports no error: ask again (an invalid id changes nothing and answers the current)
        if _libc.setfsuid(-1) != self.uid or _libc.setfsgid(-1) != self.uid:
            self.__exit__()
            raise OSError(f"cannot act as uid {self.uid} (setfsuid refused)")

    def __exit__(self, *_: object) -> None:
        _libc.setfsuid(0)
        _libc.setfsgid(0)


def _sweep_as(uid: int, paths: list[str]) -> None:
    """Remove `uid`'s files with its rights (`_AccessAs`), then its System V IPC objects (as its
    effective uid: IPC ownership is checked on that, not on the filesystem uid)."""
    with _AccessAs(uid):
        for path in paths:
            try:
                _remove_tree(path)
            except OSError:
                pass  # the check after says so
    objects = ipc_objects(uid)
    if not objects:
        return
    os.seteuid(uid)  # its processes are dead: nothing of the session is there to act on this host
    try:
        for kind, ident in objects:
            if kind == "shm":
                _libc.shmctl(ident, IPC_RMID, None)
            elif kind == "msg":
                _libc.msgctl(ident, IPC_RMID, None)
            else:
                _libc.semctl(ident, 0, IPC_RMID)
    finally:
        os.seteuid(0)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True  # gone


def kill_all(uid: int) -> None:
    """SIGKILL every live process of `uid` (CAP_KILL), again until none is left: a process that forks
    meanwhile is caught in the next round, and RLIMIT_NPROC bounds how many it can make."""
    for _ in range(200):
        live = [pid for pid in processes_of(uid) if not _zombie(pid)]
        if not live:
            return
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


PARTS: dict[str, float] = {}
"""Seconds the last close spent in each part (in its answer: where a clean-up's time goes)."""


def clean(uid: int, extra: list[str]) -> list[str]:
    """End everything of `uid` in this container; the problems left (empty: the container is as it was)."""
    started = time.perf_counter()
    kill_all(uid)
    paths = sorted(set(owned_entries(uid)) | set(extra))  # listed as root: /sessions is not listable
    swept = time.perf_counter()
    _sweep_as(uid, paths)
    checked = time.perf_counter()
    deadline = time.monotonic() + REAP_DEADLINE
    while (left := processes_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.005)  # killed: the init (or the runner's exit) reaps them
    PARTS.update(kill=swept - started, sweep=checked - swept, reaped=time.perf_counter() - checked)
    problems = [f"process {p} of the session is still there" for p in left]
    problems += [f"{path} could not be removed" for path in owned_entries(uid)]
    problems += [f"{path} could not be removed" for path in extra if os.path.lexists(path)]
    problems += [f"System V {kind} object {ident} could not be removed" for kind, ident in ipc_objects(uid)]
    return problems


# ---------------------------------------------------------------------- files, as the session


FILE_CHUNK = 1 << 20
"""Bytes of a file read per answer line: the parent's line bound and this host's memory stay small."""


def file_op(
    request: dict[str, Any], session: Session, proctools: Any, answer: Callable[[dict[str, Any]], None]
) -> None:
    """Place or read a file below the session's working directory, as its uid, following no link.

    Done by a child as the session's uid, whose answer lines (JSON) go to `answer` one by one as they
    come: a read sends the file in `FILE_CHUNK` pieces (``more`` on all but the last) and stops at
    ``max_bytes`` + 1 bytes (``too_large``), so neither side ever holds more than a piece of it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            become_user(session.uid)
            if request["op"] == "write":
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                fd = proctools.open_beneath(session.workdir, request["path"], flags)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(base64.b64decode(request["data"]))
                _answer_line(write_end, {"ok": True})
            else:
                fd = proctools.open_beneath(session.workdir, request["path"], os.O_RDONLY)
                try:
                    _send_file(fd, int(request.get("max_bytes", 1 << 62)), write_end)
                finally:
                    os.close(fd)
        except proctools.BeneathError as exc:
            _answer_line(write_end, {"error": str(exc), "missing": exc.missing})
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            missing = isinstance(exc, FileNotFoundError)
            _answer_line(write_end, {"error": f"{type(exc).__name__}: {exc}", "missing": missing})
        finally:
            os._exit(0)
    os.close(write_end)
    finished = False
    with os.fdopen(read_end, "rb") as reader:
        for line in reader:
            try:
                message = dict(json.loads(line))
            except ValueError:
                break
            answer(message)
            if not message.get("more"):
                finished = True
                break
        for _ in reader:  # a child past its last answer: drained, so it never blocks on the pipe
            pass
    os.waitpid(pid, 0)
    if not finished:
        answer({"error": "the file helper ended without an answer", "missing": False})


def _send_file(fd: int, max_bytes: int, out: int) -> None:
    """The file as answer lines, counted as read: at most `max_bytes` + 1 bytes are ever read (a size
    the file states, or one that grows while it is read, changes nothing)."""
    left = max_bytes + 1
    while True:
        chunk = os.read(fd, min(FILE_CHUNK, left)) if left else b""
        left -= len(chunk)
        if not left:
            _answer_line(out, {"too_large": True})
            return
        if not chunk:
            _answer_line(out, {"data": ""})
            return
        _answer_line(out, {"data": base64.b64encode(chunk).decode(), "more": True})


def _answer_line(fd: int, message: dict[str, Any]) -> None:
    _write_all(fd, json.dumps(message).encode() + b"\n")


# ---------------------------------------------------------------------- the host


class Zygote:
    """The host's child forked before any session, which forks every session's runner.

    The host relays every byte of every session (code, output, uploads), and a forked process starts
    with a copy of its parent's memory, freed buffers included: a runner forked from the host could
    read the previous session's bytes out of its own address space. The zygote is forked once, with
    the imports and preloads done and before any session, then touches no session's data: what a
    runner inherits from it is the same for every session. It reports each runner's exit.

    Its socket (SOCK_SEQPACKET): the host sends ``{"uid", "workdir", "tmpdir"}`` with the session's
    channel attached and gets ``{"pid": N}``; ``{"exited": N, "status": S}`` comes when a runner ends.
    """

    def __init__(self, runner: Any) -> None:
        import socket

        if not hasattr(os, "pidfd_open"):
            raise OSError("this system has no pidfd_open (Linux 5.3 or later is needed)")
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            self.sock.close()
            _zygote_main(runner, theirs)
        theirs.close()
        self.statuses: dict[int, int] = {}  # exits reported and not yet taken

    def spawn(self, uid: int, workdir: str, tmpdir: str, channel: int | str) -> int:
        """Start a runner on `channel`: a descriptor of the host's relay, or the path of the
        parent's socket to connect to."""
        import socket

        order: dict[str, Any] = {"uid": uid, "workdir": workdir, "tmpdir": tmpdir}
        if isinstance(channel, str):
            self.sock.send(json.dumps({**order, "socket": channel}).encode())
        else:
            socket.send_fds(self.sock, [json.dumps(order).encode()], [channel])
        while True:
            message = self.receive()
            if "pid" in message:
                return int(message["pid"])

    def receive(self, timeout: float | None = None, block: bool = True) -> dict[str, Any]:
        """The zygote's next message ({} when `timeout` passed, or none is waiting and not `block`);
        exits are also kept in `statuses`."""
        self.sock.settimeout(timeout if block else 0.0)
        try:
            data = self.sock.recv(1 << 16)
        except (TimeoutError, BlockingIOError):
            return {}
        finally:
            self.sock.settimeout(None)
        if not data:
            raise OSError("the session host's zygote is gone")
        message = dict(json.loads(data))
        if "exited" in message:
            self.statuses[int(message["exited"])] = int(message["status"])
        return message

    def wait_exit(self, pid: int, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while pid not in self.statuses:
            left = deadline - time.monotonic()
            if left <= 0 or not self.receive(left):
                return None
        return self.statuses.pop(pid)


def _zygote_main(runner: Any, control: Any) -> None:
    """The zygote's loop (in the forked child; never returns)."""
    import socket

    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the container's stream is the host's alone
        os.dup2(null, 1)
        for fd in range(3, 1 << 16):
            if fd != control.fileno():
                try:
                    os.close(fd)
                except OSError:
                    pass
        selector = selectors.DefaultSelector()
        selector.register(control, selectors.EVENT_READ, None)
        while True:
            for key, _ in selector.select():
                if key.data is None:
                    message, fds, _flags, _address = socket.recv_fds(control, 1 << 16, 1)
                    if not message:
                        return  # the host is gone
                    request = json.loads(message)
                    channel = fds[0] if fds else None
                    pid = os.fork()
                    if pid == 0:
                        start_session(
                            runner,
                            int(request["uid"]),
                            channel,
                            request["workdir"],
                            request["tmpdir"],
                            request.get("socket"),
                        )
                    for fd in fds:
                        os.close(fd)
                    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
                    control.send(json.dumps({"pid": pid}).encode())
                else:
                    selector.unregister(key.fileobj)
                    os.close(key.fd)
                    _, status = os.waitpid(key.data, 0)
                    control.send(json.dumps({"exited": key.data, "status": status}).encode())
    finally:
        os._exit(0)


class Session:
    """The one session this host serves now."""

    def __init__(
        self, nonce: str, uid: int, pid: int, channel: int | None, workdir: str, tmpdir: str
    ) -> None:
        # `channel`: the host's end of the runner's relay; None when the runner is on its own socket
        self.nonce, self.uid, self.pid, self.channel = nonce, uid, pid, channel
        self.workdir, self.tmpdir = workdir, tmpdir
        self.exited: int | None = None

    def end(self, zygote: Zygote) -> list[str]:
        """Kill the runner at once, then everything else of the session; the problems left."""
        started = time.perf_counter()
        if self.exited is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.exited = zygote.wait_exit(self.pid, REAP_DEADLINE)
        else:
            zygote.statuses.pop(self.pid, None)
        PARTS["runner"] = time.perf_counter() - started
        if self.channel is not None:
            os.close(self.channel)
        return clean(self.uid, [self.workdir, self.tmpdir])


class Host:
    def __init__(self) -> None:
        self.runner = _runner()
        self.proctools = self.runner.siblings.load("proctools")
        self.runner.preimport()
        self.selector = selectors.DefaultSelector()
        self.selector.register(0, selectors.EVENT_READ, "parent")
        self._zygote: Zygote | None = None
        self.session: Session | None = None
        self.served = False  # a session was started (preloading is over)
        self.inbox = bytearray()
        self.at_line_start = True

    @property
    def zygote(self) -> Zygote:
        """Forked at the first session's open: after every import and preload, before any session."""
        if self._zygote is None:
            self._zygote = Zygote(self.runner)
            self.selector.register(self._zygote.sock, selectors.EVENT_READ, "zygote")
        return self._zygote

    def serve(self) -> None:
        token = os.environ.get("KODEAGENT_CHANNELS", "")
        # The parent's channels directory is ours only if its token file is there (a daemon that
        # does not see the parent's files mounts an empty directory of its own).
        channels = bool(token.isalnum() and os.path.isfile(os.path.join(CHANNELS, token)))
        say({"ready": True, "pid": os.getpid(), "channels": channels})
        while True:
            for key, _ in self.selector.select():
                # One wake-up can report several sources, and handling one may change another: a
                # close takes the zygote's report of the runner's exit itself (`wait_exit`) and
                # drops or replaces the runner's relay. Such an event is stale: acting on it would
                # block on a read nothing will ever answer.
                if self.selector.get_map().get(key.fd) is not key:
                    continue
                if key.data == "parent":
                    data = os.read(0, 1 << 20)
                    if not data:
                        if self.session is not None:
                            self.session.end(self.zygote)
                        return
                    self._from_parent(data)
                elif key.data == "runner":
                    self._from_runner()
                elif key.data == "zygote":
                    try:
                        if not self.zygote.receive(block=False):
                            continue  # its message was taken meanwhile (a close's `wait_exit`)
                    except OSError:  # killed from outside: no more sessions here, so end the container
                        if self.session is not None:
                            self.session.exited = self.session.exited or 0
                            self.session.end(self.zygote)
                        return
                    session = self.session
                    if session is not None and session.pid in self.zygote.statuses:
                        self._runner_exited(self.zygote.statuses.pop(session.pid))

    def _from_parent(self, data: bytes) -> None:
        """Forward runner lines as they come; collect and act on the host's own (``!``) lines."""
        self.inbox += data
        while self.inbox:
            if self.at_line_start and self.inbox[:1] == b"!":
                end = self.inbox.find(b"\n")
                if end < 0:
                    return  # a request still arriving
                request = bytes(self.inbox[1:end])
                del self.inbox[: end + 1]
                self._handle(json.loads(request))
                continue
            end = self.inbox.find(b"\n")
            part = bytes(self.inbox) if end < 0 else bytes(self.inbox[: end + 1])
            del self.inbox[: len(part)]
            self.at_line_start = end >= 0
            # A runner on its own socket gets nothing from the stream (and never a stray line).
            session = self.session
            if session is not None and session.exited is None and session.channel is not None:
                try:
                    _write_all(session.channel, part)
                except OSError:
                    pass  # the runner is gone; its exit is reported

    def _from_runner(self) -> None:
        session = self.session
        assert session is not None and session.channel is not None
        try:
            data = os.read(session.channel, 1 << 20)
        except OSError:
            data = b""
        if data:
            _write_all(1, data)
            return
        _unregister(self.selector, session.channel)  # its exit is the zygote's to report

    def _runner_exited(self, status: int) -> None:
        session = self.session
        if session is None or session.exited is not None:
            return
        if session.channel is not None:
            _unregister(self.selector, session.channel)
            os.set_blocking(session.channel, False)
            try:  # what it wrote before it died goes first (not waiting for a child that still holds it)
                while data := os.read(session.channel, 1 << 20):
                    _write_all(1, data)
            except OSError:
                pass
        session.exited = status
        say({"nonce": session.nonce, "exited": status})

    def _handle(self, request: dict[str, Any]) -> None:
        op, nonce = request.get("op"), request.get("nonce")
        if op == "open":
            say({"nonce": nonce, **self._open(str(nonce), int(request["uid"]), request.get("channel"))})
        elif op == "close":
            session, self.session = self.session, None
            started = time.perf_counter()
            problems = ["no session was open"] if session is None else self._close(session)
            seconds = round(time.perf_counter() - started, 6)
            reply = {
                "nonce": nonce,
                "closed": True,
                "clean": not problems,
                "problems": problems,
                "seconds": seconds,
                "parts": {name: round(value, 6) for name, value in PARTS.items()},
            }
            following = request.get("next")
            if not problems and isinstance(following, dict):  # the next session, ready before it is asked for
                reply["next"] = {
                    "nonce": following.get("nonce"),
                    **self._open(
                        str(following.get("nonce")), int(following["uid"]), following.get("channel")
                    ),
                }
            say(reply)
        elif op == "preload" and not self.served:
            say({"nonce": nonce, **self._preload_modules(request.get("modules", []))})
        elif op in ("write", "read") and self.session is not None:
            file_op(request, self.session, self.proctools, lambda answer: say({"nonce": nonce, **answer}))
        else:
            say({"nonce": nonce, "error": f"the session host cannot {op!r} now"})

    def _preload_modules(self, modules: list[list[str]]) -> dict[str, Any]:
        """The caller's trusted modules (`DockerExecutor(preload=...)`), compiled and run once here so
        every session finds them in ``sys.modules``; never a session's code (refused once one ran)."""
        import types

        try:
            for name, source in modules:
                module = types.ModuleType(name)
                module.__file__ = f"/preload/{name}.py"
                sys.modules[name] = module
                exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            return {"error": f"preloading failed: {type(exc).__name__}: {exc}"}
        return {"ok": True}

    def _open(self, nonce: str, uid: int, socket_name: Any = None) -> dict[str, Any]:
        """Start a session's runner as `uid`: relayed by this host, or, given `socket_name` (its
        directory in the parent's channels directory), connected to the parent's socket itself."""
        self.served = True
        if self.session is not None:
            return {"error": "a session is already open in this container"}
        if uid < 1000:
            return {"error": f"uid {uid} is not a sandbox user's"}
        if socket_name is not None and not (
            isinstance(socket_name, str) and len(socket_name) == 24 and socket_name.isalnum()
        ):
            return {"error": "the channel's name is not one of the parent's"}
        import socket

        name = secrets.token_hex(12)
        workdir, tmpdir = f"{SESSIONS}/{name}", f"/tmp/{name}"
        if socket_name is not None:
            try:
                pid = self.zygote.spawn(uid, workdir, tmpdir, f"{CHANNELS}/{socket_name}/sock")
            except OSError as exc:
                return {"error": f"the session host cannot start sessions any more ({exc})"}
            self.session = Session(nonce, uid, pid, None, workdir, tmpdir)
            return {"pid": pid, "workdir": workdir, "tmpdir": tmpdir, "channel": True}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = self.zygote.spawn(uid, workdir, tmpdir, theirs.fileno())
        except OSError as exc:
            ours.close()
            return {"error": f"the session host cannot start sessions any more ({exc})"}
        finally:
            theirs.close()
        channel = ours.detach()
        os.set_blocking(channel, True)
        self.session = Session(nonce, uid, pid, channel, workdir, tmpdir)
        self.selector.register(channel, selectors.EVENT_READ, "runner")
        self.at_line_start = True
        return {"pid": pid, "workdir": workdir, "tmpdir": tmpdir}

    def _close(self, session: Session) -> list[str]:
        _unregister(self.selector, session.channel)
        return session.end(self.zygote)


def _unregister(selector: selectors.BaseSelector, fd: int | None) -> None:
    if fd is not None:
        try:
            selector.unregister(fd)
        except (KeyError, ValueError):
            pass


def main() -> None:
    try:
        host = Host()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        say({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(3) from None
    host.serve()


if __name__ == "__main__":
    main()
