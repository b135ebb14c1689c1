"""How a sandbox container is made: the paths and commands inside it, and `ContainerSettings`, every
choice that decides how one is created (equal settings share a warm pool), with `ContainerOptions`,
the part of them a caller sets."""

from __future__ import annotations

from typing import Any, Final, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from ...images import (
    DEFAULT_IMAGE,
    LABEL_OWNER,
    LABEL_SANDBOX,
    owner_label,
)

WORKDIR = "/workspace"
FORKS_DIR = "/forks"
"""Where forked sessions' working directories live in the container (an anonymous volume of its own,
so the parent's /workspace never lists them and the files API reaches them)."""
RUNNER_COMMAND = ("python3", "-I", "/opt/kodeagent/runtime/runner.py")
HELPER_COMMAND = ("python3", "-I", "-S", "/opt/kodeagent/runtime/forkrelay.py")
SESSION_HOST_COMMAND = ("python3", "-I", "/opt/kodeagent/runtime/sessionhost.py")
SESSION_HOST_CAPABILITIES = ("SETUID", "SETGID", "SETPCAP", "KILL")
"""What the session host of a shared container needs: start sessions as other uids, empty their
bounding sets, kill them. Sessions themselves hold no capability at all."""
SESSIONS_DIR = "/sessions"
"""The working directories of a shared container's sessions (mode 1733 in the image: anyone may
make an entry, nobody may list them)."""
CHANNELS_DIR = "/run/kodeagent/channels"
"""Where a shared container sees its sessions' channel sockets (`docker.channel`; read-only)."""
MEMORY_HEADROOM_MB = 128
"""A shared container's memory above `memory_mb`: the session host's, and room for a session's
``MemoryError`` (its address-space rlimit) to come before the container's OOM killer."""
SANDBOX_UID = "1000:1000"


