"""The docker backend for the conformance suite: a real daemon and the sandbox image built from this checkout."""

from __future__ import annotations

import functools
from typing import Any

from sandboxes.errors import BackendUnavailable

IMAGE = "kodeagent-sandbox:py"
ENABLE = "run `bash .ci/docker.sh` as root (installs and starts Docker, builds the images)"


@functools.cache
def unavailable() -> str | None:
    try:
        from sandboxes.images import image_problem

        problem = image_problem(IMAGE)
    except BackendUnavailable as exc:
        return f"{exc}; to enable the Docker tests, {ENABLE}"
    return f"{problem}; or {ENABLE}" if problem else None


def make_executor(**options: Any) -> Any:
    from sandboxes.backends.docker import DockerExecutor

    options.setdefault("image", IMAGE)
    return DockerExecutor(**options)


def require() -> None:
    """For docker-only tests: skip with the reason here, fail under CI (where Docker must work)."""
    import os

    import pytest

    reason = unavailable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the docker backend must run in CI but is unavailable: {reason}")
        pytest.skip(reason)
