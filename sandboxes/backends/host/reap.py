"""Ending host sessions off the caller's path, and the private users they run as.

Killing a worker and waiting until the kernel has reaped everything it started is mostly waiting (a
few milliseconds of /proc scans and signals), so `close()` hands the worker to one reaper thread and
returns. The backlog is bounded (`BACKLOG`): past it a `close()` waits for room, so a loop that opens
sessions faster than they can die slows down instead of piling up dying processes.

A private uid is handed out again only after every process of the session that held it is gone
(`PrivateUsers.release` runs after the reap), so a new session never shares a user with what is left
of an old one; a uid whose processes could not be shown gone is never handed out again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import anyio

from ...errors import WorkerStartError
from ..resources import resources

BACKLOG = 64
"""Closed workers at most waiting to be killed and reaped before `close()` waits for room."""


class Reaper:
    """One daemon thread that runs the kills handed to it, in order."""

    def __init__(self, backlog: int = BACKLOG) -> None:
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=backlog)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def submit(self, kill: Callable[[], None]) -> None:
        """Queue `kill`; returns at once unless the backlog is full."""
        self._start()
        try:
            self._queue.put_nowait(kill)
        except queue.Full:
            await anyio.to_thread.run_sync(self._queue.put, kill)

    def drain(self, timeout: float = 30.0) -> bool:
        """Block until every queued kill has run (at exit, and for callers that must see nothing left);
        False if that took longer than `timeout`."""
        done = threading.Event()

        def mark() -> None:
            done.set()

        if self._thread is None:
            return True
        try:
            self._queue.put(mark, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="kodeagent-reaper", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            kill = self._queue.get()
            try:
                kill()
            except Exception:  # noqa: BLE001 - a failed kill must not stop the ones queued behind it
                pass


class PrivateUsers:
    """Unprivileged uids `base .. base + size - 1`, each held by one session family at a time."""

    def __init__(self, base: int, size: int = 1000) -> None:
        self.base, self.size = base, size
        self._in_use: set[int] = set()
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
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
