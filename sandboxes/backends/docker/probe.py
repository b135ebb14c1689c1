"""The Docker backend's usage probe: what a run used, read from the container's cgroup v1 on this host,
or from the daemon's stats where this process cannot read the host's cgroups."""

from __future__ import annotations

import os
import time
from typing import Protocol

import anyio

from ...models import RunUsage
from ...usage import (
    CpuReading,
    UsageProbe,
    cgroup_paths,
    make_usage,
    parse_cpuacct_stat,
    read_text,
    split_cpu,
)
from .daemon import client

CGROUP_ROOT = "/sys/fs/cgroup"


class Measured(Protocol):
    """What the probe reads of a session's worker: its container, that container's cgroup
    directories (looked up once), and where the daemon's memory peak is kept between readings."""

    container_id: str
    stats_peak: int | None

    def cgroup_dirs(self) -> tuple[str, str] | None: ...


class ContainerProbe(UsageProbe):
    """`usage.UsageProbe` for a container: its cgroup v1 as the host sees it (``cpuacct.usage``,
    ``cpuacct.stat``, ``memory.max_usage_in_bytes``, reset before each run for a per-run peak),
    or, where this process cannot read the host's cgroups (it runs in a container itself), the
    daemon's stats of the container (CPU exact; memory the session's peak)."""

    def __init__(self, worker: Measured) -> None:
        self.worker = worker
        self.started = 0.0
        self.before: tuple[int, CpuReading] | None = None
        self.scope = "session"

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._start)
        self.started = time.perf_counter()

    def _start(self) -> None:
        paths = self.worker.cgroup_dirs()
        if paths is not None:
            self.scope = (
                "run" if _write(os.path.join(paths[1], "memory.max_usage_in_bytes"), "0") else "session"
            )
            self.before = _cgroup_cpu(paths[0])
        else:
            self.before = _stats_cpu(self.worker.container_id)

    async def stop(self) -> RunUsage | None:
        wall = time.perf_counter() - self.started
        return await anyio.to_thread.run_sync(self._stop, wall)

    def _stop(self, wall: float) -> RunUsage | None:
        paths = self.worker.cgroup_dirs()
        peak: int | None = None
        if paths is not None:
            after = _cgroup_cpu(paths[0])
            text = read_text(os.path.join(paths[1], "memory.max_usage_in_bytes"))
            peak = int(text) if text and text.strip().isdigit() else None
            source = "cgroup"
        else:
            after = _stats_cpu(self.worker.container_id, self.worker)
            source = "docker-stats"
        if after is None or self.before is None:
            return make_usage(None, None, peak, wall, self.scope, source, cpu_exact=True, peak_exact=True)
        if paths is None:
            peak = self.worker.stats_peak
        total = max(0, after[0] - self.before[0]) / 1e9
        user, system = split_cpu(total, CpuReading(*after[1].since(self.before[1])))
        return make_usage(
            user, system, peak, wall, self.scope, source, cpu_exact=True, peak_exact=True, total=total
        )


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(text)
        return True
    except OSError:
        return False


def _cgroup_cpu(directory: str) -> tuple[int, CpuReading] | None:
    usage = read_text(os.path.join(directory, "cpuacct.usage"))
    stat = read_text(os.path.join(directory, "cpuacct.stat"))
    if not usage or not stat or not usage.strip().isdigit():
        return None
    return int(usage), parse_cpuacct_stat(stat)


def _stats_cpu(container_id: str, worker: Measured | None = None) -> tuple[int, CpuReading] | None:
    """The daemon's one-shot stats: CPU in ns (total, user, kernel); with `worker`, the memory peak is
    kept on it (cgroup v1's max_usage, of the container's life)."""
    try:
        stats = client().api.stats(container_id, stream=False, one_shot=True)
        usage = stats["cpu_stats"]["cpu_usage"]
    except Exception:
        return None
    if worker is not None:
        peak = (stats.get("memory_stats") or {}).get("max_usage")
        worker.stats_peak = int(peak) if isinstance(peak, int) else None
    return int(usage.get("total_usage", 0)), CpuReading(
        usage.get("usage_in_usermode", 0) / 1e9, usage.get("usage_in_kernelmode", 0) / 1e9
    )


def oom_kills(memory_dir: str | None) -> int | None:
    """How many processes the memory cgroup at `memory_dir` has had OOM-killed (cgroup v1's
    ``memory.oom_control``, v2's ``memory.events``), or None where it cannot be read."""
    if memory_dir is None:
        return None
    for name in ("memory.oom_control", "memory.events"):
        for line in (read_text(os.path.join(memory_dir, name)) or "").splitlines():
            key, _, count = line.partition(" ")
            if key == "oom_kill" and count.strip().isdigit():
                return int(count)
    return None


def find_cgroup_dirs(pid: int, root: str = CGROUP_ROOT) -> tuple[str, str] | None:
    """The cpuacct and memory cgroup v1 directories of host process `pid`, if this process can read them."""
    text = read_text(f"/proc/{pid}/cgroup")
    if not text:
        return None
    paths = cgroup_paths(text)
    found = []
    for controller, mounts in (
        ("cpuacct", ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")),
        ("memory", ("memory",)),
    ):
        relative = paths.get(controller)
        if relative is None:
            return None
        directory = next(
            (
                os.path.join(root, mount, relative.lstrip("/"))
                for mount in mounts
                if os.path.isdir(os.path.join(root, mount, relative.lstrip("/")))
            ),
            None,
        )
        if directory is None:
            return None
        found.append(directory)
    return found[0], found[1]


def container_cgroup_dirs(container_id: str) -> tuple[str, str] | None:
    """The container's cpuacct and memory cgroup directories on this host, from its init's pid
    (blocking), or None where they cannot be read from here."""
    try:
        pid = client().api.inspect_container(container_id)["State"]["Pid"]
    except Exception:
        pid = 0
    return find_cgroup_dirs(pid) if pid else None
