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

import concurrent.futures
import functools
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, Unpack, cast

import anyio

from ...egress.policy import NetworkPolicy
from ...egress.service import (
    EgressUnavailable,
    attach_process_blocking,
    ca_bundle_path,
    with_proxy_environment,
)
from ...errors import BackendUnavailable, ProtocolError, WorkerStartError
from ...executor import Executor, ExecutorOptions
from ...runtime.protocol import InitRequest
from ...session import RunnerSession, Session, initialise_ahead
from ...worker import Worker, WorkerExited
from ..resources import WarmPool, resources
from .process import (
    _LIVE_WORKERS,
    HostWorker,
    fork_worker,
    namespaces_available,
    spawn_worker,
    stage_preload,
)

Isolation = Literal["auto", "namespaces", "process"]

RESOURCES = resources("host")
"""What the host backend keeps for the process: its spawner thread (workers are spawned from one
long-lived thread: a child's "die with parent" signal fires when the *thread* that forked it exits,
and anyio's worker threads come and go), the reaper, the fork servers and the warm pools (`POOLS`),
all ended by its `close()` at exit."""


PoolKey = tuple[str, bool, tuple[str, ...]]
"""Workers are interchangeable when they have the same isolation level, network and preloads."""
ReadyKey = tuple[PoolKey, str]
"""Initialised workers are interchangeable when, besides, their `init` requests are the same (the
request's canonical JSON: policy, limits, environment, tool names, stateless, output limit)."""


def make_worker(
    isolation: str,
    workdir: str | None,
    network: bool,
    preload: tuple[str, ...] = (),
    workdir_at: str | None = None,
) -> HostWorker:
    """A new worker: forked from the fork server when it can be, else a fresh interpreter (with an
    explicit `workdir`, seen inside at `workdir_at` under namespaces)."""
    if workdir is None:
        try:
            return fork_worker(isolation, network, preload)
        except WorkerStartError:
            pass  # the fork server could not start or died: a slower, independent worker still works
    return spawn_worker(isolation, workdir, network, preload, workdir_at)


def _spawner_submit(fn: Callable[..., object], /, *args: object) -> concurrent.futures.Future[Any]:
    return RESOURCES.submit("spawn", fn, *args)


async def _spawn(key: PoolKey, workdir: str | None, workdir_at: str | None = None) -> HostWorker:
    future = _spawner_submit(make_worker, key[0], workdir, key[1], key[2], workdir_at)
    return await anyio.to_thread.run_sync(future.result)


