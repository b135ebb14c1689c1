"""A sandbox's metrics as E2B's control plane reports them (`SandboxMetric`: CPU, memory, disk), read
on this machine from outside the sandbox, never from what it says about itself.

- host: the session's processes are the runner and everything below it (/proc, as pausing finds
  them): CPU seconds of the tree (reaped children included), the sum of their resident memory, the
  CPUs the runner may run on; disk is what the home holds (a bounded walk, symlinks not followed)
  and the size of its file system; memory total is the worker's limit (or the machine's, if less).
- Docker: the daemon's stats of the container (its cgroup: CPU, memory used and page cache, limit)
  and the container's writable layer (``SizeRw``) plus its home volume where this machine can read it.

A reading is taken when metrics are asked for; each sandbox keeps its last `MAX_SAMPLES`, and CPU
percent is over the time since the one before (since the sandbox started, for the first).
"""

from __future__ import annotations

import datetime
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from ...backends.docker.settings import WORKDIR
from ...usage import parse_stat, parse_status_kib
from .pause import _runner_pid, _tree, _worker

if TYPE_CHECKING:
    from .sandbox import ServedSandbox

MAX_SAMPLES = 120
"""Readings kept per sandbox (E2B keeps a series too; a client polling every 5 s sees 10 minutes)."""
MAX_WALK = 100_000
"""Entries of the home counted for its disk use; past it the figure is a floor."""


@dataclass(frozen=True)
class Reading:
    """One sample of a sandbox, before CPU seconds become a percentage."""

    at: float
    cpu_seconds: float
    cpu_count: int
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


class Meter:
    """A sandbox's readings so far, bounded."""

    def __init__(self, started_at: float) -> None:
        self.samples: deque[dict[str, Any]] = deque(maxlen=MAX_SAMPLES)
        self._last: tuple[float, float] = (started_at, 0.0)

    def add(self, reading: Reading) -> None:
        then, cpu_then = self._last
        wall = max(reading.at - then, 1e-6)
        spent = max(reading.cpu_seconds - cpu_then, 0.0)
        percent = min(100.0, 100.0 * spent / (wall * max(reading.cpu_count, 1)))
        self._last = (reading.at, reading.cpu_seconds)
        moment = datetime.datetime.fromtimestamp(reading.at, datetime.UTC)
        self.samples.append(
            {
                "timestamp": moment.isoformat().replace("+00:00", "Z"),
                "timestampUnix": int(reading.at),
                "cpuCount": reading.cpu_count,
                "cpuUsedPct": round(percent, 2),
                "memUsed": reading.mem_used,
                "memTotal": reading.mem_total,
                "memCache": reading.mem_cache,
                "diskUsed": reading.disk_used,
                "diskTotal": reading.disk_total,
            }
        )

    def between(self, start: float | None, end: float | None) -> list[dict[str, Any]]:
        return [
            s
            for s in self.samples
            if (start is None or s["timestampUnix"] >= start) and (end is None or s["timestampUnix"] <= end)
        ]


async def sample(sandbox: ServedSandbox) -> Reading | None:
    """A reading of `sandbox` now, or None when it has no live session (nothing runs in it)."""
    worker = _worker(sandbox.executor)
    if worker is None:
        return None
    container = getattr(worker, "container_id", None)
    if isinstance(container, str):
        return await anyio.to_thread.run_sync(_docker_reading, container)
    root = _runner_pid(worker)
    workdir = getattr(worker, "workdir", None)
    if root is None or not isinstance(workdir, str):
        return None
    limit = sandbox.executor.policy.limits.memory_mb * 1024 * 1024
    return await anyio.to_thread.run_sync(_host_reading, root, workdir, limit)


