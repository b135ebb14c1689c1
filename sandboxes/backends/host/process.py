"""How host workers are started, reached and stopped: processes, bubblewrap, the fork server.

`host.py` decides *which* worker a session gets (isolation level, pool); this module makes them.
Two ways to make one:

- `spawn_worker`: a new interpreter (under bwrap for the ``namespaces`` level). Used for sessions with
  an explicit working directory, and as the fallback.
- `ForkServer.fork_worker`: a fork of a server that has already imported everything (see
  `runtime/forkserver.py`), a few milliseconds instead of tens. One server per (isolation, network);
  under ``namespaces`` it lives in one bwrap sandbox and its children are separated from each other
  by their private users, private working directories (mode 0700) and, unless the policy gives them
  the host's network, network and IPC namespaces of their own (`runtime/netns.py`; made ahead of
  need by a spare child). Where a child cannot have them, sessions start as `spawn_worker`s instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable

import anyio

from ...errors import ForkError, ProtocolError, SandboxFileError, WorkerStartError
from ...preload import read_preload
from ...runtime import RUNTIME_DIR
from ...runtime.proctools import BeneathError, kill_process_tree, open_beneath, signal_group
from ...threadwait import Done
from ...usage import ProcessTree, find_in_namespace, parse_nspid, read_text
from ...worker import CappedBytes, ForkPlan, SocketLineReader, Worker, WorkerExit, WorkerExited, peek_sender
from ..resources import resources
from .bubblewrap import Bubblewrap, choose
from .probe import ProcessProbe
from .reap import REAPER, PrivateUsers, UidBlocks, Unconfirmed
from .sweep import kill_user_processes, process_uids, signal_user, start_time, wait_until_reaped

RUNNER = RUNTIME_DIR / "runner.py"
FORKSERVER = RUNTIME_DIR / "forkserver.py"
# 500 blocks of 1,000 uids from 200,000: each process running host sessions holds one of its own.
PRIVATE_USERS = PrivateUsers(size=1000, blocks=UidBlocks(first=200_000, size=1000, count=500))


class HostWorker(Worker):
    """A runner process on this machine, reached over a socketpair used as its stdin and stdout."""

    def __init__(
        self,
        process: subprocess.Popen[bytes] | None,
        sock: socket.socket,
        workdir: str,
        uid: int | None,
        isolation: str,
        owns_workdir: bool,
        pid: int | None = None,
        server_pid: int | None = None,
    ) -> None:
        self.process = process
        # A fork-server child is not our child: `pid` is its host pid at the process level; under
        # namespaces it lives in the server's PID namespace and is reached through its private user.
        self.pid = process.pid if process is not None else pid
        # The fork server reaps its children at once, so a dead child's pid can be reused by any
        # process: its start time tells the worker from a stranger before we signal that pid. Under
        # namespaces `pid` is the server's namespace's, not a host pid: the tree's start time serves.
        self.start_time = (
            start_time(pid) if process is None and pid is not None and isolation == "process" else None
        )
        self.channel = SocketLineReader(sock)
        self.workdir = os.path.realpath(workdir)
        self.uid = uid
        self.isolation = isolation
        self.owns_workdir = owns_workdir
        self._killed = False
        self.server_pid = server_pid  # the fork server's bwrap, under which a forked runner lives
        self._tree: ProcessTree | None = None
        # The sessions sharing this one's private user: it and its forks (`Executor.fork`). The kill
        # that sweeps a user's processes runs only for the last of them; the others end by their tree.
        self.family: set[HostWorker] = {self}
        self.reaped = Done()  # set once killed and reaped (`kill_now` has finished)
        # A fork's runner names its child's pid, which the code can forge: the child is nobody's
        # until its greeting's credentials prove which process it is (`_prove_fork`).
        self._claimed: int | None = None
        self._unproven = False
        self.release_network: Callable[[], None] | None = None
        """Set by the fork server that made this runner when it holds the session's network
        namespace: called once every process of the session's user is shown gone."""

    def usage_probe(self) -> ProcessProbe:
        return ProcessProbe(self.process_tree())

    def process_tree(self) -> ProcessTree | None:
        """The runner's host process, found once (before its first run: no code has run yet, so
        nothing can pose as it) and checked against its start time on every reading."""
        if self._tree is None and not self._killed and not self._unproven:
            host_pid: int | None
            if self.isolation != "namespaces":
                host_pid = self.pid
            elif self.process is not None:  # bwrap -> bwrap (the namespace's init) -> the runner
                host_pid = find_in_namespace(self.process.pid, None)
            elif self.server_pid is not None:
                host_pid = find_in_namespace(self.server_pid, self.pid)
            else:
                host_pid = None
            if host_pid is not None:
                tree = ProcessTree(host_pid)
                if tree.start_time is not None:
                    self._tree = tree
        return self._tree

    async def send(self, data: bytes) -> None:
        await self.channel.send(data)

    async def receive_line(self) -> bytes:
        if self._unproven:
            await self._prove_fork()
        return await self.channel.receive_line(self.line_limit)

    async def _prove_fork(self) -> None:
        """A fork's greeting: the process that sent its first byte, as the kernel names it
        (``SCM_CREDENTIALS``), becomes this worker's runner, once shown to be what the parent's runner
        claimed (`_check_sender`); anything else is a `ProtocolError` and the worker stays nobody's."""
        sock = self.channel.sock
        try:
            await anyio.wait_readable(sock)
        except anyio.ClosedResourceError:
            return  # being killed: the read that follows says end-of-file
        sender = peek_sender(sock)
        if sender is None and self.is_alive():
            raise ProtocolError("the fork's greeting came without the sender's credentials")
        if sender is None:
            return  # end-of-file: the read that follows says so
        tree = await anyio.to_thread.run_sync(self._check_sender, sender)
        self._tree, self.start_time, self._unproven = tree, tree.start_time, False
        self.pid = tree.pid if self.isolation == "process" else self._claimed
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)

    def _check_sender(self, sender: int) -> ProcessTree:
        """The fork's runner is `sender` (its host pid, from the kernel) if it is a process of the
        family's own user (the private uid; ours where there is none: a process of another session,
        or the sandbox's init, never is), the pid the parent's runner claimed (the innermost of its
        NSpid; in the fork server's PID namespace under namespaces) and not another member's runner;
        its start time, read before and after, pins it against pid reuse. Else `ProtocolError`."""
        tree = ProcessTree(sender)
        status = read_text(f"/proc/{sender}/status")
        nspid = parse_nspid(status) if status else []
        user = str(os.getuid() if self.uid is None else self.uid)
        problem = None
        if tree.start_time is None or not nspid:
            problem = "it is gone"
        elif set(process_uids(status or "")) != {user}:
            problem = f"it is not of this session's user {user}"
        elif nspid[-1] != self._claimed or (self.isolation == "namespaces") != (len(nspid) > 1):
            problem = f"it is pid {nspid[-1]} in its namespace, not the {self._claimed} the runner named"
        elif any(sender == member.host_pid() for member in list(self.family) if member is not self):
            problem = "it is another session's runner"
        elif start_time(sender) != tree.start_time:
            problem = "it is gone"
        if problem is not None:
            tree.close()
            raise ProtocolError(f"the fork's greeting did not come from its runner ({problem})")
        return tree

    def host_pid(self) -> int | None:
        """This worker's runner's host pid, where it is known (proven, for a fork)."""
        if self.process is not None and self.isolation == "process":
            return self.process.pid
        tree = self.process_tree()
        return tree.pid if tree is not None else None

    async def alive(self) -> bool:
        return self.is_alive()

    def is_alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:  # a closed channel reads as end-of-file without consuming anything
            return self.channel.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def kill_now(self) -> None:
        """Synchronous kill and reap, for `atexit`, `kill()` and discarded pool workers."""
        try:
            kill = self._signal()
            if kill is None:  # killed before (its own kill frees what it holds)
                self._clean_up(None, gone=False)
            else:
                self._clean_up(kill, gone=not kill.waits() or wait_until_reaped(*kill.watch()))
        finally:
            self._ended()

    def kill_then_confirm(self) -> Unconfirmed | None:
        """The reaper's kill: every process is signalled now; showing them gone (and so freeing the
        private uid) is left to the reaper's next look at all the sessions it killed, which calls
        `Unconfirmed.confirmed`. None when there is nothing to wait for (then the worker is done)."""
        try:
            kill = self._signal()
        except BaseException:
            self._ended()
            raise
        if kill is None or not kill.waits():
            self._confirmed(kill, gone=kill is not None)
            return None
        kill.confirmed = functools.partial(self._confirmed, kill)
        return kill

    def _confirmed(self, kill: Unconfirmed | None, gone: bool) -> None:
        try:
            self._clean_up(kill, gone)
        finally:
            self._ended()

    def _ended(self) -> None:
        _LIVE_WORKERS.discard(self)
        self.reaped.set()

    def _signal(self) -> Unconfirmed | None:
        """Kill every process of this session, once: what is then left to show gone (None if this
        worker was killed before)."""
        if self._killed:
            return None
        self.family.discard(self)
        last = not self.family  # no fork shares this session's user any more
        own_tree = not last and self.process is None and self.isolation == "namespaces"
        tree = self.process_tree() if own_tree else None
        self._killed = True
        sweep = self.uid is not None and last and (self.isolation == "process" or self.process is None)
        # One kill(-1) as the session's user ends all it started without a walk; the reap's wait
        # confirms. Only under namespaces: for that call this thread is the session's user, and
        # only there can none of the session's processes name it (our pid is not in their PID
        # namespace) to signal it back; at the process level they could, so they are walked.
        swept = sweep and self.uid is not None and self.isolation == "namespaces" and signal_user(self.uid)
        if self.pid is not None and (self.process is not None or self._still_ours()):
            if self.isolation == "process":
                kill_process_tree(self.pid)
            signal_group(self.pid, signal.SIGKILL)
        elif tree is not None and not last and tree.alive():
            kill_process_tree(tree.pid, include_root=True)  # its own tree: not its forks'
            signal_group(tree.pid, signal.SIGKILL)
        if sweep and not swept and self.uid is not None:
            kill_user_processes(self.uid, self.server_pid)
        self.channel.sock.close()
        uid = self.uid if last else None
        if self.process is not None:  # our own child, waited for by `_clean_up`: no walk
            return Unconfirmed(None, None, None, None, frees=uid)
        if self.isolation == "process":
            watched, start = self.pid, self.start_time
        elif self._tree is not None:  # its host pid: waiting on it is cheaper than on its user
            watched, start = self._tree.pid, self._tree.start_time
        else:
            watched = start = None
        return Unconfirmed(watched, start, uid, self.server_pid, frees=uid)

    def _clean_up(self, kill: Unconfirmed | None, gone: bool) -> None:
        """After `kill` (None: the kill was another call's): the directory removed, and the uid
        freed when `gone` was shown."""
        if self._tree is not None:
            self._tree.close()
        if self.process is not None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                gone = False
        if self.owns_workdir:
            _remove_directory(self.workdir)
            _RETIRED_BASES.remove_if_empty(os.path.dirname(self.workdir))
        if gone and kill is not None and kill.frees is not None:
            PRIVATE_USERS.release(kill.frees)
            if self.release_network is not None:  # every process of its user is gone: none is in it
                self.release_network()

    # ------------------------------------------------------------------ fork (runtime/sessionfork.py)

    async def prepare_fork(self) -> ForkPlan:
        if self.process is not None and self.isolation == "namespaces":
            raise ForkError(
                "this session runs in a sandbox of its own (an explicit workdir=, or no fork server "
                "here), whose processes all end with it, so a fork could not outlive it; fork sessions "
                "opened without workdir="
            )
        return await anyio.to_thread.run_sync(self._prepare_fork)

    def _prepare_fork(self) -> ForkPlan:
        parent = os.path.dirname(self.workdir)
        if self.owns_workdir:  # a session directory: its sibling, under the same (sandbox-visible) base
            directory = tempfile.mkdtemp(dir=parent)
        else:  # the caller's own directory: the copy is ours, in the system's temporary directory
            directory = tempfile.mkdtemp(prefix="kodeagent-fork-")
        os.chmod(directory, 0o700)
        if self.uid is not None:
            os.lchown(directory, self.uid, self.uid)
        ours, theirs = socket.socketpair()
        # Before the child can write: the kernel then names the sender of its greeting (`_prove_fork`).
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        return ForkPlan(directory, "fd", {"ours": ours, "theirs": theirs})

    async def hand_over(self, plan: ForkPlan) -> None:
        theirs: socket.socket = plan.state["theirs"]
        sock = self.channel.sock
        while True:
            try:
                socket.send_fds(sock, [b"F"], [theirs.fileno()])
                break
            except BlockingIOError:
                await anyio.wait_writable(sock)
            except OSError as exc:
                raise WorkerExited(f"the runner's channel is closed ({exc})") from exc
        theirs.close()

    def forked(self, plan: ForkPlan, pid: int) -> HostWorker:
        plan.state["theirs"].close()
        child = HostWorker(
            None,
            plan.state.pop("ours"),
            plan.workdir,
            self.uid,
            self.isolation,
            owns_workdir=True,
            server_pid=self.server_pid if self.isolation == "namespaces" else None,
        )
        child._claimed, child._unproven = pid, True
        child.family = self.family
        self.family.add(child)
        _LIVE_WORKERS.add(child)
        return child

    async def abandon_fork(self, plan: ForkPlan) -> None:
        for key in ("ours", "theirs"):
            end = plan.state.pop(key, None)
            if end is not None:
                end.close()
        shutil.rmtree(plan.workdir, ignore_errors=True)

    def _still_ours(self) -> bool:
        """A fork-server child's host pid still names that child (process level only)."""
        return (
            self.isolation == "process"
            and self.start_time is not None
            and start_time(self.pid) == self.start_time
        )

    def warm_up(self, timeout: float = 20.0, python_guards: bool = True) -> bool:
        """Blocking: have an idle, not yet initialised runner touch what a session uses (pool only),
        and find its host process for the usage probe here rather than on the first run's path
        (under namespaces that walks the fork server's children). `python_guards` False: for a
        session that will run plain Python (`WarmupRequest`)."""
        sock = self.channel.sock
        request = b'{"op": "warmup"}\n' if python_guards else b'{"op": "warmup", "python_guards": false}\n'
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            reply = self.exchange_blocking(request, timeout)
        except (OSError, WorkerExited):
            return False
        finally:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)
        if b'"reply"' not in reply:
            return False
        sender = self.channel.sender
        if sender is not None and self._tree is None and self.pid is not None:
            self._adopt_host_pid(sender)
        self.process_tree()
        return True

    def _adopt_host_pid(self, sender: int) -> None:
        """The runner's host pid, as the kernel gave it with the warm-up reply (SCM_CREDENTIALS: the
        sender's pid translated into our PID namespace), checked against the pid the fork server
        named (the innermost of its NSpid): no walk of the server's process tree is needed."""
        status = read_text(f"/proc/{sender}/status")
        nspid = parse_nspid(status) if status else []
        if nspid and nspid[-1] == self.pid and (self.isolation == "namespaces") == (len(nspid) > 1):
            tree = ProcessTree(sender)
            if tree.start_time is not None:
                self._tree = tree

    def exchange_blocking(self, data: bytes, timeout: float) -> bytes:
        """Blocking: send a request line and return the runner's next line (the pool's refill thread
        only, before the worker is handed out: the warm-up, `session.initialise_ahead`)."""
        return self.channel.exchange_blocking(data, timeout, self.line_limit)

    async def kill(self) -> None:
        self.channel.wake_waiters()
        await anyio.to_thread.run_sync(self.kill_now)

    async def retire(self) -> None:
        """End an idle worker off the caller's path: the reaper thread kills and reaps it
        (`host/reap.py`); `wait_reaped` waits for that."""
        await REAPER.submit(self.kill_then_confirm)

    async def wait_reaped(self, timeout: float = 30.0) -> bool:
        return await self.reaped.until_set(timeout)

    async def exit_info(self) -> WorkerExit:
        if self.process is None:
            return WorkerExit(detail="the worker process ended")
        try:
            code = await anyio.to_thread.run_sync(functools.partial(self.process.wait, timeout=2))
        except subprocess.TimeoutExpired:
            return WorkerExit(detail="the worker closed its channel but is still running")
        # Memory is bounded by RLIMIT_AS, so exhaustion shows up as MemoryError inside the runner
        # (reported as `oom` there), not as a kernel OOM kill: a signal here is not evidence of OOM.
        if code < 0:
            return WorkerExit(detail=f"killed by {_signal_name(-code)}")
        if self.isolation == "namespaces" and code > 128:  # bwrap reports the child's signal as 128+N
            return WorkerExit(detail=f"killed by {_signal_name(code - 128)}")
        return WorkerExit(detail=f"exit code {code}")

    async def write_file(self, path: str, data: bytes) -> None:
        def write() -> None:
            fd = _open_file(self.workdir, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, uid=self.uid)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self.uid is not None:
                    os.fchown(fd, self.uid, self.uid)  # the file itself, never what a path points to now
            finally:
                os.close(fd)

        await anyio.to_thread.run_sync(write)

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        def read() -> bytes:
            fd = _open_file(self.workdir, path, os.O_RDONLY)
            gathered = CappedBytes(path, max_bytes)
            try:  # never asks for more than one byte past the cap, however long the file is or grows
                while chunk := os.read(fd, min(1 << 20, gathered.room)):
                    gathered.add(chunk)
                return gathered.value()
            finally:
                os.close(fd)

        return await anyio.to_thread.run_sync(read)


