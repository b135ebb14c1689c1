"""The Ray backend: sessions placed on the nodes of a Ray cluster, each run there by the node's host or
Docker backend, whose isolation it keeps; tools still run in the caller's process.

Modules: `executor` (`RayExecutor` and its session), `cluster` (connecting, placement, capacity, the
node agents' handles), `node` (the agent actor on each node).
"""

from .executor import (
    SANDBOX_RESOURCE,
    Placement,
    RayExecutor,
    RayOptions,
    RaySession,
    capacity,
    connect,
    describe,
)

__all__ = [
    "SANDBOX_RESOURCE",
    "Placement",
    "RayExecutor",
    "RayOptions",
    "RaySession",
    "capacity",
    "connect",
    "describe",
]
