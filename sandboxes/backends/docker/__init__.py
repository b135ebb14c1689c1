"""The Docker backend: the runner as the main process of a hardened container.

Isolation comes from the container: no network, a read-only root, every capability dropped,
``no-new-privileges``, a non-root user, memory/CPU/PID limits, on top of the Python-level guards.

Modules: `executor` (`DockerExecutor`), `container` (one container per session, its stream, settings,
pool and usage probe), `shared` (several sessions in one container, behind its session host).
"""

from .executor import (
    ContainerOptions,
    ContainerSettings,
    DockerExecutor,
    DockerOptions,
    DockerWorker,
    client,
    drain_pools,
    pooled_count,
)

__all__ = [
    "ContainerOptions",
    "ContainerSettings",
    "DockerExecutor",
    "DockerOptions",
    "DockerWorker",
    "client",
    "drain_pools",
    "pooled_count",
]
