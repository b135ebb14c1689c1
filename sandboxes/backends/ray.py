"""The ray backend: sandbox sessions spread over a Ray cluster, each run by its node's host or Docker backend.

``open_executor("ray", node_backend="host", address=None, **node_options)``

Placement. Every node declares how many sandboxes it takes as the custom resource
``kodeagent_sandbox`` (``ray start --resources='{"kodeagent_sandbox": 8}'``; a cluster that declares
none is sized by its CPUs instead). A session reserves one unit in a placement group of a single
bundle; Ray's scheduler picks the node, and a session that finds the cluster full waits in Ray's queue
until a unit frees (up to `placement_timeout`). No scheduler of our own. A closed session's unit stays
with this process for `LINGER` seconds, so that the next session takes it at once instead of waiting for
Ray to learn from the node's next resource report that it is free.

Transport: one actor per node, sessions multiplexed on it (`raynode.NodeAgent`), not an actor per
session. Measured here on a local 3-node cluster: creating an actor costs 0.8-1.9 s (a new worker
process that then imports `sandboxes`), and each such process would start its own fork server and its
own warm pool, so every session would be a cold one; a placement group of one bundle costs about 4 ms
and a call to a running actor about 0.5-1.5 ms. So the node's agent is created once (named per node,
detached, so later drivers find it warm), holds the node's warm pools, and a session costs a placement
group plus one call. A plain call answered with the next event was also cheaper than a Ray streaming
generator (1.6 ms against 3 ms per round trip on the loaded machine), so a run is one call when the code
calls no tools, and one more per tool call.

Shape: the parent delegates whole runs to an executor of the node's backend living in the agent, rather
than tunnelling the runner's channel through a `Worker` subclass. The node-local executor then keeps
every backend-specific hook (Docker's init message and pool refill, the host's isolation levels), checks
liveness next to the worker without a cluster round trip, and enforces the timeout next to the worker,
so a slow network never stretches it. The parent keeps what must stay with the caller: tools run here
(the node holds async stubs that surface each call as an event; see `raynode`), and results are the
node's `ExecutionResult` with the duration measured here.

Faults. The agents are created with ``max_restarts=0`` and ``max_task_retries=0``: Ray never runs a
call twice, so a snippet never runs twice. A node (or agent) lost during a run makes that run return
``state_lost`` with error type ``WorkerCrashed``; the session is dropped and the next run places a
fresh one, which Ray puts on a live node; a dead agent's name is free again, so the next session on
that node gets a new agent. No cluster reachable at open raises `BackendUnavailable` with the fix.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import hashlib
import os
import pathlib
import signal
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from ..errors import BackendUnavailable, ExecutorClosed, SandboxFileError, WorkerStartError
from ..executor import DEFAULT_OUTPUT_LIMIT, DEFAULT_TIMEOUT, KILL_TIMEOUT, Executor, ToolFunction
from ..models import ExecutionError, ExecutionResult
from ..policy import Policy
from ..worker import Worker
from . import executor_class
from .raynode import RAISABLE, NodeAgent

SANDBOX_RESOURCE = "kodeagent_sandbox"
"""The custom resource by which a node declares how many sandbox sessions it takes."""
NAMESPACE = "kodeagent"
NODE_BACKENDS = ("host", "docker")
RUN_SLACK = 60.0
"""Seconds past the session's timeout before the parent gives up on a node that does not answer (the
node enforces the timeout itself; this only catches a node that went silent)."""
CONNECT_TIMEOUT = 60.0
LINGER = 2.0
"""Seconds a closed session's reservation (its placement group) stays with this process for its next
session before it is given back to the cluster. Why: Ray learns that a unit was freed from the nodes'
periodic resource reports, so a session opened just as another closed waited 0.3-0.7 s here (the
throughput of a full cluster fell to a third); reusing the reservation costs nothing. The price: for
LINGER seconds other drivers cannot take that unit. 0 gives every reservation back at once."""
LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024
"""Object store of a local cluster started here: sessions pass small messages, not datasets."""
INSTALL_HINT = "pip install 'kodeagent[ray]'"
START_HINT = (
    "start a cluster with `ray start --head --resources='{\"kodeagent_sandbox\": 4}'` (and "
    "`ray start --address=HEAD:6379 --resources=...` on the other machines), or pass address=None to "
    "start a local one here"
)

# ray.init starts the local cluster's processes with "die with parent" tied to the *thread* that
# started them, so it must run on a thread that lives as long as the process (not anyio's pool).
_INIT_THREAD = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kodeagent-ray")
_lock = threading.Lock()
_resource: str | None = None
_agents: dict[str, Any] = {}
_agent_class: Any = None
_job: str | None = None
"""The Ray job these caches belong to: after ray.shutdown() and a new ray.init() they are stale."""


@dataclass
class Reservation:
    """A unit of a node's sandbox capacity held by a placement group of one bundle."""

    group: Any
    node_id: str
    resource: str
    idle_since: float = 0.0


