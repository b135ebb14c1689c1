"""The docker backend in its shared mode for the conformance suite: warm containers that host
successive sessions (`DockerExecutor(sessions_per_container=N)`), each session a fresh runner under a
uid of its own, so that every test parametrised over backends (the conformance and attack suites)
also runs against sessions that share a container with the ones before and after them.

Same daemon, same image (built here if missing or stale) as `backend_docker`.
"""

from __future__ import annotations

from typing import Any

from support import backend_docker

IMAGE = backend_docker.IMAGE
SESSIONS_PER_CONTAINER = 4
"""Sessions a pooled container hosts, one after the other, before it is replaced."""


def unavailable() -> str | None:
    return backend_docker.unavailable()


def make_executor(**options: Any) -> Any:
    options.setdefault("sessions_per_container", SESSIONS_PER_CONTAINER)
    return backend_docker.make_executor(**options)


def require() -> None:
    """For docker-only tests: skip with the reason here, fail under CI (where Docker must work)."""
    backend_docker.require()
