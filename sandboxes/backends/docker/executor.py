"""The Docker backend: the runner as a long-lived process inside a hardened container.

How it talks: the container's main process *is* the runner (``python3 -I runner.py`` under Docker's
init), and the parent talks to it over the container's attached stdin/stdout: one HTTP-upgraded
socket to the daemon, opened before the container starts so no byte is missed. With ``tty`` off the
daemon multiplexes stdout and stderr on that socket in frames with an 8-byte header; `Demultiplexer`
takes them apart. A run costs one round trip on that socket (well under a millisecond), not a
``docker exec`` (tens of milliseconds).

Why it is safe by default (each can be loosened by a plainly named option; the network and memory by
the policy, as on every backend):
no network (``network_mode=none``), read-only root filesystem, a tmpfs ``/tmp``, a writable working
directory on an anonymous volume (the only writable place besides /tmp), every capability dropped,
``no-new-privileges``, a non-root user, PID / memory (swap = memory) / CPU limits, ulimits, and an
init as PID 1 so that a kill is immediate.

Why nothing leaks: every container carries the labels ``org.kodeagent.sandbox=1`` and
``org.kodeagent.owner=<host>:<pid>:<start time>``. A timeout or crash removes the container before
the next run; `close()` closes its stream (the idle runner exits, the container stops at once) and
queues the removal in a background thread, so that closing costs the caller nothing; garbage
collection does the same, and interpreter exit removes whatever is left; if the parent dies without running any of that (SIGKILL), the
attach socket closes, the daemon closes the container's stdin (``stdin_once``), the runner reads
end-of-file and exits, so nothing keeps *running*; the stopped container is removed by the next
process that uses this backend, or by ``python -m sandboxes.images cleanup``.

Fork (`fork()`, snapshots): the new session lives in the parent's container (the runner forks
itself; a ``docker exec`` relay carries its channel), and the container is removed when the last
session of that family closes (`docker.family.Family`, docs/fork.md).

Why opening a session is cheap: a small warm pool of started containers per configuration. By
default a container serves exactly one session and is destroyed at its close; it is never handed
on. With ``sessions_per_container > 1`` a warm container hosts session after session instead, each
a fresh runner as a uid of its own, everything of it killed, removed and checked between them
(`docker/shared.py`; docs/security.md says what separates two such sessions).

The containers themselves live in the package's other modules (`settings`, `container`, `stream`,
`family`, `pool`, `probe`, `shared`); this module is the executor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Final, Unpack, cast

import anyio
from pydantic import ValidationError

from ...egress.policy import NetworkPolicy
from ...egress.service import (
    EgressLink,
    EgressUnavailable,
    attach_process_blocking,
    ca_bundle_path,
    with_proxy_environment,
)
from ...errors import BackendUnavailable
from ...executor import COMMON_OPTIONS, Executor, ExecutorOptions
from ...images import image_missing_message, stale_runner
from ...preload import read_preload
from ...runtime.protocol import InitRequest, LimitsConfig
from ...session import RunnerSession, Session
from ...worker import Worker
from .container import DockerWorker, start_container, sweep_orphans_soon
from .daemon import client
from .pool import POOL_SIZE, drain_pools, pooled_count, refill, take_pooled
from .settings import CONTAINER_OPTIONS, ContainerOptions, ContainerSettings
from .shared import SharedSessionWorker, idle_count, refill_shared, start_shared, take_shared

_checked_images: set[str] = set()


def _preload_sources(paths: Sequence[str | os.PathLike[str]]) -> tuple[tuple[str, str], ...]:
    """(module name, source text) of each preload file (`read_preload`), for the session host."""
    sources = []
    for (name, data), path in zip(read_preload(paths), paths, strict=True):
        try:
            sources.append((name, data.decode("utf-8")))
        except UnicodeDecodeError as exc:
            raise ValueError(f"cannot read the preload file {str(path)!r}: {exc}") from exc
    return tuple(sources)


class DockerOptions(ExecutorOptions, ContainerOptions, total=False):
    """Every option `DockerExecutor` takes (all by keyword): the common ones, the container's, and
    the executor's own (below; the docstring of `DockerExecutor` says what each does)."""

    pool: bool
    pool_size: int
    preload: Sequence[str | os.PathLike[str]]


OWN_OPTIONS: Final = frozenset({"pool", "pool_size", "preload"})
"""The executor's own options, beside the common and the container's."""


SHARED_WAIT = 2.0
"""Seconds a shared-mode session waits for a container being cleaned before it starts a new one."""

__all__ = [
    "ContainerSettings",
    "DockerExecutor",
    "ContainerOptions",
    "DockerOptions",
    "DockerWorker",
    "client",
    "drain_pools",
    "pooled_count",
]


# ---------------------------------------------------------------------- the executor