_idle: list[Reservation] = []
_waiters: list[tuple[str, concurrent.futures.Future[Reservation]]] = []
"""Sessions of this process waiting in Ray's queue for a unit: a closing session hands its unit to the
first of them directly (Ray would see it free only at the node's next resource report, seconds later)."""
_sweeper: threading.Thread | None = None


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailable(f"the ray backend needs the ray package: {INSTALL_HINT}") from exc
    return ray


# ---------------------------------------------------------------------- the cluster


def _reachable(address: str) -> bool:
    """Whether something accepts TCP connections at ``host:port`` (ray.init itself retries for minutes)."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return True  # not host:port (e.g. "local"): let ray.init judge it
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return True
    except OSError:
        return False


def _connect(address: str | None, init_options: Mapping[str, Any], start_local: bool = True) -> None:
    """Join the cluster at `address`; with None join a running one or start a local one (blocking)."""
    ray = _ray()
    if ray.is_initialized():
        return
    options: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False, **init_options}
    if address is None:
        try:
            ray.init(address="auto", **options)
            return
        except ConnectionError:
            if not start_local:
                raise BackendUnavailable(f"no Ray cluster is running here; {START_HINT}") from None
        cpus = os.cpu_count() or 1
        local = {"resources": {SANDBOX_RESOURCE: cpus}, "include_dashboard": False,
                 "object_store_memory": LOCAL_OBJECT_STORE_BYTES}  # fmt: skip
        try:
            ray.init(**{**local, **options})
        except Exception as exc:
            raise BackendUnavailable(f"could not start a local Ray cluster ({exc}); {START_HINT}") from exc
        atexit.register(_stop_local_cluster, node_processes())  # runs before Ray's own exit handler
        return
    if not _reachable(address):
        raise BackendUnavailable(f"no Ray cluster answers at {address!r}: {START_HINT}")
    try:
        ray.init(address=address, **options)
    except Exception as exc:
        raise BackendUnavailable(f"could not join the Ray cluster at {address!r} ({exc}); {START_HINT}") from exc


def node_processes(nodes: Any = None) -> set[int]:
    """Process ids of Ray's own processes on `nodes` (`ray._private.node.Node` objects; default: the
    local node this process started), for `kill_leftovers`."""
    if nodes is None:
        import ray._private.worker as ray_worker

        nodes = [ray_worker._global_node] if getattr(ray_worker, "_global_node", None) is not None else []
    return {info.process.pid for node in nodes for infos in getattr(node, "all_processes", {}).values()
            for info in infos if getattr(info, "process", None) is not None}  # fmt: skip


def descendants(roots: set[int]) -> set[int]:
    """`roots` and every process below them now (read from /proc; empty elsewhere)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), set(roots) & set(parents)
    while frontier:
        found |= frontier
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
    return found


def kill_leftovers(pids: set[int]) -> None:
    """SIGKILL what is left of `pids` (and never this process). Ray's per-node agents and the workers of
    detached actors can outlive their raylet by a minute and ignore SIGTERM meanwhile."""
    for pid in pids - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _stop_local_cluster(roots: set[int]) -> None:
    """At exit of the process that started a local cluster: stop it, and everything it started."""
    leftover = descendants(roots)
    with _lock:
        _idle.clear()
    try:
        _ray().shutdown()
    finally:
        kill_leftovers(leftover)


def connect(address: str | None = None, init_options: Mapping[str, Any] | None = None,
            start_local: bool = True) -> None:  # fmt: skip
    """Connect this process to a Ray cluster once (blocking; see `RayExecutor` for `address`). With
    `start_local` False and no cluster running, raise `BackendUnavailable` instead of starting one."""
    future = _INIT_THREAD.submit(_connect, address, dict(init_options or {}), start_local)
    try:
        future.result(timeout=CONNECT_TIMEOUT)
    except concurrent.futures.TimeoutError:
        raise BackendUnavailable(
            f"joining the Ray cluster at {address or 'auto'!r} took more than {CONNECT_TIMEOUT:g} s; {START_HINT}"
        ) from None


