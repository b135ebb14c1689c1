"""The cluster side of the ray backend, shared by every session of a process: joining (or starting) the
cluster, its capacity, the per-node agents, and the reservations that hold a session's unit of capacity.

Why reservations are pooled per process: a unit a session gives up is seen free by Ray's scheduler only
at the node's next resource report, so a session waiting in Ray's queue takes a unit another session of
this process gives up directly, and a closed session's unit lingers `LINGER` seconds for the next one.
Measured on a local cluster: HumanEval at concurrency = capacity took 9.7 s instead of 3.8 s while
sessions waited for Ray to notice freed units.

Nothing here is imported unless the ray backend is used; ray itself is imported on first call.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import hashlib
import logging
import os
import pathlib
import signal
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from ...errors import BackendUnavailable, WorkerStartError
from ..resources import resources
from .node import NODE_CAPACITY_RESOURCE, NodeAgent

SANDBOX_RESOURCE = NODE_CAPACITY_RESOURCE
"""The custom resource by which a node declares how many sandbox sessions it takes."""
NAMESPACE = "kodeagent"
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

RESOURCES = resources("ray")
"""What the Ray backend keeps for the process: the ``init`` thread (ray.init starts the local
cluster's processes with "die with parent" tied to the *thread* that started them, so it must run on
a thread that lives as long as the process, not anyio's pool) and the lingering reservations."""
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
_waiters: list[tuple[str, str | None, concurrent.futures.Future[Reservation]]] = []
"""Sessions of this process waiting in Ray's queue for a unit (of a resource, on a node or any): a closing
session hands its unit to the first that it fits directly (Ray would see it free only at the node's next
resource report, seconds later)."""
_sweeper: threading.Thread | None = None


def ray_module() -> Any:
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


def _expected_warning(record: logging.LogRecord) -> bool:
    """False for Ray's warning that a connection made off the main thread sets no SIGTERM handler: we
    connect on our own thread on purpose (see `RESOURCES`), so it would only be noise."""
    return "SIGTERM handler is not set" not in str(record.msg)


def _connect(address: str | None, init_options: Mapping[str, Any], start_local: bool = True) -> None:
    """Join the cluster at `address`; with None join a running one or start a local one (blocking)."""
    ray = ray_module()
    if ray.is_initialized():
        return
    worker_log = logging.getLogger("ray._private.worker")
    if _expected_warning not in worker_log.filters:
        worker_log.addFilter(_expected_warning)
    options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False, **init_options}
    if address is None:
        try:
            ray.init(address="auto", **options)
            return
        except ConnectionError:
            if not start_local:
                raise BackendUnavailable(f"no Ray cluster is running here; {START_HINT}") from None
        cpus = os.cpu_count() or 1
        local = {
            "resources": {SANDBOX_RESOURCE: cpus},
            "include_dashboard": False,
            "object_store_memory": LOCAL_OBJECT_STORE_BYTES,
        }
        try:
            ray.init(**{**local, **options})
        except Exception as exc:
            raise BackendUnavailable(f"could not start a local Ray cluster ({exc}); {START_HINT}") from exc
        # Its own exit hook, not the backend's resources: it must run before Ray's own exit handler,
        # which ray.init just registered (hooks run last registered first).
        atexit.register(_stop_local_cluster, node_processes())
        return
    if not _reachable(address):
        raise BackendUnavailable(f"no Ray cluster answers at {address!r}: {START_HINT}")
    try:
        ray.init(address=address, **options)
    except Exception as exc:
        raise BackendUnavailable(
            f"could not join the Ray cluster at {address!r} ({exc}); {START_HINT}"
        ) from exc


def node_processes(nodes: Any = None) -> set[int]:
    """Process ids of Ray's own processes on `nodes` (`ray._private.node.Node` objects; default: the
    local node this process started), for `kill_leftovers`."""
    if nodes is None:
        import ray._private.worker as ray_worker

        nodes = [ray_worker._global_node] if getattr(ray_worker, "_global_node", None) is not None else []
    return {
        info.process.pid
        for node in nodes
        for infos in getattr(node, "all_processes", {}).values()
        for info in infos
        if getattr(info, "process", None) is not None
    }


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
        ray_module().shutdown()
    finally:
        kill_leftovers(leftover)


def connect(
    address: str | None = None, init_options: Mapping[str, Any] | None = None, start_local: bool = True
) -> None:
    """Connect this process to a Ray cluster once (blocking; see `RayExecutor` for `address`). With
    `start_local` False and no cluster running, raise `BackendUnavailable` instead of starting one."""
    future = RESOURCES.submit("init", _connect, address, dict(init_options or {}), start_local)
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
        totals = ray_module().cluster_resources()
        name = SANDBOX_RESOURCE if totals.get(SANDBOX_RESOURCE, 0) >= 1 else "CPU"
        if totals.get(name, 0) < 1:
            raise BackendUnavailable(f"the Ray cluster declares no capacity for sandboxes; {START_HINT}")
        _resource = name
    return _resource


def capacity(address: str | None = None, init_options: Mapping[str, Any] | None = None) -> int:
    """How many sandbox sessions the cluster takes at once (the sum over its live nodes)."""
    connect(address, init_options)
    return int(ray_module().cluster_resources().get(sandbox_resource(refresh=True), 0))


