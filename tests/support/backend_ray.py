"""The ray backend for the conformance suite: a real local Ray cluster of three nodes, sessions on the host backend.

One cluster serves the whole test process: started on first use, shut down at interpreter exit. The
head node takes no sandboxes (as on a real cluster, where the head is busy scheduling); two worker
nodes take `PER_NODE` each, so every test's sessions really cross node boundaries. Each node gets a
small object store (sessions pass small messages) and one CPU: about 1.2 GB and 6-10 s to start here.
"""

from __future__ import annotations

import atexit
import importlib.util
import threading
from typing import Any

PER_NODE = 3
"""Sandbox units a worker node declares: a fork lives on its parent's node, so a node takes a family of
three (a parent, its snapshot and a session opened from it), as the fork contract needs."""
OBJECT_STORE_BYTES = 80 * 1024 * 1024
# Fast node-failure detection, so the node-kill test sees the death in about a second, not fifteen.
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_failure_threshold": 3,
}

_lock = threading.Lock()
_cluster: Any = None
_problem: str | None = None


def node_arguments() -> dict[str, Any]:
    """What a sandbox node of the test cluster declares."""
    return {
        "num_cpus": 1,
        "resources": {"kodeagent_sandbox": PER_NODE},
        "object_store_memory": OBJECT_STORE_BYTES,
    }


def cluster() -> Any:
    """The test process's cluster (`ray.cluster_utils.Cluster`), started and connected on first use."""
    global _cluster
    with _lock:
        if _cluster is None:
            import ray
            from ray.cluster_utils import Cluster

            head = {
                "num_cpus": 1,
                "resources": {"kodeagent_sandbox": 0},
                "object_store_memory": OBJECT_STORE_BYTES,
                "include_dashboard": False,
                "_system_config": SYSTEM_CONFIG,
            }
            started = Cluster(initialize_head=True, head_node_args=head, shutdown_at_exit=False)
            atexit.register(_shutdown, started)
            for _ in range(2):
                started.add_node(**node_arguments())
            ray.init(address=started.address, logging_level="WARNING", log_to_driver=False)
            started.wait_for_nodes()
            _cluster = started
        return _cluster


def _shutdown(started: Any) -> None:
    """Disconnect and stop every node; then kill what Ray's own shutdown left behind (its per-node agents
    can outlive their raylet), so the test process leaves no processes running."""
    import ray

    from sandboxes.backends.ray.cluster import descendants, kill_leftovers, node_processes

    leftover = descendants(node_processes([started.head_node, *started.worker_nodes]))
    ray.shutdown()
    started.shutdown()
    kill_leftovers(leftover)


def kill_node(started: Any, node: Any) -> None:
    """Kill a worker node as a crash would (SIGKILL, no graceful shutdown), with all its processes."""
    from sandboxes.backends.ray.cluster import descendants, kill_leftovers, node_processes

    leftover = descendants(node_processes([node]))
    started.remove_node(node, allow_graceful=False)
    kill_leftovers(leftover)


def replace_node(started: Any) -> None:
    """Add a fresh sandbox node (after `kill_node`), so later tests find the cluster at full capacity."""
    started.add_node(**node_arguments())
    started.wait_for_nodes()


def unavailable() -> str | None:
    global _problem
    if importlib.util.find_spec("ray") is None:
        return "the ray backend tests need ray: pip install 'kodeagent[ray]'"
    if _problem is None and _cluster is None:
        try:
            cluster()
        except Exception as exc:  # noqa: BLE001 - reported as the reason (and fails under CI)
            _problem = f"could not start a local Ray cluster: {type(exc).__name__}: {exc}"
    return _problem


def make_executor(**options: Any) -> Any:
    from sandboxes.backends.ray import RayExecutor

    cluster()
    return RayExecutor(node_backend="host", **options)
