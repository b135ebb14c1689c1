"""Ending host sessions off the caller's path, and the private users they run as.

Killing a worker and waiting until the kernel has reaped everything it started is mostly waiting (a
few milliseconds of /proc scans and signals), so `close()` hands the worker to one reaper thread and
returns. The reaper signals each worker's processes at once, and shows them gone in batches: every
`SETTLE_EVERY` seconds one walk of the fork server's processes confirms every session it killed
since (a walk per session cost a grader opening a session per program half a millisecond of CPU
each). The backlog is bounded (`BACKLOG`, killed and unconfirmed alike): past it a `close()` waits
for room, so a loop that opens sessions faster than they can die slows down instead of piling up
dying processes.

A private uid is handed out again only after every process of the session that held it is gone
(`PrivateUsers.release` runs after the reap), so a new session never shares a user with what is left
of an old one; a uid whose processes could not be shown gone is never handed out again. Between
processes on one machine (an MCP server beside a `kodeagent serve`, Ray's node agents, a forked
child) the uids are kept apart by `UidBlocks`: each process holds a block of its own.
"""

from __future__ import annotations

import fcntl
import os
import queue
import stat
import tempfile
import threading
import time
from collections.abc import Callable

import anyio

from ...errors import WorkerStartError
from ..resources import resources
from .sweep import start_time, users_present

BACKLOG = 64
"""Closed workers at most waiting to be killed, or killed and not yet shown gone, before `close()`
waits for room."""
SETTLE_EVERY = 0.03
"""Seconds between the reaper's looks at the sessions it killed: one walk shows all of them gone (for
a grader closing 130 sessions a second, about four)."""
SETTLE_LIMIT = 2.0
"""Seconds a killed session's processes have to be shown gone; past it its uid is never handed out
again (`PrivateUsers`)."""


class Unconfirmed:
    """A killed worker whose processes are not yet shown gone: its runner's host pid (with its
    start time, so a reused pid is not taken for it) and its private user's processes below the
    fork server `within` (every process on the machine when None)."""

    __slots__ = ("pid", "start", "uid", "within", "frees", "deadline", "confirmed")

    def __init__(
        self, pid: int | None, start: int | None, uid: int | None, within: int | None, frees: int | None
    ) -> None:
        self.pid, self.start, self.uid, self.within = pid, start, uid, within
        self.frees = frees
        """The uid to hand out again once shown gone (this session was the last of its family)."""
        self.deadline = time.monotonic() + SETTLE_LIMIT
        self.confirmed: Callable[[bool], None] = lambda gone: None
        """Called once, with whether the processes were shown gone (set by the worker)."""

    def waits(self) -> bool:
        return self.pid is not None or self.uid is not None

    def watch(self) -> tuple[int | None, int | None, int | None, int | None]:
        """`sweep.wait_until_reaped`'s arguments, for a caller that waits for this one alone."""
        return self.pid, self.start, self.uid, self.within


def settle(pending: list[Unconfirmed]) -> list[Unconfirmed]:
    """Confirm each of `pending` whose runner has left the process table and whose user has no
    process left (one walk per fork server for all of them), give up on those past their deadline,
    and return the rest."""
    running = {id(p) for p in pending if p.pid is not None and start_time(p.pid) == p.start}
    users: dict[int | None, set[int]] = {}
    for p in pending:
        if p.uid is not None and id(p) not in running:
            users.setdefault(p.within, set()).add(p.uid)
    present = {within: users_present(uids, within) for within, uids in users.items()}
    now, left = time.monotonic(), []
    for p in pending:
        gone = id(p) not in running and (p.uid is None or p.uid not in present[p.within])
        if gone or now >= p.deadline:
            try:
                p.confirmed(gone)
            except Exception:  # noqa: BLE001, S110 - one clean-up must not stop the others
                pass
        else:
            left.append(p)
    return left


class _Mark:
    """`drain`'s place in the queue: reached once everything before it is killed and settled."""

    def __init__(self) -> None:
        self.done = threading.Event()