def describe(
    address: str | None = None, init_options: Mapping[str, Any] | None = None, start_local: bool = True
) -> dict[str, Any]:
    """The cluster as `kodeagent doctor` reports it: live nodes and the sandboxes each takes."""
    connect(address, init_options, start_local)
    ray = ray_module()
    resource = sandbox_resource(refresh=True)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {
        "address": ray.get_runtime_context().gcs_address,
        "resource": resource,
        "nodes": [
            {
                "node_id": n["NodeID"],
                "ip": n.get("NodeManagerAddress"),
                "sandboxes": int(n.get("Resources", {}).get(resource, 0)),
            }
            for n in nodes
        ],
        "capacity": int(sum(n.get("Resources", {}).get(resource, 0) for n in nodes)),
    }


def _code_version() -> str:
    """A hash of this `sandboxes` package's source, so a driver never talks to an agent of other code."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parents[2]
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"=" + path.read_bytes())
    return digest.hexdigest()[:12]


_VERSION = _code_version()


def agent(node_id: str) -> Any:
    """The handle of `node_id`'s agent, created there on first use (named, detached: later drivers reuse it)."""
    global _agent_class
    handle = _agents.get(node_id)
    if handle is None:
        ray = ray_module()
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


def check_job() -> None:
    """Forget the caches of an earlier connection (a new ray.init() after ray.shutdown())."""
    global _job, _resource
    job = ray_module().get_runtime_context().get_job_id()
    if job != _job:
        with _lock:
            _agents.clear()
            _idle.clear()
            _resource = None
            _job = job


def take_reservation(resource: str, node_id: str | None = None) -> Reservation | None:
    """An idle reservation of this process (on `node_id`, or on any node), most recent first."""
    with _lock:
        for index in range(len(_idle) - 1, -1, -1):
            held = _idle[index]
            if held.resource == resource and node_id in (None, held.node_id):
                return _idle.pop(index)
    return None


def keep_reservation(reservation: Reservation) -> None:
    """Hold a closed session's reservation for the next session of this process (see `LINGER`)."""
    global _sweeper
    with _lock:
        for entry in list(_waiters):
            resource, node_id, waiter = entry
            if resource != reservation.resource or node_id not in (None, reservation.node_id):
                continue  # waits for another resource, or a unit on another node (a fork)
            _waiters.remove(entry)
            if waiter.set_running_or_notify_cancel():
                waiter.set_result(reservation)
                return
    if LINGER <= 0:
        remove_group(reservation.group)
        return
    reservation.idle_since = time.monotonic()
    with _lock:
        _idle.append(reservation)
        if _sweeper is None:
            _sweeper = threading.Thread(target=_sweep_forever, name="kodeagent-ray-linger", daemon=True)
            _sweeper.start()


def drop_reservations(node_id: str) -> None:
    with _lock:
        dropped = [r for r in _idle if r.node_id == node_id]
        _idle[:] = [r for r in _idle if r.node_id != node_id]
    for reservation in dropped:
        remove_group(reservation.group)


@RESOURCES.on_close
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
            remove_group(reservation.group)


def remove_group(group: Any) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    if not ray.is_initialized():  # disconnected: the job's groups went with it (and a Ray call now would
        return  # start a new local cluster: Ray's auto-init)
    try:
        remove_placement_group(group)
    except Exception:  # already gone with its job or the cluster
        pass


async def reserve(resource: str, timeout: float, node_id: str | None = None) -> Reservation:
    """A new placement group of one unit; Ray's scheduler picks the node (`node_id`, when given: a
    fork's unit on its parent's node), or queues it while full. While queued, a unit another session
    of this process gives up (there) is taken instead."""
    from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group, placement_group_table

    if node_id is None:
        group = placement_group([{resource: 1}])
    else:  # every node carries its id as a label: the bundle fits that node alone
        group = placement_group([{resource: 1}], bundle_label_selector=[{NODE_ID_LABEL_KEY: node_id}])
    handoff: concurrent.futures.Future[Reservation] = concurrent.futures.Future()
    waiting = (resource, node_id, handoff)
    with _lock:
        _waiters.append(waiting)
    ready = asyncio.ensure_future(group.ready())
    handed = asyncio.wrap_future(handoff)
    finished = False
    try:
        with anyio.fail_after(timeout):
            await asyncio.wait({ready, handed}, return_when=asyncio.FIRST_COMPLETED)
        finished = True
    except TimeoutError:
        raise WorkerStartError(
            f"no sandbox capacity became free on the Ray cluster within {timeout:g} s: "
            "close idle sessions, add nodes, or raise placement_timeout"
        ) from None
    finally:
        with _lock:
            if waiting in _waiters:
                _waiters.remove(waiting)
            handed_over = not handoff.cancel()  # False once a closing session set it: the unit is ours
        ready.cancel()
        placed = ready.done() and not ready.cancelled() and ready.exception() is None
        if handed_over or not placed or not finished:
            remove_group(group)
        if handed_over and not finished:
            keep_reservation(handoff.result())  # cancelled or timed out: pass the unit on
    if handed_over:
        return handoff.result()
    ready.result()  # raises the placement's own failure, if it failed
    return Reservation(group, placement_group_table(group)["bundles_to_node_id"][0], resource)
