"""The warm pool of started containers (one session each), per settings: taken at open, topped up in
the background after, drained at exit."""

from __future__ import annotations

import functools

from ..resources import WarmPool, fill
from .container import DockerWorker, start_container
from .daemon import RESOURCES
from .settings import ContainerSettings

POOL_SIZE = 2


def _remove_off_path(worker: DockerWorker) -> None:
    RESOURCES.submit("background", worker.remove_now)


CONTAINERS: WarmPool[ContainerSettings, DockerWorker] = WarmPool(
    DockerWorker.socket_open, _remove_off_path, oldest_first=True
)
"""Started containers (one session each) waiting for sessions, per settings."""


def take_pooled(settings: ContainerSettings) -> DockerWorker | None:
    """A warm container for `settings`, if the pool has a live one (dead ones are removed)."""
    return CONTAINERS.take(settings)


def _started(settings: ContainerSettings) -> DockerWorker | None:
    try:
        return start_container(settings)
    except Exception:  # the next session's cold start reports the problem properly
        return None


def refill(settings: ContainerSettings, size: int) -> None:
    """Top up the pool of `settings` to `size` in a background thread; nobody waits for it."""
    RESOURCES.submit("background", fill, CONTAINERS, settings, size, functools.partial(_started, settings))


def pooled_count(settings: ContainerSettings) -> int:
    """How many warm containers wait for `settings` (benchmarks wait for a full pool with it)."""
    return CONTAINERS.count(settings)


@RESOURCES.on_close
def drain_pools() -> None:
    """Remove every pooled container of this process (blocking)."""
    for worker in CONTAINERS.drain():
        worker.remove_now()
