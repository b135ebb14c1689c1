"""The host backend: the runner in a local worker process, fenced by namespaces where Linux offers them.

Isolation levels (``executor.isolation``):

``namespaces``
    The worker runs under bubblewrap (``bwrap``, Debian package ``bubblewrap``): its own PID, network,
    IPC and UTS namespaces (no network at all, it cannot see or signal host processes, and killing it
    kills everything it started), a read-only view of only ``/usr`` and the Python installation
    (no home directories, no ``/etc`` credentials, no host ``/tmp``: a private one), the working
    directory as the only writable place, and an unprivileged user of its own. Protects against code
    that gets past the Python-level guards, including C extensions.
``process``
    No bubblewrap (or it cannot create namespaces here): a separate process with an empty environment,
    its own working directory, rlimits, its own process group, and (when we are root and the
    interpreter is reachable) an unprivileged user of its own. The Python-level guards (static policy,
    RestrictedPython, the audit hook) are then what keeps the code off the file system and network;
    a C extension that calls libc directly (numpy reading a file) is *not* contained at this level.

Both levels get the same rlimits (memory, CPU, processes, file size, open files) and the same
supervisor: a timeout kills the worker's process group (and, at ``process`` level, every process of
its user), so threads, daemons and ``setsid`` children do not outlive it.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
from collections.abc import Sequence
from typing import Literal, Unpack

import anyio

from ..errors import BackendUnavailable, WorkerStartError
from ..executor import Executor, ExecutorOptions
from ..session import Session
from ..worker import Worker
from .hostprocess import (
    _LIVE_WORKERS,
    HostWorker,
    fork_worker,
    namespaces_available,
    spawn_worker,
    stage_preload,
)

Isolation = Literal["auto", "namespaces", "process"]

# Workers are spawned from one long-lived thread: a child's "die with parent" signal fires when the
# *thread* that forked it exits, and anyio's worker threads come and go.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kodeagent-spawn")


PoolKey = tuple[str, bool, tuple[str, ...]]
"""Workers are interchangeable when they have the same isolation level, network and preloads."""


def make_worker(
    isolation: str, workdir: str | None, network: bool, preload: tuple[str, ...] = ()
) -> HostWorker:
    """A new worker: forked from the fork server when it can be, else a fresh interpreter."""
    if workdir is None:
        try:
            return fork_worker(isolation, network, preload)
        except WorkerStartError:
            pass  # the fork server could not start or died: a slower, independent worker still works
    return spawn_worker(isolation, workdir, network, preload)


async def _spawn(key: PoolKey, workdir: str | None) -> HostWorker:
    future = _SPAWNER.submit(make_worker, key[0], workdir, key[1], key[2])
    return await anyio.to_thread.run_sync(future.result)


# ---------------------------------------------------------------------- the pool

_POOLS: dict[PoolKey, list[HostWorker]] = {}
POOL_SIZE = 2


def _take_pooled(key: PoolKey) -> HostWorker | None:
    pool = _POOLS.get(key, [])
    while pool:
        worker = pool.pop()
        if worker.is_alive():
            return worker
        worker.kill_now()
    return None


def _refill(key: PoolKey) -> None:
    """Top the pool up in the background spawner thread; nobody waits for it."""

    def fill() -> None:
        pool = _POOLS.setdefault(key, [])
        while len(pool) < POOL_SIZE:
            worker = make_worker(key[0], None, key[1], key[2])
            if not worker.warm_up():
                worker.kill_now()
                return
            _LIVE_WORKERS.discard(worker)
            pool.append(worker)

    _SPAWNER.submit(fill)


@atexit.register
def _kill_pooled_workers() -> None:
    for pool in _POOLS.values():
        for worker in pool:
            worker.kill_now()


async def _retire(worker: Worker) -> None:
    """A normal close: the worker is killed and reaped off the caller's path (`hostreap.py`)."""
    assert isinstance(worker, HostWorker)
    await worker.retire()


class HostExecutor(Executor):
    """Runs code in a worker process on this machine. See the module docs for the isolation levels.

    Args:
        isolation: ``"auto"`` (namespaces when bubblewrap works here, else process), ``"namespaces"``
            (fail if unavailable) or ``"process"``.
        pool: take a pre-started worker from the warm pool (not possible with an explicit `workdir`).
        preload: trusted Python files (``name.py``) imported once, in the fork server, before any
            session: every session then has them in ``sys.modules`` (``import name`` costs nothing,
            subject to the policy's import allowlist like any import). What many sessions share (a
            harness driver) is compiled and loaded once instead of sent and compiled per session.
            The files' code runs with the fork server's rights: only ever your own code.
        (and the common `ExecutorOptions`)
    """

    backend = "host"

    def __init__(
        self,
        *,
        isolation: Isolation = "auto",
        pool: bool = True,
        preload: Sequence[str | os.PathLike[str]] = (),
        **options: Unpack[ExecutorOptions],
    ) -> None:
        super().__init__(**options)
        if isolation not in ("auto", "namespaces", "process"):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'process', not {isolation!r}")
        if os.name != "posix":
            raise BackendUnavailable("the host backend needs a POSIX system (Linux or macOS)")
        self.requested_isolation = isolation
        self.use_pool = pool and self.workdir is None
        self.preload = stage_preload(preload)

    def _isolation_level(self) -> str:
        if self.requested_isolation == "process":
            return "process"
        if namespaces_available():
            return "namespaces"
        if self.requested_isolation == "namespaces":
            from .hostprocess import bubblewrap

            raise BackendUnavailable(f"{bubblewrap().problem}; or use isolation='process'")
        return "process"

    async def _new_session(self) -> Session:
        level = await anyio.to_thread.run_sync(self._isolation_level)
        key = (level, self.policy.network, self.preload)
        worker = _take_pooled(key) if self.use_pool else None
        if worker is None:
            worker = await _spawn(key, self.workdir)
        else:
            _LIVE_WORKERS.add(worker)
        if self.use_pool:
            _refill(key)
        return await self._runner_session(worker, release=_retire)