class DockerExecutor(Executor):
    """Runs code in a hardened Docker container. See the module docs for what is hardened and why.

    The policy decides what the container may do, as on every backend: with `policy.network` the
    container still has no Docker network (``none``), and its one way out is the egress gateway's
    listener put into its namespace (the public internet only, or the `NetworkPolicy`'s rules;
    one session per container then), `policy.limits.memory_mb` is its memory limit (a cgroup
    limit here, swap limited to the same; exceeding it kills the runner and the result says ``oom``
    and ``state_lost``), `policy.limits.max_processes` caps its PIDs.

    Args (besides the common `ExecutorOptions`; `workdir` is a host directory mounted at /workspace):
        pool: take a started container from the warm pool (not with `workdir`, a bind-mounted host
            dir). Default True.
        pool_size: how many warm containers to keep for this configuration (default `POOL_SIZE`, 2). With shared containers
            a container whose clean-up came back clean is reused even at 0 (then none is started
            ahead, and sequential sessions take turns in one container).
        preload: trusted Python files (``name.py``) compiled and imported once by a shared container's
            session host, before any session: every session finds them in ``sys.modules`` (subject to
            the import allowlist), as `HostExecutor(preload=...)` does. Needs
            ``sessions_per_container > 1``; the files' code runs as the host (root in the container,
            before any session): only ever your own code.
        **the container's options** (`ContainerOptions`; each one's meaning, default and bounds are the
        `ContainerSettings` field of its name): ``image``, ``cpus``, ``pids_limit``, ``read_only``,
        ``tmp_mb``, ``user``, ``drop_capabilities``, ``no_new_privileges``, ``open_files``,
        ``file_size_mb`` and ``sessions_per_container`` (not with `workdir`; `user` does not apply
        to shared containers, where every session has its own uid; a fork shares its parent's
        container and uid, and the container is cleaned once the last of the family has closed).
    """

    backend = "docker"

    def __init__(self, **options: Unpack[DockerOptions]) -> None:
        unknown = set(options) - COMMON_OPTIONS - CONTAINER_OPTIONS - OWN_OPTIONS
        if unknown:
            raise TypeError(
                f"DockerExecutor got unknown options: {', '.join(sorted(unknown))}. It takes the common "
                f"options ({', '.join(sorted(COMMON_OPTIONS))}), pool, pool_size, preload and the "
                f"container's ({', '.join(sorted(CONTAINER_OPTIONS))}); the memory limit and the network "
                "are the policy's (Policy(limits=Limits(memory_mb=...)), Policy(network=True))"
            )
        pool = options.pop("pool", True)
        pool_size = options.pop("pool_size", POOL_SIZE)
        preload = options.pop("preload", ())
        given = cast(dict[str, Any], options)
        container = {name: given.pop(name) for name in CONTAINER_OPTIONS if name in given}
        super().__init__(**cast(ExecutorOptions, given))
        chosen = _checked_settings(container)
        if preload and not chosen.shared:
            raise ValueError(
                "preload needs sessions_per_container > 1: the modules are loaded once by a shared "
                "container's session host (a container per session has none)"
            )
        if chosen.shared and self.workdir is not None:
            raise ValueError(
                "sessions_per_container > 1 shares a container between sessions, and a bind-mounted "
                "workdir would be shared with it: use one or the other"
            )
        # The policy's process limit becomes the container's PID limit (+1 for the init). The runner's
        # RLIMIT_NPROC is not used here: it counts every process of the uid on the whole host, and all
        # sandbox containers share uid 1000, so sessions would starve each other of threads.
        limits = self.policy.limits
        # +1 for the init; a shared container also holds its session host, its zygote, a clean-up
        # or file helper and the next session's runner started while the last one is cleaned up.
        pids_limit = min(chosen.pids_limit, limits.max_processes + (5 if chosen.shared else 1))
        self.settings = ContainerSettings(
            **{**container, "pids_limit": pids_limit},
            memory_mb=limits.memory_mb,
            network=self.policy.network_policy is not None,
            host_workdir=self.workdir,
            preload=_preload_sources(preload),
        )
        self.pool_size = max(0, pool_size) if pool and self.workdir is None else 0

    @property
    def container_id(self) -> str | None:
        """The id of the session's current container (None before open and after close)."""
        session = self.session
        worker = session.worker if isinstance(session, RunnerSession) else None
        return worker.container_id if isinstance(worker, (DockerWorker, SharedSessionWorker)) else None

    def warm_containers(self) -> int:
        """How many warm containers wait for sessions of this executor's settings now (the pool is
        full at `pool_size`); benchmarks wait for a full pool before they time anything."""
        return idle_count(self.settings) if self.settings.shared else pooled_count(self.settings)

    async def _new_session(self) -> Session:
        rules = self.policy.network_policy
        if rules is not None and self.settings.shared:
            raise EgressUnavailable(
                "network=True gives each session its own container network behind the egress gateway; "
                "sessions_per_container > 1 would share one: use sessions_per_container=1 with network"
            )
        await anyio.to_thread.run_sync(self._prepare)
        if self.settings.shared:
            return await self._new_shared_session()
        worker = take_pooled(self.settings) if self.pool_size else None
        if worker is None:
            worker = await anyio.to_thread.run_sync(start_container, self.settings)
        # A session with secrets trusts a CA of its own: its bundle's name is in its environment.
        bundle = ca_bundle_path() if rules is not None and rules.secrets else None
        session = await self._runner_session(worker, self._container_init(bundle), _release)
        if rules is not None:
            try:
                session.egress = await anyio.to_thread.run_sync(_attach_egress, worker, rules, bundle)
            except BaseException:
                await session.discard()
                raise
        if self.pool_size:
            # After the handshake, not before: starting a container loads the daemon and the CPU,
            # and the session that just took a warm container should not wait behind that.
            refill(self.settings, self.pool_size)
        return session

    async def _new_shared_session(self) -> Session:
        # A cleaned container is reused even with the pool off (`pool=False`: none started ahead).
        container = take_shared(self.settings)
        if container is None:  # one being cleaned is ready in milliseconds
            container = await anyio.to_thread.run_sync(take_shared, self.settings, SHARED_WAIT)
        if container is None:
            container = await anyio.to_thread.run_sync(start_shared, self.settings)
        worker = await container.open_session()
        init = self._runner_init()  # the session's own limits: rlimits of its own uid (docker.shared)
        init["env"] = {**init["env"], "HOME": worker.tmpdir, "TMPDIR": worker.tmpdir}
        session = await self._runner_session(worker, init, _release)
        if self.pool_size:
            refill_shared(self.settings, self.pool_size)
        return session

    def _container_init(self, bundle_path: str | None = None) -> InitRequest:
        init = self._runner_init()
        if self.policy.network_policy is not None:
            init["env"] = with_proxy_environment(init["env"], bundle_path)
        # 0: the runner leaves RLIMIT_NPROC and RLIMIT_AS alone; the container's PID and memory limits
        # apply instead (a cgroup counts memory in use, not address space that threads reserve).
        limits: LimitsConfig = {**init["policy"]["limits"], "max_processes": 0, "memory_mb": 0}
        init["policy"] = {**init["policy"], "limits": limits}
        return init

    def _prepare(self) -> None:
        """Connect, check the image once per process, sweep orphans once per process (blocking)."""
        import docker.errors

        daemon = client()
        if self.settings.image not in _checked_images:
            try:
                found = daemon.images.get(self.settings.image)
            except docker.errors.ImageNotFound as exc:
                raise BackendUnavailable(image_missing_message(self.settings.image)) from exc
            except docker.errors.APIError as exc:
                raise BackendUnavailable(f"cannot inspect the image {self.settings.image!r}: {exc}") from exc
            problem = stale_runner(self.settings.image, found.labels)
            if problem:
                raise BackendUnavailable(problem)
            _checked_images.add(self.settings.image)
            sweep_orphans_soon()