def sandbox_resource(refresh: bool = False) -> str:
    """The resource a session reserves: ``kodeagent_sandbox`` when the cluster declares it, else ``CPU``."""
    global _resource
    if _resource is None or refresh:
        totals = _ray().cluster_resources()
        name = SANDBOX_RESOURCE if totals.get(SANDBOX_RESOURCE, 0) >= 1 else "CPU"
        if totals.get(name, 0) < 1:
            raise BackendUnavailable(f"the Ray cluster declares no capacity for sandboxes; {START_HINT}")
        _resource = name
    return _resource


def capacity(address: str | None = None, init_options: Mapping[str, Any] | None = None) -> int:
    """How many sandbox sessions the cluster takes at once (the sum over its live nodes)."""
    connect(address, init_options)
    return int(_ray().cluster_resources().get(sandbox_resource(refresh=True), 0))


def describe(address: str | None = None, init_options: Mapping[str, Any] | None = None,
             start_local: bool = True) -> dict[str, Any]:  # fmt: skip
    """The cluster as `kodeagent doctor` reports it: live nodes and the sandboxes each takes."""
    connect(address, init_options, start_local)
    ray = _ray()
    resource = sandbox_resource(refresh=True)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {
        "address": ray.get_runtime_context().gcs_address,
        "resource": resource,
        "nodes": [{"node_id": n["NodeID"], "ip": n.get("NodeManagerAddress"),
                   "sandboxes": int(n.get("Resources", {}).get(resource, 0))} for n in nodes],  # fmt: skip
        "capacity": int(sum(n.get("Resources", {}).get(resource, 0) for n in nodes)),
    }