def init_key(init: InitRequest) -> str:
    """The canonical text of an `init` request: two sessions whose requests have the same text are
    started alike, so either may take the other's pre-initialised worker."""
    return json.dumps(init, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------- the pools

POOL_SIZE = 2
"""Idle workers kept per key, in each kind of pool."""
READY_KEYS = 4
"""Option sets (`ReadyKey`s) that keep initialised workers: the most recently opened ones."""


class HostPools:
    """The idle workers of this process, shared by every executor (event loops in any thread) and
    filled by the spawner thread; closed (every idle worker killed) with the backend's resources.

    Two `WarmPool`s: *started* workers (warmed up, no `init` yet) per `PoolKey`, without bound in
    keys; and *ready* ones per `ReadyKey`, whose `init` handshake is done ahead, for only the
    `READY_KEYS` option sets most recently opened: a new one evicts the least recently opened, whose
    idle workers are killed, so many option sets (a policy per problem) never pile up idle processes.
    An open takes a ready worker of its options; failing that a started one (its handshake then on
    the open's path, as for any first open of new options); failing that it starts one."""

    def __init__(self) -> None:
        self.started: WarmPool[PoolKey, HostWorker] = WarmPool(
            HostWorker.is_alive, _kill_off_path, on_put=_LIVE_WORKERS.discard
        )
        self.ready: WarmPool[ReadyKey, HostWorker] = WarmPool(
            HostWorker.is_alive, _kill_off_path, max_keys=READY_KEYS, on_put=_LIVE_WORKERS.discard
        )
        self.deferred = _Deferred()
        self._lock = threading.Lock()
        self._pending = 0  # refills submitted and not yet finished

    def take(self, key: PoolKey, ready_key: ReadyKey) -> tuple[HostWorker | None, bool]:
        """A live idle worker, and whether it is initialised (for `ready_key`)."""
        worker = self.ready.take(ready_key)
        if worker is not None:
            return worker, True
        return self.started.take(key), False

    def idle(self) -> list[HostWorker]:
        """Every pooled worker (for tests and `bench latency`)."""
        return self.ready.idle() + self.started.idle()

    def refilling(self) -> bool:
        with self._lock:
            return self._pending > 0 or len(self.deferred) > 0

    def close(self) -> None:
        """Kill every idle worker (blocking)."""
        for worker in self.started.drain() + self.ready.drain():
            worker.kill_now()

    def refill(self, key: PoolKey, ready_key: ReadyKey, hit: bool, keep_ready: bool = True) -> None:
        """Top the pools up in the background spawner thread after an open; nobody waits for it.

        After an open that found an initialised worker the ready pool of its options is topped up to
        `POOL_SIZE`; after one that did not (new options, or the pool ran dry), to one worker only, so
        options opened once cost one spare handshake, not a pool, and the started pool as before.
        `keep_ready=False`: options no other open will have (a session's own CA bundle in its
        environment) get no ready worker, and evict no other options' ready workers."""
        evicted = self.ready.want(ready_key) if keep_ready else []
        with self._lock:
            self._pending += 1

        def step() -> bool:
            """Make one worker the pools lack (the ready one first: the next open of these options is
            the likeliest to come); False once none is lacking, or when making it failed."""
            if (
                keep_ready
                and self.ready.wanted(ready_key)
                and self.ready.count(ready_key) < (POOL_SIZE if hit else 1)
            ):
                ready = _started_worker(key)
                if ready is None:
                    return False
                init = cast(InitRequest, json.loads(ready_key[1]))  # exactly the key's request
                if not (_initialise(ready, init) and self.ready.put(ready_key, ready, only_wanted=True)):
                    ready.kill_now()  # a failed handshake (or evicted meanwhile): never handed out
                    return False
                return True
            if not hit and self.started.count(key) < POOL_SIZE:
                started = _started_worker(key)
                if started is not None:
                    self.started.put(key, started)
                    return True
            return False

        def fill() -> None:
            # One worker a task: an open that found the pools empty queues its own worker behind at
            # most one being made, not behind whole refills.
            again = False
            try:
                while evicted:
                    evicted.pop().kill_now()
                if step():
                    _spawner_submit(fill)
                    again = True
            finally:
                if not again:
                    with self._lock:
                        self._pending -= 1

        try:
            _spawner_submit(fill)
        except RuntimeError:  # the interpreter is exiting: nothing is refilled any more
            with self._lock:
                self._pending -= 1
            for idle in evicted:
                idle.kill_now()


def _kill_off_path(worker: HostWorker) -> None:
    """A worker that died while idle: reaped in the spawner thread, off the caller's path."""
    try:
        _spawner_submit(worker.kill_now)
    except RuntimeError:  # the interpreter is exiting
        worker.kill_now()


class _Deferred:
    """Refills waiting for their session's first run to end (`RunnerSession.after_first_run`); the
    next open runs every one still waiting, so a session left idle never holds its refill back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[int, Callable[[], None]] = {}
        self.count = 0

    def add(self, refill: Callable[[], None]) -> int:
        with self.lock:
            self.count += 1
            self.waiting[self.count] = refill
            return self.count

    def run(self, ticket: int) -> None:
        with self.lock:
            refill = self.waiting.pop(ticket, None)
        if refill is not None:
            refill()

    def run_all(self) -> None:
        with self.lock:
            refills, self.waiting = list(self.waiting.values()), {}
        for refill in refills:
            refill()

    def __len__(self) -> int:
        with self.lock:
            return len(self.waiting)


POOLS = HostPools()
RESOURCES.on_close(POOLS.close)


def refilling() -> bool:
    """Whether a refill is still waiting (for its session's first run), pending or running (`bench
    latency` waits for the pools to settle)."""
    return POOLS.refilling()


def pooled_workers() -> list[HostWorker]:
    """The idle workers of every pool, started and initialised."""
    return POOLS.idle()


def _started_worker(key: PoolKey) -> HostWorker | None:
    """A new worker, warmed up (in the spawner thread); None if it could not start or warm up."""
    try:
        worker = make_worker(key[0], None, key[1], key[2])
    except WorkerStartError:
        return None
    if not worker.warm_up():
        worker.kill_now()
        return None
    return worker


def _initialise(worker: HostWorker, init: InitRequest) -> bool:
    """The worker's `init` handshake, ahead of its session; False if it failed (then never handed out)."""
    try:
        initialise_ahead(worker, init, worker.exchange_blocking)
    except (WorkerExited, ProtocolError, WorkerStartError):
        return False
    return True


async def _retire(worker: Worker) -> None:
    """A normal close: the worker is killed and reaped off the caller's path (`host/reap.py`)."""
    assert isinstance(worker, HostWorker)
    await worker.retire()


class HostOptions(ExecutorOptions, total=False):
    """Every option `HostExecutor` takes (all by keyword), typed for ``open_executor("host", ...)``:
    the common ones and the executor's own (its docstring says what each does and its default)."""

    isolation: Isolation
    pool: bool
    preload: Sequence[str | os.PathLike[str]]
    workdir_at: str | None


class HostExecutor(Executor):
    """Runs code in a worker process on this machine. See the module docs for the isolation levels.

    Args:
        isolation: ``"auto"`` (the default: namespaces when bubblewrap works here, else process),
            ``"namespaces"`` (fail if unavailable) or ``"process"``.
        pool: (default True) take a pre-started worker from the warm pool (not possible with an explicit `workdir`);
            for options opened recently, one whose runner has already answered this executor's
            `init` (see `HostPools`), so opening costs no round trip to the runner.
        preload: trusted Python files (``name.py``) imported once, in the fork server, before any
            session: every session then has them in ``sys.modules`` (``import name`` costs nothing,
            subject to the policy's import allowlist like any import). What many sessions share (a
            harness driver) is compiled and loaded once instead of sent and compiled per session.
            The files' code runs with the fork server's rights: only ever your own code.
        workdir_at: an absolute path where the session sees its explicit `workdir` (and works),
            e.g. E2B's ``/home/user``, so code naming that path literally reaches the directory the
            files API reads. Namespaces level only (its own mount namespace); at the process level
            there is none, and the directory keeps its own path.

    (and the common `ExecutorOptions`)
    """

    backend = "host"

    def __init__(
        self,
        *,
        isolation: Isolation = "auto",
        pool: bool = True,
        preload: Sequence[str | os.PathLike[str]] = (),
        workdir_at: str | None = None,
        **options: Unpack[ExecutorOptions],
    ) -> None:
        super().__init__(**options)
        if isolation not in ("auto", "namespaces", "process"):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'process', not {isolation!r}")
        if workdir_at is not None:
            if self.workdir is None:
                raise ValueError("workdir_at names where an explicit workdir= is seen: give workdir= too")
            if not _mount_point(workdir_at):
                raise ValueError(
                    f"workdir_at must be an absolute, normalised path below / (e.g. '/home/user'), not {workdir_at!r}"
                )
        self.workdir_at = workdir_at
        if os.name != "posix":
            raise BackendUnavailable("the host backend needs a POSIX system (Linux or macOS)")
        self.requested_isolation = isolation
        self.use_pool = pool and self.workdir is None
        self.preload = stage_preload(preload)
        self._bundle_path: str | None = None

    def _isolation_level(self) -> str:
        if self.requested_isolation == "process":
            return "process"
        if namespaces_available():
            return "namespaces"
        if self.requested_isolation == "namespaces":
            from .process import bubblewrap

            raise BackendUnavailable(f"{bubblewrap().problem}; or use isolation='process'")
        return "process"

    async def _level(self) -> str:
        """The isolation level, found once per process and request (finding it may start a probe:
        in a worker thread, that first time only)."""
        level = _LEVELS.get(self.requested_isolation)
        if level is None:
            level = _LEVELS[self.requested_isolation] = await anyio.to_thread.run_sync(self._isolation_level)
        return level

    def _runner_init(self) -> InitRequest:
        init = super()._runner_init()
        if self.policy.network_policy is not None:
            init["env"] = with_proxy_environment(init["env"], self._bundle_path)
        return init

    async def _new_session(self) -> Session:
        rules = self.policy.network_policy
        # A session with secrets trusts a CA of its own: its bundle's name is in its environment.
        self._bundle_path = ca_bundle_path() if rules is not None and rules.secrets else None
        session = await self._open_session()
        if rules is not None:
            try:
                await _attach_egress(session, rules, self._bundle_path)
            except BaseException:
                await session.discard()
                raise
        return session

    async def _open_session(self) -> RunnerSession:
        level = await self._level()
        if self.policy.network_policy is not None and level != "namespaces":
            raise EgressUnavailable(
                "network=True on the host backend needs its 'namespaces' level (bubblewrap), which gives "
                "the session a network of its own behind the egress gateway; the 'process' level would "
                "share this machine's network. Install bubblewrap, or use the docker backend"
            )
        key = (level, self.policy.network_policy is not None, self.preload)
        init = self._runner_init()
        if not self.use_pool:
            at = self.workdir_at if level == "namespaces" else None
            return await self._runner_session(await _spawn(key, self.workdir, at), init, release=_retire)
        POOLS.deferred.run_all()  # earlier sessions' refills wait no longer: this open may need their workers
        ready_key = (key, init_key(init))
        worker, initialised = POOLS.take(key, ready_key)
        if worker is None:  # started before the refill is queued behind it in the spawner thread
            worker = await _spawn(key, None)
        else:
            _LIVE_WORKERS.add(worker)
        unique = self._bundle_path is not None  # the init names this session's own CA bundle
        refill = POOLS.deferred.add(functools.partial(POOLS.refill, key, ready_key, initialised, not unique))
        try:
            session = await self._runner_session(worker, init, release=_retire, initialised=initialised)
        except BaseException:
            POOLS.deferred.run(refill)
            raise
        # Refilling forks, warms up and initialises a worker: on two cores that slowed the session's
        # first run by about as much as the handshake saved, so it waits for that run to end.
        session.after_first_run = functools.partial(POOLS.deferred.run, refill)
        return session


async def _attach_egress(session: RunnerSession, rules: NetworkPolicy, bundle_path: str | None) -> None:
    """The egress gateway's listener into the runner's own network namespace (before any code ran)."""
    worker = session.worker
    assert isinstance(worker, HostWorker)

    def attach() -> None:
        tree = worker.process_tree()
        if tree is None:
            raise EgressUnavailable("the session's runner process cannot be found for its egress gateway")
        session.egress = attach_process_blocking(tree.pid, tree.alive, rules, bundle_path)

    await anyio.to_thread.run_sync(attach)


def _mount_point(path: str) -> bool:
    """An absolute, normalised path other than / (bubblewrap binds the working directory there)."""
    return path.startswith("/") and path != "/" and os.path.normpath(path) == path and "\x00" not in path


_LEVELS: dict[str, str] = {}
"""The isolation level each requested isolation resolved to (it cannot change within a process)."""