class ContainerSettings(BaseModel):
    """Everything that decides how a sandbox container is created; equal settings share a warm pool."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(DEFAULT_IMAGE, description="The sandbox image (`python -m sandboxes.images build`).")
    memory_mb: int = Field(
        2048, ge=16, description="Memory limit (`Limits.memory_mb`); swap limited to the same."
    )
    cpus: float = Field(1.0, gt=0, description="CPU quota in cores.")
    pids_limit: int = Field(
        128,
        ge=2,
        description="Processes and threads in the container (at most `max_processes` + 1 for its init).",
    )
    network: bool = Field(
        False,
        description="Network on (`Policy.network`): still no network of Docker's (``none``); the egress "
        "gateway's listener is put into the container's namespace, its only way out.",
    )
    read_only: bool = Field(
        True,
        description="Mount the root filesystem read-only (the working directory and /tmp stay writable).",
    )
    tmp_mb: int = Field(64, ge=1, description="Size of the tmpfs at /tmp.")
    user: str = Field(
        SANDBOX_UID,
        description="uid:gid the runner runs as. The image's /workspace must belong to it (the standard "
        "images: 1000:1000); never root unless you mean it. Not for shared containers (a uid per session).",
    )
    drop_capabilities: bool = Field(True, description="Drop every Linux capability.")
    no_new_privileges: bool = Field(True, description="Forbid gaining privileges (setuid binaries).")
    open_files: int = Field(1024, ge=16, description="RLIMIT_NOFILE of the container.")
    file_size_mb: int = Field(1024, ge=1, description="RLIMIT_FSIZE of the container: the largest file.")
    host_workdir: str | None = Field(
        None, description="A host directory bind-mounted as the working directory."
    )
    sessions_per_container: int = Field(
        1,
        ge=1,
        description="Sessions one container hosts, one after another. 1 gives every session a container "
        "of its own, removed at its close: the kernel boundary between any two sessions. Above 1 the "
        "container runs the session host (`docker.shared`): each session a fresh runner as a uid of its "
        "own, everything of it killed, removed and checked at its close, so a fresh session costs "
        "milliseconds instead of a container's life.",
    )

    preload: tuple[tuple[str, str], ...] = Field(
        (), description="Trusted modules (name, source) a shared container's host imports before any session."
    )

    @property
    def shared(self) -> bool:
        """Whether these containers host successive sessions (`docker.shared`)."""
        return self.sessions_per_container > 1

    def create_arguments(self, api: Any, channels: tuple[str, str] | None = None) -> dict[str, Any]:
        """Keyword arguments of the low-level `create_container` call; `channels` (a shared
        container's channels directory on this machine and its token, `docker.channel`) is
        bind-mounted read-only at ``/run/kodeagent/channels``."""
        from docker.types import Mount, Ulimit

        if self.host_workdir is not None:
            workspace = Mount(WORKDIR, self.host_workdir, type="bind")
        else:  # anonymous volume: gets /workspace's owner from the image, removed with the container
            workspace = Mount(WORKDIR, None, type="volume")
        mounts = [workspace, Mount(FORKS_DIR, None, type="volume")]
        memory_mb, command, user = self.memory_mb, list(RUNNER_COMMAND), self.user
        cap_add = None
        if self.shared:  # the session host: root with the four capabilities it needs (docker.shared)
            mounts.append(Mount(SESSIONS_DIR, None, type="volume"))
            memory_mb += MEMORY_HEADROOM_MB
            command, user, cap_add = list(SESSION_HOST_COMMAND), "0:0", list(SESSION_HOST_CAPABILITIES)
        environment = {"HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        if channels is not None:
            mounts.append(Mount(CHANNELS_DIR, channels[0], type="bind", read_only=True))
            environment["KODEAGENT_CHANNELS"] = channels[1]
        file_size = self.file_size_mb * 1024 * 1024
        host_config = api.create_host_config(
            network_mode="none",  # with network on too: the egress gateway is the way out
            read_only=self.read_only,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={self.tmp_mb}m,mode=1777"},
            mounts=mounts,
            cap_drop=["ALL"] if self.drop_capabilities or self.shared else None,
            cap_add=cap_add,
            security_opt=["no-new-privileges"] if self.no_new_privileges else None,
            pids_limit=self.pids_limit,
            mem_limit=f"{memory_mb}m",
            memswap_limit=f"{memory_mb}m",
            nano_cpus=int(self.cpus * 1e9),
            ulimits=[
                Ulimit(name="nofile", soft=self.open_files, hard=self.open_files),
                Ulimit(name="fsize", soft=file_size, hard=file_size),
                Ulimit(name="core", soft=0, hard=0),
            ],
            oom_score_adj=1000,  # under host memory pressure, sandboxes die first
            init=True,
            ipc_mode="private",
        )
        return {
            "image": self.image,
            "command": command,
            "stdin_open": True,
            "detach": False,  # with stdin_open: StdinOnce, so a vanished parent closes the stdin
            "tty": False,
            "user": user,
            "working_dir": WORKDIR,
            "hostname": "sandbox",
            "environment": environment,
            "labels": {LABEL_SANDBOX: "1", LABEL_OWNER: owner_label()},
            "host_config": host_config,
        }


class ContainerOptions(TypedDict, total=False):
    """The container options a caller sets (`DockerExecutor(**options)`, ``open_executor("docker",
    ...)``), typed for the type checker and an editor: their meanings, defaults and bounds are the
    `ContainerSettings` fields of the same names and types, declared there once (a unit test keeps
    the two equal). The other fields come from the executor's common options: `memory_mb` and
    `network` from the policy, `host_workdir` from `workdir`, `preload` from the executor's own."""

    image: str
    cpus: float
    pids_limit: int
    read_only: bool
    tmp_mb: int
    user: str
    drop_capabilities: bool
    no_new_privileges: bool
    open_files: int
    file_size_mb: int
    sessions_per_container: int


CONTAINER_OPTIONS: Final = frozenset(ContainerOptions.__annotations__)
"""The names of `ContainerOptions`, at run time."""