def _code_version() -> str:
    """A hash of this `sandboxes` package's source, so a driver never talks to an agent of other code."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parent.parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"=" + path.read_bytes())
    return digest.hexdigest()[:12]


_VERSION = _code_version()


def agent(node_id: str) -> Any:
    """The handle of `node_id`'s agent, created there on first use (named, detached: later drivers reuse it)."""
    global _agent_class
    handle = _agents.get(node_id)
    if handle is None:
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with _lock:
            if _agent_class is None:
                _agent_class = ray.remote(NodeAgent)
        handle = _agent_class.options(
            name=f"sandboxes-{_VERSION}-{node_id}",
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,  # the sessions' capacity is held by their placement groups, not by the agent
            max_restarts=0,  # never restarted, and
            max_task_retries=0,  # no call retried: a snippet cannot run twice
            max_concurrency=10_000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote()
        _agents[node_id] = handle
    return handle


def forget_agent(node_id: str) -> None:
    """Drop a cached agent handle (its actor died); the next session on the node creates a new agent."""
    _agents.pop(node_id, None)


def _check_job() -> None:
    """Forget the caches of an earlier connection (a new ray.init() after ray.shutdown())."""
    global _job, _resource
    job = _ray().get_runtime_context().get_job_id()
    if job != _job:
        with _lock:
            _agents.clear()
            _idle.clear()
            _resource = None
            _job = job


def _take_reservation(resource: str) -> Reservation | None:
    with _lock:
        for index in range(len(_idle) - 1, -1, -1):
            if _idle[index].resource == resource:
                return _idle.pop(index)
    return None


def _keep_reservation(reservation: Reservation) -> None:
    """Hold a closed session's reservation for the next session of this process (see `LINGER`)."""
    global _sweeper
    with _lock:
        while _waiters:
            resource, waiter = _waiters[0]
            if resource != reservation.resource:
                break
            del _waiters[0]
            if waiter.set_running_or_notify_cancel():
                waiter.set_result(reservation)
                return
    if LINGER <= 0:
        _remove_quietly(reservation.group)
        return
    reservation.idle_since = time.monotonic()
    with _lock:
        _idle.append(reservation)
        if _sweeper is None:
            _sweeper = threading.Thread(target=_sweep_forever, name="kodeagent-ray-linger", daemon=True)
            _sweeper.start()


def _drop_reservations(node_id: str) -> None:
    with _lock:
        dropped = [r for r in _idle if r.node_id == node_id]
        _idle[:] = [r for r in _idle if r.node_id != node_id]
    for reservation in dropped:
        _remove_quietly(reservation.group)


@atexit.register
def _forget_reservations() -> None:
    """At exit nothing is given back one by one: the job's end removes its placement groups."""
    with _lock:
        _idle.clear()


def _sweep_forever() -> None:
    """Give reservations idle for LINGER seconds back to the cluster."""
    while True:
        time.sleep(max(LINGER / 4, 0.1))
        now = time.monotonic()
        with _lock:
            expired = [r for r in _idle if now - r.idle_since >= LINGER]
            _idle[:] = [r for r in _idle if now - r.idle_since < LINGER]
        for reservation in expired:
            _remove_quietly(reservation.group)


# ---------------------------------------------------------------------- the executor


@dataclass
class Placement:
    """Where a session lives: its placement group (which holds the capacity), node and agent."""

    session_id: str
    reservation: Reservation
    agent: Any

    @property
    def node_id(self) -> str:
        return self.reservation.node_id


class RayExecutor(Executor):
    """Runs each session on a Ray cluster node, through that node's host or Docker backend.

    Args:
        node_backend: ``"host"`` or ``"docker"``: the backend that runs the session on its node.
        address: the cluster to join (``"HOST:PORT"``, ``"ray://HOST:PORT"``); None joins a running
            cluster of this machine if there is one, else starts a local one sized by its CPUs.
            A process already connected to Ray (``ray.init`` was called) keeps its connection.
        placement_timeout: seconds a session waits for free capacity on the cluster at open.
        init_options: extra keyword arguments of ``ray.init`` when this process connects.
        node_options: options of the node's backend (e.g. ``isolation``, ``image``, ``memory_mb``).
        (and the common options of `Executor`, passed to the node's backend; tools run here)
    """

    backend = "ray"

    def __init__(
        self,
        *,
        policy: Policy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        env: Mapping[str, str] | None = None,
        tools: Mapping[str, ToolFunction] | None = None,
        workdir: str | None = None,
        stateless: bool = False,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        node_backend: Literal["host", "docker"] = "host",
        address: str | None = None,
        placement_timeout: float = 300.0,
        init_options: Mapping[str, Any] | None = None,
        **node_options: Any,
    ) -> None:
        super().__init__(policy=policy, timeout=timeout, env=env, tools=tools, workdir=workdir,
                         stateless=stateless, output_limit=output_limit)  # fmt: skip
        if node_backend not in NODE_BACKENDS:
            raise ValueError(f"node_backend must be one of {', '.join(NODE_BACKENDS)}, not {node_backend!r}")
        self.node_backend = node_backend
        self.address = address
        self.placement_timeout = float(placement_timeout)
        self.init_options = dict(init_options or {})
        self.node_options: dict[str, Any] = {
            "policy": self.policy, "timeout": self.timeout, "env": self.env, "workdir": workdir,
            "stateless": stateless, "output_limit": output_limit, **node_options,
        }  # fmt: skip
        executor_class(node_backend)(**self.node_options)  # refuses unknown or invalid options now, not at open
        self._placement: Placement | None = None

    async def _start_worker(self) -> Worker:  # pragma: no cover - sessions are opened by `_place`
        raise NotImplementedError("the ray backend delegates whole sessions to its nodes")

    @property
    def node_id(self) -> str | None:
        """The Ray node id of the session's node (None before open, after close, after a lost node)."""
        return self._placement.node_id if self._placement else None

    # ----------------------------------------------------------------- lifecycle

    async def open(self) -> RayExecutor:
        """Connect to the cluster and place the session on a node. Raises `BackendUnavailable` when no
        cluster is reachable or it declares no capacity."""
        if self._closed:
            raise ExecutorClosed("this executor was closed; create a new one")
        if not self._opened:
            self._opened = True
            try:
                if not _ray().is_initialized():
                    await anyio.to_thread.run_sync(connect, self.address, self.init_options)
                await self._place()
            except BaseException:
                self._opened = False
                raise
        return self

    async def close(self) -> None:
        """Close the session on its node and free its capacity. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        placement, self._placement = self._placement, None
        if placement is not None:
            with anyio.CancelScope(shield=True):
                await _release(placement)

    async def _place(self) -> None:
        """Reserve a unit of capacity (Ray picks the node; or this process's idle reservation is reused),
        then open the session on that node's agent."""
        from ray.exceptions import RayActorError, RayError

        _check_job()
        resource = sandbox_resource()
        for attempt in (1, 2, 3):
            reservation = _take_reservation(resource) or await self._reserve(resource)
            handle = agent(reservation.node_id)
            session_id = uuid.uuid4().hex
            try:
                answer = await handle.open.remote(session_id, reservation.group.id.hex(), self.node_backend,
                                                  self.node_options, sorted(self.tools))  # fmt: skip
            except RayActorError as exc:
                # The agent (or its node) died: forget it and its node's reservations; try once more.
                forget_agent(reservation.node_id)
                _drop_reservations(reservation.node_id)
                _remove_quietly(reservation.group)
                if attempt == 3:
                    raise WorkerStartError(f"the Ray cluster could not start a session: {_describe(exc)}") from exc
                continue
            except RayError as exc:
                _remove_quietly(reservation.group)
                raise WorkerStartError(f"the Ray cluster could not start a session: {_describe(exc)}") from exc
            except BaseException:
                _remove_quietly(reservation.group)
                raise
            if answer["kind"] == "error":
                _keep_reservation(reservation)
                raise RAISABLE.get(answer["type"], WorkerStartError)(answer["message"])
            self._placement = Placement(session_id, reservation, handle)
            self._isolation = answer["isolation"]
            return

    async def _reserve(self, resource: str) -> Reservation:
        """A new placement group of one unit; Ray's scheduler picks the node, or queues it while full.
        While queued, a unit another session of this process gives up is taken instead."""
        import asyncio

        from ray.util.placement_group import placement_group, placement_group_table

        group = placement_group([{resource: 1}])
        handoff: concurrent.futures.Future[Reservation] = concurrent.futures.Future()
        with _lock:
            _waiters.append((resource, handoff))
        ready = asyncio.ensure_future(group.ready())
        handed = asyncio.wrap_future(handoff)
        finished = False
        try:
            with anyio.fail_after(self.placement_timeout):
                await asyncio.wait({ready, handed}, return_when=asyncio.FIRST_COMPLETED)
            finished = True
        except TimeoutError:
            raise WorkerStartError(
                f"no sandbox capacity became free on the Ray cluster within {self.placement_timeout:g} s: "
                "close idle sessions, add nodes, or raise placement_timeout"
            ) from None
        finally:
            with _lock:
                if (resource, handoff) in _waiters:
                    _waiters.remove((resource, handoff))
                handed_over = not handoff.cancel()  # False once a closing session set it: the unit is ours
            ready.cancel()
            placed = ready.done() and not ready.cancelled() and ready.exception() is None
            if handed_over or not placed or not finished:
                _remove_quietly(group)
            if handed_over and not finished:
                _keep_reservation(handoff.result())  # cancelled or timed out: pass the unit on
        if handed_over:
            return handoff.result()
        ready.result()  # raises the placement's own failure, if it failed
        return Reservation(group, placement_group_table(group)["bundles_to_node_id"][0], resource)

    async def _lose(self, placement: Placement, exc: BaseException | None = None) -> None:
        """Drop a session whose node failed or went silent; the next run places a new one."""
        from ray.exceptions import RayActorError

        if self._placement is placement:
            self._placement = None
        if isinstance(exc, RayActorError):
            forget_agent(placement.node_id)
            _drop_reservations(placement.node_id)
        with anyio.CancelScope(shield=True):
            await _release(placement, timeout=5.0, keep=False)

    # ----------------------------------------------------------------- running code

    async def run(self, code: str | bytes) -> ExecutionResult:
        """Run `code` in the session on its node and return what happened. Never raises because of the code."""
        self._check_usable()
        async with self._lock:
            started = time.perf_counter()
            try:
                result = await self._run_locked(code)
            except BaseException:
                # Cancelled mid-run: the session's state is unknown, so it is replaced.
                if self._placement is not None:
                    await self._lose(self._placement)
                self._state_lost_pending = True
                raise
            result.duration = time.perf_counter() - started
            result.backend = self.backend
            return result

    async def _run_locked(self, code: str | bytes) -> ExecutionResult:
        from ray.exceptions import RayError

        if self._placement is None:
            await self._place()
        state_lost, self._state_lost_pending = self._state_lost_pending, False
        placement = self._placement
        assert placement is not None
        limit = self.timeout + RUN_SLACK
        try:
            with anyio.fail_after(limit):
                event = await placement.agent.run.remote(placement.session_id, code)
                while event["kind"] == "tool":
                    event = await self._serve_tool(placement, event)
        except TimeoutError:
            await self._lose(placement)
            return ExecutionResult(timed_out=True, state_lost=True, error=ExecutionError(
                type="Timeout", message=f"the cluster node did not answer within {limit:g} s; the session was "
                "dropped and the next run starts a fresh one; variables from earlier runs are lost"))  # fmt: skip
        except RayError as exc:
            await self._lose(placement, exc)
            return _node_lost(_describe(exc))
        if event["kind"] == "lost":
            await self._lose(placement)
            return _node_lost(event["message"])
        if event["kind"] == "error":
            raise RAISABLE.get(event["type"], WorkerStartError)(event["message"])
        result = ExecutionResult.model_validate(event["result"])
        result.state_lost = result.state_lost or state_lost
        return result

    async def _serve_tool(self, placement: Placement, call: dict[str, Any]) -> dict[str, Any]:
        """Call the tool here while waiting for the run's next event: if the node's timeout ends the run
        first, the tool is abandoned (a blocking one in its thread), as on the local backends."""
        from ray.exceptions import RayError

        async def answer() -> None:
            reply = await self._call_tool(call)
            try:
                await placement.agent.answer.remote(placement.session_id, call["id"], reply)
            except RayError:
                pass  # the node is gone: `next_event` below reports it

        failure: RayError | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(answer)
            try:
                event: dict[str, Any] = await placement.agent.next_event.remote(placement.session_id)
            except RayError as exc:  # raised outside the group, so the caller sees it, not a group of it
                failure = exc
            group.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return event

    # ----------------------------------------------------------------- state and files

    async def reset(self) -> None:
        """Forget every variable of the session (the working directory's files stay)."""
        self._check_usable()
        async with self._lock:
            if self._placement is None:
                await self._place()
            else:
                await self._node_call("reset")
            self._state_lost_pending = False

    async def upload(self, path: str, data: bytes | str) -> None:
        """Write a file into the session's working directory on its node (`path` is relative to it)."""
        self._check_usable()
        payload = data.encode() if isinstance(data, str) else bytes(data)
        async with self._lock:
            await self._node_call("upload", path, payload)

    async def download(self, path: str) -> bytes:
        """Read a file from the session's working directory on its node (`path` is relative to it)."""
        self._check_usable()
        async with self._lock:
            value: bytes = await self._node_call("download", path)
            return value

    async def _node_call(self, method: str, *args: Any) -> Any:
        from ray.exceptions import RayError

        if self._placement is None:
            await self._place()
        placement = self._placement
        assert placement is not None
        try:
            with anyio.fail_after(self.timeout + RUN_SLACK):
                answer = await getattr(placement.agent, method).remote(placement.session_id, *args)
        except (RayError, TimeoutError) as exc:
            await self._lose(placement, exc)
            answer = {"kind": "lost", "message": _describe(exc) if isinstance(exc, RayError) else "no answer"}
        if answer["kind"] == "lost":
            self._state_lost_pending = True
            if method == "reset":
                return None
            raise SandboxFileError(f"the cluster node holding the session was lost ({answer['message']}); "
                                   "the next run starts a fresh session on a live node")  # fmt: skip
        if answer["kind"] == "error":
            raise RAISABLE.get(answer["type"], WorkerStartError)(answer["message"])
        return answer["value"]


def _node_lost(detail: str) -> ExecutionResult:
    return ExecutionResult(state_lost=True, error=ExecutionError(
        type="WorkerCrashed", message=f"the cluster node running this session was lost during the run ({detail}); "
        "the next run starts a fresh session on a live node; variables from earlier runs are lost"))  # fmt: skip


def _describe(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__


def _remove_quietly(group: Any) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    if not ray.is_initialized():  # disconnected: the job's groups went with it (and a Ray call now would
        return  # start a new local cluster: Ray's auto-init)
    try:
        remove_placement_group(group)
    except Exception:  # already gone with its job or the cluster
        pass


async def _release(placement: Placement, timeout: float = KILL_TIMEOUT, keep: bool = True) -> None:
    """Close the session on its node (bounded); keep its reservation for a while if that went well, else
    give it back to the cluster at once."""
    closed = False
    try:
        with anyio.move_on_after(timeout):
            await placement.agent.close.remote(placement.session_id)
            closed = True
    except Exception:  # the node is gone: nothing left to close there
        pass
    if closed and keep:
        _keep_reservation(placement.reservation)
    else:
        _remove_quietly(placement.reservation.group)
