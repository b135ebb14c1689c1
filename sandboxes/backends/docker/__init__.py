"""The Docker backend: the runner as the main process of a hardened container.

Isolation comes from the container: no network, a read-only root, every capability dropped,
``no-new-privileges``, a non-root user, memory/CPU/PID limits, on top of the Python-level guards.

Modules: `executor` (`DockerExecutor`, `DockerOptions`), `settings` (`ContainerSettings`: how a
container is made, and `ContainerOptions`, the part a caller sets), `daemon` (the client, the
backend's process-wide ``resources("docker")``, removing a container), `stream` (the attach stream,
demultiplexed), `container` (the worker: one container per session, and a fork inside it), `family`
(the sessions sharing a container, and their ``docker exec`` relays), `pool` (the warm containers),
`probe` (the usage probe: cgroup v1 or the daemon's stats), `shared` (several sessions in one
container, behind its session host), `channel` (their sessions' own unix sockets, bypassing the daemon).
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
