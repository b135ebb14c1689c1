"""The docker backend for the conformance suite: a real daemon and the sandbox image built from this checkout.

When the daemon is up but the image is missing or holds an older runner than this checkout (the
runner changes often during development), the image is (re)built here, once per test process, so
the Docker tests never skip silently or test stale code. Set KODEAGENT_TEST_BUILD=0 to only check.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from sandboxes.errors import BackendUnavailable, SandboxError

IMAGE = "kodeagent-sandbox:py"
ENABLE = "run `bash .ci/docker.sh` as root (installs and starts Docker, builds the images)"


@functools.cache
def image_unavailable(image: str, variant: str) -> str | None:
    """None when `image` is on the daemon with this checkout's runner (building it if allowed)."""
    try:
        from sandboxes.images import build_image, image_problem

        problem = image_problem(image)
        if problem and os.environ.get("KODEAGENT_TEST_BUILD", "1") != "0":
            try:
                build_image(variant, progress=lambda _message: None)
            except SandboxError as exc:
                return f"{problem}; building it here failed: {exc}"
            problem = image_problem(image)
    except BackendUnavailable as exc:
        return f"{exc}; to enable the Docker tests, {ENABLE}"
    return f"{problem}; or {ENABLE}" if problem else None


def unavailable() -> str | None:
    return image_unavailable(IMAGE, "py")


def make_executor(**options: Any) -> Any:
    from sandboxes.backends.docker import DockerExecutor

    options.setdefault("image", IMAGE)
    return DockerExecutor(**options)


def require(image: str = IMAGE, variant: str = "py") -> None:
    """For docker-only tests: skip with the reason here, fail under CI (where Docker must work)."""

    from support.needs import require as need

    need(image_unavailable(image, variant), "the docker backend")


def children(pid: int) -> list[int]:
    """The pids (this machine's) whose parent is `pid`: a container's processes seen from outside it
    (its init's pid from ``inspect_container``)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    fields = stat.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(name))
    return found