def _checked_settings(options: dict[str, Any]) -> ContainerSettings:
    """`ContainerSettings` of the caller's container options (their defaults and bounds), or a
    `ValueError` naming each bad option, its value and what it must be."""
    try:
        return ContainerSettings(**options)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}={error.get('input')!r}: {error['msg']}"
            for error in exc.errors()
        )
        raise ValueError(f"DockerExecutor got a bad container option: {problems}") from None


def _attach_egress(worker: Worker, rules: NetworkPolicy, bundle_path: str | None) -> EgressLink:
    """The egress gateway's listener into the container's network namespace (blocking): found through
    the container's init, whose pid the daemon names; the daemon is asked again once the namespace is
    held open, so a pid reused meanwhile is never taken for the container's."""
    assert isinstance(worker, DockerWorker)

    def pid() -> int:
        state = client().api.inspect_container(worker.container_id)["State"]
        return int(state["Pid"]) if state.get("Running") else 0

    first = pid()
    if not first:
        raise EgressUnavailable("the session's container is not running, so it cannot get its egress gateway")
    return attach_process_blocking(first, lambda: pid() == first, rules, bundle_path)


async def _release(worker: Worker) -> None:
    # close(): the runner is idle between runs (the executor's lock), so releasing is enough and
    # close() returns in microseconds; the container is stopped at once and removed shortly after.
    if isinstance(worker, DockerWorker):
        worker.release()
    elif isinstance(worker, SharedSessionWorker):
        worker.end()  # a short send; the clean-up is awaited in the background
    else:
        await worker.kill()