async def home_on_this_machine(sandbox: ServedSandbox) -> str | None:
    """Where the sandbox's home is on this machine (host: the session's directory; Docker: the home
    volume where the daemon keeps it, when its files are this machine's), or None."""
    worker = _worker(sandbox.executor)
    if worker is None:
        return None
    container = getattr(worker, "container_id", None)
    if isinstance(container, str):
        try:
            inspected = await anyio.to_thread.run_sync(_inspect, container)
        except Exception:  # gone, or the daemon refused
            return None
        source = _home_source(inspected)
        return source if source is not None and os.path.isdir(source) else None
    workdir = getattr(worker, "workdir", None)
    return workdir if isinstance(workdir, str) else None


def _inspect(container: str) -> dict[str, Any]:
    from ...backends.docker.daemon import client

    api = client().api
    # docker-py's inspect_container cannot ask for sizes; the Engine API's own query can.
    inspected: dict[str, Any] = api._result(
        api._get(api._url("/containers/{0}/json", container), params={"size": 1}), True
    )
    return inspected


def _home_source(inspected: dict[str, Any]) -> str | None:
    home = next((m for m in inspected.get("Mounts") or () if m.get("Destination") == WORKDIR), None)
    source = home.get("Source") if isinstance(home, dict) else None
    return source if isinstance(source, str) else None


def _host_reading(root: int, workdir: str, memory_limit: int) -> Reading:
    cpu = 0.0
    rss = 0
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
                _, _, user, system, _ = parse_stat(handle.read())
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
                resident = parse_status_kib(handle.read(), "VmRSS")
        except (OSError, ValueError, IndexError):
            continue  # it ended between the walk and the read
        cpu += user + system
        rss += resident or 0
    try:
        cpus = len(os.sched_getaffinity(root))
    except OSError:
        cpus = os.cpu_count() or 1
    machine = _meminfo_total()
    try:
        disk = os.statvfs(workdir)
        disk_total = disk.f_blocks * disk.f_frsize
    except OSError:
        disk_total = 0
    return Reading(
        at=time.time(),
        cpu_seconds=cpu,
        cpu_count=cpus,
        mem_used=rss,
        mem_total=min(memory_limit, machine) if machine else memory_limit,
        mem_cache=0,
        disk_used=_disk_used(workdir),
        disk_total=disk_total,
    )


def _meminfo_total() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            return parse_status_kib(handle.read(), "MemTotal") or 0
    except OSError:
        return 0


def _disk_used(top: str) -> int:
    """Bytes allocated under `top`, never following a symlink (the sandbox may plant them)."""
    used, seen = 0, 0
    stack = [top]
    while stack and seen < MAX_WALK:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return used


def _docker_reading(container: str) -> Reading | None:
    from ...backends.docker.daemon import client

    try:
        stats = client().api.stats(container, stream=False)
        inspected = _inspect(container)
    except Exception:  # gone, or the daemon refused: no reading rather than a wrong one
        return None
    size = int(inspected.get("SizeRw") or 0)
    # The home is a volume (or a bind mount): walked where the daemon keeps it, when this machine's
    # files are the daemon's (a remote daemon's are not: then only the writable layer counts).
    source = _home_source(inspected)
    home_used, home_total = 0, 0
    if source is not None and os.path.isdir(source):
        home_used = _disk_used(source)
        try:
            disk = os.statvfs(source)
            home_total = disk.f_blocks * disk.f_frsize
        except OSError:
            pass
    cpu_stats = stats.get("cpu_stats") or {}
    memory = stats.get("memory_stats") or {}
    details = memory.get("stats") or {}
    cache = int(details.get("cache", details.get("file", 0)) or 0)
    cpus = int(cpu_stats.get("online_cpus") or os.cpu_count() or 1)
    total_usage = (cpu_stats.get("cpu_usage") or {}).get("total_usage") or 0
    return Reading(
        at=time.time(),
        cpu_seconds=int(total_usage) / 1e9,
        cpu_count=cpus,
        mem_used=max(int(memory.get("usage") or 0) - cache, 0),
        mem_total=int(memory.get("limit") or 0),
        mem_cache=cache,
        disk_used=size + home_used,
        disk_total=home_total,
    )
