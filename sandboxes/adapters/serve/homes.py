"""Durable homes: each sandbox's `/home/user` as a directory of the server's, which outlives a
replaced session (a run lost to a timeout, a dropped client, a killed container) as the disk of an
E2B sandbox outlives its processes, and goes with the sandbox.

On the host the executor's worker takes the directory over (a private uid of its own when the server
is root). On Docker the directory is bind-mounted as the container's working directory, where the
runner works as the container's uid (1000 in the standard images): the directory must belong to that
uid, or the runner cannot write in its own home. `check` finds out at start whether that can be
arranged on this machine, so a server that cannot is refused with what to do instead of failing at
every create.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from .config import ServeConfig, ServeConfigError

DEFAULT_CONTAINER_USER = "1000:1000"
"""The Docker backend's default `user` (the standard images' sandbox user)."""


def container_ids(options: Mapping[str, Any]) -> tuple[int, int]:
    """The uid and gid the Docker backend's runner runs as, from its `user` option ("uid:gid"; a
    name is the image's sandbox user, 1000, as the backend's own file writes take it)."""
    user = str(options.get("user") or DEFAULT_CONTAINER_USER)
    uid_text, _, gid_text = user.partition(":")
    uid = int(uid_text) if uid_text.isdigit() else 1000
    gid = int(gid_text) if gid_text.isdigit() else uid
    return uid, gid


class Homes:
    """The directory holding every sandbox's home (under TMPDIR: the watchdog's scratch directory
    when there is one, so a killed server's homes go with it), traversable but not listable."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.owner = container_ids(config.backend_options) if config.backend == "docker" else None
        self.root = tempfile.mkdtemp(prefix="kodeagent-serve-homes-")
        os.chmod(self.root, 0o711)

    def make(self, sandbox_id: str) -> str:
        """A new, empty home for `sandbox_id`: 0700, and the container's uid's on Docker."""
        home = os.path.join(self.root, sandbox_id)
        os.mkdir(home, 0o700)
        if self.owner is not None:
            try:
                os.chown(home, *self.owner)
            except OSError:
                os.rmdir(home)
                raise
        return home

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def check(config: ServeConfig, euid: int | None = None) -> None:
    """Refuse (`ServeConfigError`) a `durable_home` this machine cannot give, naming what to do:
    on Docker, a home the server cannot hand to the container's uid, a daemon that sees another
    file system than this process (remote), or one that maps uids (rootless, userns-remap), and
    shared containers, which cannot bind a home per session. `euid` is the user the server runs
    as (this process's by default)."""
    if not config.durable_home or config.backend != "docker":
        return
    options = config.backend_options
    instead = "set durable_home = false (files then go with a lost session)"
    if int(options.get("sessions_per_container", 1) or 1) > 1:
        raise ServeConfigError(
            "durable_home on Docker bind-mounts each sandbox's home into its own container, which a shared "
            f"container (sessions_per_container > 1) cannot have: set sessions_per_container = 1, or {instead}"
        )
    uid, gid = container_ids(options)
    euid = os.geteuid() if euid is None else euid
    if euid not in (0, uid):
        raise ServeConfigError(
            f"durable_home on Docker needs each sandbox's home owned by the container's uid {uid}, and only "
            f"root can give a directory away (this server runs as uid {euid}): run the server as root, "
            f'set backend_options.user = "{euid}:{euid}" (your own uid, if the image lets it write its '
            f"working directory), or {instead}"
        )
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        raise ServeConfigError(
            f"durable_home on Docker bind-mounts a directory of this machine, and the daemon at DOCKER_HOST={host} "
            f"may be on another one: use a local daemon (unix socket), or {instead}"
        )
    mapped = _daemon_maps_uids()
    if mapped:
        raise ServeConfigError(
            f"durable_home on Docker needs the container's uid {uid} to be uid {uid} on this machine, and the "
            f"daemon runs {mapped}, which maps uids: run a rootful daemon without userns-remap, or {instead}"
        )
    probe = tempfile.mkdtemp(prefix="kodeagent-serve-home-check-")
    try:
        os.chown(probe, uid, gid)
    except OSError as exc:
        raise ServeConfigError(
            f"durable_home on Docker needs each sandbox's home owned by the container's uid {uid}, and this "
            f"machine refused ({exc}): run the server as root, or {instead}"
        ) from None
    finally:
        os.rmdir(probe)


def _daemon_maps_uids() -> str | None:
    """ "rootless" or "with userns-remap" when the daemon says so (its security options), else None
    (also when it cannot be asked now: the first create then says why)."""
    try:
        from ...images import docker_client

        # A client of its own, closed here: this runs before the watchdog forks.
        daemon = docker_client()
        try:
            options = daemon.info().get("SecurityOptions") or []
        finally:
            daemon.close()
    except Exception:
        return None
    names = " ".join(str(o) for o in options)
    if "name=rootless" in names:
        return "rootless"
    if "name=userns" in names:
        return "with userns-remap"
    return None


__all__ = ["Homes", "check", "container_ids"]
