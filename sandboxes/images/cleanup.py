"""Cleaning up after sessions: containers whose owner process is gone, and superseded image builds."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from .common import (
    LABEL_IMAGE,
    LABEL_OWNER,
    LABEL_SANDBOX,
    LABEL_VARIANT,
    REPOSITORY,
    Progress,
    docker_client,
)


def owner_label() -> str:
    """This process as a container owner: host, pid, and the pid's start time (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[19]


def owner_alive(owner: str) -> bool:
    """Whether the process named by an owner label still runs (other hosts' owners count as alive)."""
    host, _, rest = owner.partition(":")
    pid, _, ticks = rest.partition(":")
    if host != socket.gethostname():
        return True
    if not pid.isdigit():
        return False
    return _start_ticks(int(pid)) == ticks != "?"


def cleanup(*, everything: bool = False, progress: Progress = print) -> list[str]:
    """Remove sandbox containers whose owner process is gone (or all of them); return their ids.

    Containers normally disappear with their session; this catches those of a parent that was
    killed with SIGKILL or lost power. `everything=True` also removes live sessions' containers.
    """
    client = docker_client()
    import docker.errors

    removed: list[str] = []
    # sparse: no per-container inspect, which raises NotFound for one that goes away meanwhile
    found = client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_SANDBOX}=1"})
    for container in found:
        owner = (container.attrs.get("Labels") or {}).get(LABEL_OWNER, "")
        if everything or not owner_alive(owner):
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as exc:
                progress(f"could not remove {container.short_id}: {exc}")
                continue
            removed.append(container.id)
            progress(
                f"removed {container.short_id} ({container.attrs.get('State', '?')}, owner {owner or 'unknown'})"
            )
    return removed


def remove_old_images(progress: Progress = print) -> list[str]:
    """Remove sandbox images that no alias points to any more (older builds); return their tags.

    Every change of the runner or the requirements makes a new content-addressed image; without
    this they pile up. Images still used by a container are kept.
    """
    client = docker_client()
    import docker.errors

    removed: list[str] = []
    for image in client.images.list(filters={"label": f"{LABEL_IMAGE}=sandbox"}):
        variant = (image.labels or {}).get(LABEL_VARIANT, "")
        if f"{REPOSITORY}:{variant}" in image.tags:
            continue
        for tag in image.tags:
            try:
                client.images.remove(tag)
            except docker.errors.APIError as exc:  # in use by a container, or a child image's parent
                progress(f"kept {tag}: {exc.explanation or exc}")
                continue
            removed.append(tag)
            progress(f"removed image {tag}")
    return removed