class Reaper:
    """One daemon thread that runs the kills handed to it, in order, and confirms them in batches.

    A kill returns None (done) or an `Unconfirmed`, which the thread settles with the others."""

    def __init__(self, backlog: int = BACKLOG) -> None:
        self.backlog = backlog
        self._queue: queue.Queue[Callable[[], Unconfirmed | None] | _Mark] = queue.Queue(maxsize=backlog)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: list[Unconfirmed] = []

    async def submit(self, kill: Callable[[], Unconfirmed | None]) -> None:
        """Queue `kill`; returns at once unless the backlog is full."""
        self._start()
        try:
            self._queue.put_nowait(kill)
        except queue.Full:
            await anyio.to_thread.run_sync(self._queue.put, kill)

    def drain(self, timeout: float = 30.0) -> bool:
        """Block until every queued kill has run and been confirmed or given up on (at exit, and for
        callers that must see nothing left); False if that took longer than `timeout`."""
        if self._thread is None:
            return True
        mark = _Mark()
        try:
            self._queue.put(mark, timeout=timeout)
        except queue.Full:
            return False
        return mark.done.wait(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="kodeagent-reaper", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        settled = time.monotonic()
        while True:
            try:
                job = self._queue.get(timeout=SETTLE_EVERY if self._pending else None)
            except queue.Empty:
                job = None
            if isinstance(job, _Mark):
                while self._pending:
                    self._pending = settle(self._pending)
                    if self._pending:
                        time.sleep(0.001)
                job.done.set()
                continue
            if job is not None:
                try:
                    left = job()
                except Exception:  # noqa: BLE001 - a failed kill must not stop the ones queued behind it
                    left = None
                if left is not None:
                    self._pending.append(left)
            if self._pending and time.monotonic() - settled >= SETTLE_EVERY:
                self._pending = settle(self._pending)
                settled = time.monotonic()
            while len(self._pending) >= self.backlog:  # no more kills until some are shown gone
                time.sleep(0.001)
                self._pending = settle(self._pending)


class UidBlocks:
    """The machine's private uids, `count` blocks of `size` from `first`, each held by one live process.

    A process claims a block by taking an exclusive `flock` on the block's file in `lock_dir`; the
    kernel drops the lock when the process ends, however it ends, so a crashed owner's block is free
    again and no two live processes share one, whatever their pids (a block chosen from the pid alone
    was shared by any two processes whose pids agreed modulo the count, and a session closing in one
    killed the other's processes of that uid)."""

    def __init__(self, first: int, size: int, count: int, lock_dir: str | None = None) -> None:
        self.first, self.size, self.count = first, size, count
        self.lock_dir = lock_dir or _default_lock_dir()

    def claim(self, preferred: int) -> tuple[int, int]:
        """The base uid of a free block (`preferred`'s first, then the ones after it) and the lock's
        descriptor, to be kept open for as long as the block's uids are in use."""
        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        held = os.lstat(self.lock_dir)
        if not stat.S_ISDIR(held.st_mode) or held.st_uid != os.geteuid() or held.st_mode & 0o077:
            # Another user's directory (a shared /tmp) could hold every lock, or swap the files.
            raise WorkerStartError(
                f"{self.lock_dir} (the private users' block locks) is not a directory of this user's "
                "alone (mode 0700); remove it and try again"
            )
        for step in range(self.count):
            index = (preferred + step) % self.count
            path = os.path.join(self.lock_dir, f"{self.first}-{index}.lock")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return self.first + index * self.size, fd
        raise WorkerStartError(
            f"all {self.count} blocks of private users on this machine are held by live processes "
            f"(locks in {self.lock_dir}); end some of the processes running sandboxes"
        )


def _default_lock_dir() -> str:
    """Root's own directory for the block locks: /run when it is there, else the temporary directory."""
    root = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else tempfile.gettempdir()
    return os.path.join(root, f"kodeagent-uid-blocks-{os.getuid()}")


class PrivateUsers:
    """Unprivileged uids `base + 1 .. base + size`, each held by one session family at a time.

    With `blocks` the base is the block this process claims there on its first `take()` (and claims
    anew in a forked child, whose sessions must not share its parent's uids)."""

    def __init__(self, base: int = 0, size: int = 1000, blocks: UidBlocks | None = None) -> None:
        self.base, self.size = base, size
        self.blocks = blocks
        self._owner: int | None = None
        self._lock_fd: int | None = None
        self._in_use: set[int] = set()
        self._next = 0
        self._lock = threading.Lock()

    def _claim(self) -> None:
        """Hold a block of this process's own (under the lock)."""
        if self.blocks is None or self._owner == os.getpid():
            return
        if self._lock_fd is not None:  # the parent's lock, inherited across fork(): its block stays its
            os.close(self._lock_fd)
        self.base, self._lock_fd = self.blocks.claim(os.getpid())
        self._owner = os.getpid()
        self._in_use.clear()  # a forked child's copy names the parent's sessions
        self._next = 0

    def block(self) -> range:
        """The uids this process hands out (its block, claimed now if it had none yet)."""
        with self._lock:
            self._claim()
            return range(self.base + 1, self.base + self.size + 1)

    def take(self) -> int:
        with self._lock:
            self._claim()
            for _ in range(self.size):
                uid = self.base + 1 + self._next % self.size
                self._next += 1
                if uid not in self._in_use:
                    self._in_use.add(uid)
                    return uid
        raise WorkerStartError(
            f"all {self.size:,} private users of this process are held by live or dying sessions; "
            "close sessions (or wait for the ones closing) before opening more"
        )

    def release(self, uid: int) -> None:
        """The uid's processes are all gone: it may be handed out again."""
        with self._lock:
            self._in_use.discard(uid)

    def held(self, uid: int) -> bool:
        """Whether `uid` is held (by a live session family, or one whose processes are not yet gone)."""
        with self._lock:
            return uid in self._in_use

    def in_use(self) -> int:
        with self._lock:
            return len(self._in_use)


REAPER = Reaper()
resources("host").on_close(lambda: REAPER.drain(timeout=10))  # the last of the host's clean-ups