def _open_file(root: str, path: str, flags: int, uid: int | None = None) -> int:
    try:
        return open_beneath(root, path, flags, uid)
    except BeneathError as exc:
        raise SandboxFileError(str(exc)) from None


_LIVE_WORKERS: set[HostWorker] = set()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@functools.cache
def bubblewrap() -> Bubblewrap:
    """The bubblewrap this backend runs (system, else bundled; see `bubblewrap.py`), checked once."""
    if os.name != "posix":
        return Bubblewrap(
            None, "none", None, "not a POSIX system", "the host backend needs Linux for namespaces"
        )
    return choose(_probe)


def namespaces_available() -> bool:
    """True if a bubblewrap can create the namespaces we use on this machine (checked once)."""
    return bubblewrap().path is not None


def _probe(bwrap: str) -> str | None:
    """Run `bwrap` as a worker would be run: None if it works, else what went wrong."""
    try:
        probe = subprocess.run(
            [
                bwrap,
                *_bwrap_filesystem(),
                "--unshare-pid",
                "--unshare-net",
                "--unshare-ipc",
                "--die-with-parent",
                sys.executable,
                "-I",
                "-S",
                "-c",
                "pass",
            ],
            capture_output=True,
            timeout=20,
            env={},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if probe.returncode == 0:
        return None
    return probe.stderr.decode(errors="replace").strip()[-2000:] or f"exit code {probe.returncode}"


def _bind_with_parents(path: str, writable: bool = False, at: str | None = None) -> list[str]:
    """bwrap arguments to bind `path` (at `at` inside, else at its own path), creating
    world-traversable parents (e.g. under /root)."""
    args: list[str] = []
    target = at or path
    parts = pathlib.PurePosixPath(target).parts
    for depth in range(2, len(parts)):
        args += ["--perms", "0755", "--dir", str(pathlib.PurePosixPath(*parts[:depth]))]
    return args + ["--bind" if writable else "--ro-bind", path, target]


@functools.cache
def _bwrap_filesystem() -> tuple[str, ...]:
    args = ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for name in ("lib", "lib64", "lib32", "bin", "sbin"):
        top = pathlib.Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    args += ["--perms", "0755", "--dir", "/etc"]
    for etc in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    bound = ["/usr"]
    for path in sorted({sys.base_prefix, sys.prefix, str(RUNTIME_DIR), *_site_dirs()}):
        real = os.path.realpath(path)
        if os.path.isdir(real) and not any(real == b or real.startswith(b + "/") for b in bound):
            args += _bind_with_parents(real)
            bound.append(real)
    return tuple(args)


@functools.cache
def _site_dirs() -> tuple[str, ...]:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return tuple(os.path.realpath(d) for d in dirs if os.path.isdir(d))


def _path_is_world_traversable(path: str) -> bool:
    current = pathlib.Path(path).resolve()
    for parent in [current, *current.parents]:
        try:
            if not parent.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _private_user(directory: str, isolation: str, fresh: bool = False) -> int | None:
    """A fresh unprivileged uid owning `directory` (and all in it, unless it is `fresh`: just made,
    empty), when we are root and the worker can use it."""
    if os.getuid() != 0:
        return None
    # Under namespaces the sandbox mounts what the worker needs; at the process level the worker
    # must reach the interpreter and its directory through the host's own permissions.
    if isolation != "namespaces" and not (
        _path_is_world_traversable(sys.executable) and _path_is_world_traversable(os.path.dirname(directory))
    ):
        return None
    uid = PRIVATE_USERS.take()
    if fresh:
        os.lchown(directory, uid, uid)
        return uid
    for root, dirs, files in os.walk(directory):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, uid, uid)
    return uid


