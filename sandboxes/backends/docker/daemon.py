"""The Docker daemon as this process reaches it: one client, the backend's process-wide resources
(threads and exit clean-ups), and removing a container."""

from __future__ import annotations

import socket
import threading
from typing import Any

from ...images import (
    docker_client,
)
from ..resources import resources

_client_lock = threading.Lock()
_client: Any = None
RESOURCES = resources("docker")
"""What the Docker backend keeps for the process: its threads (``background``: pool refills, relays
and removals of collected workers; ``remove``: removals of closed sessions' containers, apart from
refills so they never delay them; the shared containers' ``shared`` and ``clean``), the warm pools
(`CONTAINERS`, `docker.shared`'s `SHARED`) and, at `close()`, the removal of every container left.
Queued work still runs at interpreter exit (the thread pools drain their queues before they end)."""
RESOURCES.declare("background", 2)


def client() -> Any:
    """The process-wide Docker client (connects and pings once), or `BackendUnavailable`."""
    global _client
    with _client_lock:
        if _client is None:
            _client = docker_client()
        return _client


def connected() -> bool:
    """Whether this process has connected to the daemon (there is nothing to clean up otherwise)."""
    return _client is not None


def remove_container(container_id: str, sock: socket.socket | None) -> None:
    """Close `sock` and remove the container and its volumes (blocking; never raises)."""
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass
    try:
        client().api.remove_container(container_id, force=True, v=True)
    except Exception:  # already gone, or the daemon is down (then stdin_once stops it anyway)
        pass
