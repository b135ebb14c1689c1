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
from collections import Counter, OrderedDict
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
from ...threadwait import result_of
from ...worker import Worker, WorkerExited
from ..resources import WarmPool, resources
from .demand import BASE_POOL, POOL_PER_CORE, SPAWNERS_PER_CORE, Demand, fixed_sizing, usable_cores
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
"""What the host backend keeps for the process: its spawner threads (workers are spawned from
long-lived threads, one per core: a child's "die with parent" signal fires when the *thread* that
forked it exits, and anyio's worker threads come and go), the reaper, the fork servers and the warm pools (`POOLS`),
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
    return await result_of(_spawner_submit(make_worker, key[0], workdir, key[1], key[2], workdir_at))


def init_key(init: InitRequest) -> str:
    """The canonical text of an `init` request: two sessions whose requests have the same text are
    started alike, so either may take the other's pre-initialised worker."""
    return json.dumps(init, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------- the pools

POOL_SIZE = BASE_POOL
"""Idle workers kept per key, in each kind of pool, without a burst of opens (`demand.py` sizes the
pools up to `MAX_POOL` for the recent peak of opens in flight)."""
MAX_POOL = POOL_PER_CORE * usable_cores()
"""The most idle workers kept per key: 4 per core."""
MAX_SPAWNERS = SPAWNERS_PER_CORE * usable_cores()
"""The most spawner threads making workers at once: one per core."""
READY_KEYS = 4
"""Option sets (`ReadyKey`s) that keep initialised workers: the most recently opened ones."""

# One thread per core (one in the fixed sizing of before): the refills use as many as `Demand` says.
RESOURCES.declare("spawn", 1 if fixed_sizing() else MAX_SPAWNERS)


class _Want:
    """What the refills after the opens of one option set ask for (merged until satisfied)."""

    __slots__ = ("key", "ready_key", "ready", "full_ready", "started")

    def __init__(self, key: PoolKey, ready_key: ReadyKey) -> None:
        self.key, self.ready_key = key, ready_key
        self.ready = False  # initialised workers for `ready_key`: one, or
        self.full_ready = False  # the pool's size (an open found one ready: these options recur)
        self.started = False  # started workers for `key` (an open found none ready)


class HostPools:
    """The idle workers of this process, shared by every executor (event loops in any thread) and
    filled by the spawner threads; closed (every idle worker killed) with the backend's resources.

    Two `WarmPool`s: *started* workers (warmed up, no `init` yet) per `PoolKey`, without bound in
    keys; and *ready* ones per `ReadyKey`, whose `init` handshake is done ahead, for only the
    `READY_KEYS` option sets most recently opened: a new one evicts the least recently opened, whose
    idle workers are killed, so many option sets (a policy per problem) never pile up idle processes.
    An open takes a ready worker of its options; failing that a started one (its handshake then on
    the open's path, as for any first open of new options); failing that it starts one.

    How many of each are kept, and how many spawner threads make them at once, is `demand`'s answer
    (`demand.py`): `POOL_SIZE` for one caller opening in turn, up to the recent peak of opens in
    flight under a burst; a timer sizes the pools back down once that peak is `SHRINK_AFTER` old."""

    def __init__(self, demand: Demand | None = None) -> None:
        self.started: WarmPool[PoolKey, HostWorker] = WarmPool(
            HostWorker.is_alive, _kill_off_path, on_put=_LIVE_WORKERS.discard
        )
        self.ready: WarmPool[ReadyKey, HostWorker] = WarmPool(
            HostWorker.is_alive, _kill_off_path, max_keys=READY_KEYS, on_put=_LIVE_WORKERS.discard
        )
        self.deferred = _Deferred()
        self.demand = demand if demand is not None else Demand(fixed=fixed_sizing())
        self._lock = threading.Lock()
        self._wants: OrderedDict[tuple[PoolKey, ReadyKey], _Want] = OrderedDict()  # most recent last
        self._making: Counter[tuple[str, object]] = Counter()  # workers being made, per pool and key
        self._evicted: list[HostWorker] = []  # idle workers of evicted option sets, to kill
        self._chains = 0  # spawner tasks refilling (each makes one worker, then queues itself again)
        self._trimmer: threading.Timer | None = None

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
            return self._chains > 0 or len(self.deferred) > 0

    def sizes(self) -> dict[str, Any]:
        """The sizing now (`PoolSizes`) and the idle workers of each pool, in all and in its largest
        key (the Ray node agent's `pools()`)."""
        ready, started = self.ready.by_key(), self.started.by_key()
        return {
            **self.demand.sizes().model_dump(),
            "ready": sum(map(len, ready.values())),
            "ready_largest": max(map(len, ready.values()), default=0),
            "started": sum(map(len, started.values())),
            "started_largest": max(map(len, started.values()), default=0),
        }

    def close(self) -> None:
        """Kill every idle worker (blocking)."""
        with self._lock:
            trimmer, self._trimmer = self._trimmer, None
            self._wants.clear()
            evicted, self._evicted = self._evicted, []
        if trimmer is not None:
            trimmer.cancel()
        for worker in self.started.drain() + self.ready.drain() + evicted:
            worker.kill_now()

    def refill(self, key: PoolKey, ready_key: ReadyKey, hit: bool, keep_ready: bool = True) -> None:
        """Top the pools up in the background spawner threads after an open; nobody waits for it.

        After an open that found an initialised worker the ready pool of its options is topped up to
        the pool size; after one that did not (new options, or the pool ran dry), to one worker only,
        so options opened once cost one spare handshake, not a pool, and the started pool to the
        pool size. `keep_ready=False`: options no other open will have (a session's own CA bundle in
        its environment) get no ready worker, and evict no other options' ready workers."""
        evicted = self.ready.want(ready_key) if keep_ready else []
        with self._lock:
            want = self._wants.pop((key, ready_key), None) or _Want(key, ready_key)
            want.ready |= keep_ready
            want.full_ready |= keep_ready and hit
            want.started |= not hit
            self._wants[(key, ready_key)] = want
            self._evicted += evicted
        self._kick()

    def _kick(self) -> None:
        """Start refilling tasks up to the spawners the demand allows now."""
        with self._lock:
            start = max(0, self.demand.spawners() - self._chains) if self._wants or self._evicted else 0
            self._chains += start
        for _ in range(start):
            try:
                _spawner_submit(self._chain)
            except RuntimeError:  # the interpreter is exiting: nothing is refilled any more
                with self._lock:
                    self._chains -= 1
                    evicted, self._evicted = self._evicted, []
                for idle in evicted:
                    idle.kill_now()

    def _chain(self) -> None:
        # One worker a task: an open that found the pools empty queues its own worker behind at most
        # one being made per spawner, not behind whole refills.
        again = False
        try:
            with self._lock:
                evicted, self._evicted = self._evicted, []
            for idle in evicted:
                idle.kill_now()
            job = self._next_job()
            if job is not None:
                if not self._make(*job):
                    with self._lock:  # making it failed: left to the next cold start, as before
                        self._wants.pop((job[1].key, job[1].ready_key), None)
                self._schedule_trim()
                with self._lock:
                    again = bool(self._wants) and self._chains <= self.demand.spawners()
                if again:
                    _spawner_submit(self._chain)
        except RuntimeError:  # the interpreter is exiting
            again = False
        finally:
            if not again:
                with self._lock:
                    self._chains -= 1

    def _next_job(self) -> tuple[str, _Want] | None:
        """The next worker the pools lack (the ready one first: the next open of these options is the
        likeliest to come; the most recently opened options first), counted as being made. Wants
        found satisfied are dropped."""
        with self._lock:
            size = self.demand.pool_size()
            for pair, want in reversed(list(self._wants.items())):
                ready_key, key = want.ready_key, want.key
                if want.ready and self.ready.wanted(ready_key):
                    have = self.ready.count(ready_key) + self._making["ready", ready_key]
                    if have < (size if want.full_ready else 1):
                        self._making["ready", ready_key] += 1
                        return "ready", want
                if want.started and self.started.count(key) + self._making["started", key] < size:
                    self._making["started", key] += 1
                    return "started", want
                del self._wants[pair]
        return None

    def _make(self, kind: str, want: _Want) -> bool:
        """Make the worker `_next_job` chose and pool it; False when that failed."""
        counted = (kind, want.ready_key if kind == "ready" else want.key)
        try:
            # a started worker's session is not known yet: it is warmed up for the default, guarded
            init = cast(InitRequest, json.loads(want.ready_key[1])) if kind == "ready" else None
            guarded = init is None or init["policy"].get("python_guards", True) is not False
            worker = _started_worker(want.key, guarded)
            if worker is None:
                return False
            if init is None:
                self.started.put(want.key, worker)
                return True
            if not (_initialise(worker, init) and self.ready.put(want.ready_key, worker, only_wanted=True)):
                worker.kill_now()  # a failed handshake (or evicted meanwhile): never handed out
                return False
            return True
        finally:
            with self._lock:
                self._making[counted] -= 1
                if self._making[counted] <= 0:
                    del self._making[counted]

    def _schedule_trim(self) -> None:
        """Arm the timer that sizes the pools down once the peak they were filled for is forgotten."""
        delay = self.demand.expires_in()
        if delay is None:
            return
        with self._lock:
            if self._trimmer is not None:
                return
            self._trimmer = threading.Timer(delay + 0.05, self._trim)
            self._trimmer.daemon = True
            self._trimmer.start()

    def _trim(self) -> None:
        with self._lock:
            self._trimmer = None
        size = self.demand.pool_size()
        for worker in self.ready.trim(size) + self.started.trim(size):
            worker.kill_now()
        self._schedule_trim()  # a lower peak, still above the base, is forgotten later


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


def _started_worker(key: PoolKey, python_guards: bool = True) -> HostWorker | None:
    """A new worker, warmed up (in the spawner thread) for a session with or without the Python
    guards; None if it could not start or warm up."""
    try:
        worker = make_worker(key[0], None, key[1], key[2])
    except WorkerStartError:
        return None
    if not worker.warm_up(python_guards=python_guards):
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
        # The pools are sized to the opens in flight at once: from here until the session's first
        # run ended (a grader's whole use of it; an agent's first step), or it closed.
        token = POOLS.demand.begin()
        try:
            session = await self._pooled_session(key, init)
        except BaseException:
            POOLS.demand.end(token)
            raise
        refill, session.after_first_run = session.after_first_run, None
        session.after_first_run = functools.partial(_first_run_ended, token, refill)
        return session

    async def _pooled_session(self, key: PoolKey, init: InitRequest) -> RunnerSession:
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


def _first_run_ended(token: int, refill: Callable[[], None] | None) -> None:
    POOLS.demand.end(token)
    if refill is not None:
        refill()


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