def _new_directory(base: str) -> str:
    """A new directory in `base`, mode 0700, under a name nobody chose (`tempfile.mkdtemp`'s
    contract, at a fraction of its cost: one `mkdir`; a session is opened per program)."""
    while True:
        directory = os.path.join(base, "s" + secrets.token_hex(8))
        try:
            os.mkdir(directory, 0o700)
            return directory
        except FileExistsError:
            continue


def _remove_directory(directory: str) -> None:
    """Remove a session's directory: an empty one (most graded programs write nothing) by one
    `rmdir`; anything in it by `rmtree`, which follows no symlink the code left."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)


def _runner_flags(uid: int | None, isolation: str) -> list[str]:
    flags = [] if uid is None else ["--uid", str(uid), "--gid", str(uid)]
    # Orphans of the code's processes stay in the runner's tree: the kill finds them (process level,
    # see kill_process_tree) and the usage probe counts their CPU (both levels; a namespace's init
    # would otherwise reap them, and their CPU with them).
    flags.append("--subreaper")
    return flags


# ---------------------------------------------------------------------- preloaded trusted modules


@functools.cache
def _preload_root() -> pathlib.Path:
    root = pathlib.Path(tempfile.mkdtemp(prefix="kodeagent-preload-"))
    os.chmod(root, 0o755)
    resources("host").once_on_close(functools.partial(_remove_preload_root, root))
    return root


def _remove_preload_root(root: pathlib.Path) -> None:
    _preload_root.cache_clear()  # a later preload stages into a new root
    _staged.clear()
    shutil.rmtree(root, True)


_staged: dict[tuple[str, ...], tuple[tuple[int, ...], tuple[str, ...]]] = {}
"""Paths given to `stage_preload` -> (their files' identity and change times, the copies staged):
an executor per program (a grader's fresh sessions) then costs a stat per file, not a read and a hash."""


def _file_identity(path: str) -> tuple[int, ...] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None  # `read_preload` says why
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def stage_preload(paths: Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """Copies of trusted module files where every sandbox can read them (never write them), named
    by content: what `HostExecutor(preload=...)` imports in the fork server before any session."""
    given = tuple(os.fspath(path) for path in paths)
    if not given:
        return ()
    identities = [_file_identity(path) for path in given]
    identity = tuple(part for found in identities if found is not None for part in found)
    known = _staged.get(given)
    if known is not None and known[0] == identity and None not in identities:
        return known[1]
    staged = tuple(_stage(given))
    _staged[given] = (identity, staged)
    return staged


def _stage(paths: tuple[str, ...]) -> list[str]:
    staged = []
    for name, data in read_preload(paths):
        folder = _preload_root() / hashlib.sha256(data).hexdigest()[:16]
        target = folder / f"{name}.py"
        if not target.exists():
            folder.mkdir(mode=0o755, exist_ok=True)
            partial = folder / f".{name}.py.{os.getpid()}.{threading.get_ident()}"
            partial.write_bytes(data)
            os.chmod(partial, 0o644)
            os.replace(partial, target)
        staged.append(str(target))
    return staged


def _preload_flags(preload: tuple[str, ...]) -> list[str]:
    return [arg for path in preload for arg in ("--preload", path)]


def _python(script: pathlib.Path) -> list[str]:
    command = [sys.executable, "-I", "-S", str(script)]
    for path in _site_dirs():
        command += ["--sys-path", path]
    return command


def _sandboxed(
    command: list[str],
    isolation: str,
    network: bool,
    writable: str,
    preload: tuple[str, ...] = (),
    writable_at: str | None = None,
) -> list[str]:
    """Wrap `command` in bubblewrap at the namespaces level; `writable` is the one writable directory
    and the working directory, seen inside at `writable_at` (else at its own path); staged `preload`
    files are readable."""
    if isolation != "namespaces":
        return command
    inside = writable_at or writable
    readable = _bind_with_parents(str(_preload_root())) if preload else []
    return [
        bubblewrap().path or "bwrap",
        *_bwrap_filesystem(),
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--unshare-net",  # with network on too: the egress gateway's listener is its way out
        "--die-with-parent",
        "--new-session",
        *readable,
        *_bind_with_parents(writable, writable=True, at=inside),
        "--chdir",
        inside,
        *command,
    ]


def spawn_worker(
    isolation: str,
    workdir: str | None,
    network: bool,
    preload: tuple[str, ...] = (),
    workdir_at: str | None = None,
) -> HostWorker:
    """Start a runner in a new interpreter (blocking; call it from the spawner thread); under
    namespaces its working directory is seen at `workdir_at` when given."""
    owns_workdir = workdir is None
    directory = tempfile.mkdtemp(prefix="kodeagent-") if workdir is None else os.path.realpath(workdir)
    os.makedirs(directory, exist_ok=True)
    uid = _private_user(directory, isolation)
    flags = _runner_flags(uid, isolation) + _preload_flags(preload)
    command = _sandboxed(_python(RUNNER) + flags, isolation, network, directory, preload, workdir_at)
    parent_end, child_end = socket.socketpair()
    try:
        process = subprocess.Popen(
            command,
            stdin=child_end.fileno(),
            stdout=child_end.fileno(),
            stderr=subprocess.DEVNULL,
            cwd=directory,
            env={},
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        parent_end.close()
        raise WorkerStartError(f"could not start the sandbox worker ({exc})") from exc
    finally:
        child_end.close()
    worker = HostWorker(process, parent_end, directory, uid, isolation, owns_workdir)
    _LIVE_WORKERS.add(worker)
    return worker


class ForkServer:
    """A pre-imported server that forks runners (see `runtime/forkserver.py`). Thread-safe."""

    def __init__(self, isolation: str, network: bool, preload: tuple[str, ...] = ()) -> None:
        self.isolation = isolation
        # Sessions' working directories live under one base the sandbox can see; each is mode 0700
        # and owned by its session's private user, so sessions cannot read each other's files.
        self.base = tempfile.mkdtemp(prefix="kodeagent-sessions-")
        os.chmod(self.base, 0o711)
        self.control, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Sessions of one server share its sandbox; each child takes network and IPC namespaces of
        # its own (`runtime/netns.py`), network-on ones too: their gateway listens in that namespace.
        self.private_network = isolation == "namespaces"
        flags = (["--private-network"] if self.private_network else []) + _preload_flags(preload)
        if self.private_network and not network:  # a network-on session's gateway listens in its namespace
            flags.append("--recycle-network")
        command = _sandboxed(_python(FORKSERVER) + flags, isolation, network, self.base, preload)
        try:
            self.process = subprocess.Popen(
                command,
                stdin=child_end.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=self.base,
                env={},
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            self.control.close()
            raise WorkerStartError(f"could not start the sandbox fork server ({exc})") from exc
        finally:
            child_end.close()
        self.lock = threading.Lock()
        self.hello: dict[str, object] | None = None

    def usable(self) -> bool:
        return self.process.poll() is None

    def _check_ready(self) -> None:
        """Read the server's first message (under the lock): it says whether children can be separated."""
        if self.hello is None:
            reply = self.control.recv(4096)
            if not reply:
                raise WorkerStartError("the sandbox fork server ended before it was ready")
            self.hello = json.loads(reply)
        if self.private_network and not self.hello.get("private_network"):
            raise WorkerStartError(
                "the fork server cannot give sessions network namespaces of their own "
                f"({self.hello.get('error')}); each session starts a sandbox of its own instead"
            )

    def fork_worker(self) -> HostWorker:
        try:
            with self.lock:
                self._check_ready()
        except OSError as exc:
            raise WorkerStartError(f"the sandbox fork server is gone ({exc})") from exc
        directory = _new_directory(self.base)
        uid = _private_user(directory, self.isolation, fresh=True)
        request = json.dumps({"workdir": directory, "argv": _runner_flags(uid, self.isolation)}).encode()
        parent_end, child_end = socket.socketpair()
        try:
            with self.lock:
                socket.send_fds(self.control, [request], [child_end.fileno()])
                reply = self.control.recv(4096)
        except OSError as exc:
            parent_end.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise WorkerStartError(f"the sandbox fork server is gone ({exc})") from exc
        finally:
            child_end.close()
        if not reply:
            parent_end.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise WorkerStartError("the sandbox fork server is gone")
        answer = json.loads(reply)
        pid, lease = answer["pid"], answer.get("lease")
        worker = HostWorker(
            None,
            parent_end,
            directory,
            uid,
            self.isolation,
            owns_workdir=True,
            pid=pid,
            server_pid=self.process.pid if self.isolation == "namespaces" else None,
        )
        if isinstance(lease, int):
            worker.release_network = functools.partial(self.release, lease)
        _LIVE_WORKERS.add(worker)
        return worker

    def release(self, lease: int) -> None:
        """Tell the server that `lease`'s session has no process left: its network namespace may go
        to a later session once shown unchanged (`runtime/forkserver.py`'s `Recycler`)."""
        try:
            self.control.send(json.dumps({"release": lease}).encode())
        except OSError:  # the server is gone: nothing of it to recycle
            pass

    def stop(self, *, sessions_live: bool = False) -> None:
        """End the server. `sessions_live`: it is being replaced while sessions it forked may live on
        (at the ``process`` level they outlive it): their directories under its base stay, and the
        base goes with the last of them (`RetiredBases`); else (at exit) the base goes now."""
        self.control.close()
        if self.process.returncode is None:  # once reaped (`usable`), its pid may be another's
            signal_group(self.process.pid, signal.SIGKILL)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if sessions_live:
            _RETIRED_BASES.add(self.base)
        else:
            shutil.rmtree(self.base, ignore_errors=True)


class RetiredBases:
    """The base directories of replaced fork servers, each removed once no session's directory is
    left in it (a session removes its own directory when it is killed, then asks here)."""

    def __init__(self) -> None:
        self._bases: set[str] = set()
        self._lock = threading.Lock()

    def add(self, base: str) -> None:
        with self._lock:
            self._bases.add(os.path.realpath(base))
        self.remove_if_empty(base)

    def remove_if_empty(self, base: str) -> None:
        real = os.path.realpath(base)
        with self._lock:
            if real not in self._bases:
                return
            try:
                os.rmdir(real)  # only when empty: a live session's directory keeps it
            except FileNotFoundError:
                pass
            except OSError:
                return
            self._bases.discard(real)

    def remove_all(self) -> None:
        """At exit, after every worker was killed: whatever is left goes."""
        with self._lock:
            bases, self._bases = self._bases, set()
        for base in bases:
            shutil.rmtree(base, ignore_errors=True)


_RETIRED_BASES = RetiredBases()


_FORK_SERVERS: dict[tuple[str, bool, tuple[str, ...]], ForkServer] = {}
_FORK_SERVERS_LOCK = threading.Lock()


def fork_worker(isolation: str, network: bool, preload: tuple[str, ...] = ()) -> HostWorker:
    """A runner forked from the (lazily started) fork server of this isolation level, network and
    preloaded modules."""
    key = (isolation, network, preload)
    with _FORK_SERVERS_LOCK:
        server = _FORK_SERVERS.get(key)
        if server is None or not server.usable():
            if server is not None:  # it died: the sessions it forked may still be running
                server.stop(sessions_live=True)
            server = _FORK_SERVERS[key] = ForkServer(isolation, network, preload)
    return server.fork_worker()


@resources("host").on_close
def _kill_all_workers() -> None:
    for worker in list(_LIVE_WORKERS):
        worker.kill_now()
    for server in _FORK_SERVERS.values():
        server.stop()
    _RETIRED_BASES.remove_all()
