"""What a run used, read from outside the sandbox: the readings behind `ExecutionResult.usage`.

Each backend measures where the code cannot reach, with a `UsageProbe` of its own (in its package):

- host: the parent reads the runner's /proc entries (`ProcessTree`, read by `backends/host/probe.py`): CPU of the runner and of its
  whole process tree (live and zombie descendants, and what reaped children left in ``cutime``/
  ``cstime``), and the runner's peak RSS (``VmHWM``), reset before each run through ``clear_refs``;
- Docker: the container's cgroup v1, read on the host (`backends/docker/probe.py`): ``cpuacct`` and
  the memory controller's ``max_usage_in_bytes`` (reset before each run), or the daemon's stats of
  the container where this process cannot read the host's cgroups;
- E2B: the sandbox's metrics (`metrics_usage`, read by the E2B backend's `MetricsProbe`): coarse
  samples of the whole microVM.

The parsing here is pure (no process, no file of its own) so that it is tested on its own.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .models import RunUsage


class UsageProbe(ABC):
    """Measures one run from outside the sandbox, where the code cannot forge the figures.

    The executor calls `start` just before it sends the code and `stop` once the reply is in, or,
    for a run it stops (its timeout), before the kill, so a killed run still reports what it used.
    Neither may raise: a figure that cannot be read is None (`stop` may return None altogether)."""

    local: bool = False
    """True for a probe whose readings are local reads that never wait (the host's /proc): the
    executor then takes them without the time limit and shield a remote reading needs."""
    continues: bool = False
    """True for a probe that can measure its session's next run from its last `stop`'s reading, so
    the next `start` reads nothing (the host's /proc). A session hands such a probe out again only
    when nothing else ran in the session since that run (no define, reset, file transfer or fork):
    the next run's figures then count from the end of the previous one, the code's background work
    in between included."""

    @abstractmethod
    async def start(self) -> None:
        """Take the 'before' reading (and reset the peak where the platform allows it)."""

    @abstractmethod
    async def stop(self) -> RunUsage | None:
        """Take the 'after' reading and return what the run used."""


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuReading:
    """Cumulative CPU seconds of something (a process tree, a cgroup)."""

    user: float
    system: float

    def since(self, before: CpuReading) -> tuple[float, float]:
        """User and system seconds from `before` to this reading (never negative)."""
        return max(0.0, self.user - before.user), max(0.0, self.system - before.system)


def parse_stat(text: str) -> tuple[str, int, float, float, int]:
    """State, start time and CPU seconds (user, system: own plus reaped children's) of a
    /proc/<pid>/stat line, and its parent pid. The command name may hold spaces and parentheses:
    the fields follow the last ')'."""
    fields = text.rsplit(")", 1)[1].split()
    state, ppid = fields[0], int(fields[1])
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    start = int(fields[19])
    return state, start, (utime + cutime) / CLOCK_TICKS, (stime + cstime) / CLOCK_TICKS, ppid


def parse_status_kib(text: str, key: str) -> int | None:
    """A ``kB`` figure of /proc/<pid>/status (``VmHWM``, ``VmRSS``), in bytes. Only a line that
    starts with the key counts (the kernel escapes a newline in the process's name)."""
    # A find, not a split of every line: the host probe reads this after every run.
    label = key + ":"
    if text.startswith(label):
        at = 0
    else:
        at = text.find("\n" + label)
        if at < 0:
            return None
        at += 1
    end = text.find("\n", at)
    parts = text[at + len(label) : end if end >= 0 else None].split()
    if parts and parts[0].isdigit():
        return int(parts[0]) * 1024
    return None


def parse_nspid(text: str) -> list[int]:
    """The ``NSpid`` line of /proc/<pid>/status: the pid in each PID namespace, outermost first."""
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return [int(p) for p in line.split()[1:] if p.isdigit()]
    return []


def read_text(path: str) -> str | None:
    """A small /proc (or /sys) file's text, or None when it cannot be read (the process is gone)."""
    # Raw descriptors: a text file object costs several times the read itself, and a run reads a few
    # of these files before and after it.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def children(pid: int) -> list[int]:
    """The children of `pid` (every thread's), from /proc/<pid>/task/*/children."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        text = read_text(f"/proc/{pid}/task/{task}/children")
        if text:
            found.extend(int(p) for p in text.split())
    return found


def descendants(root: int, root_children: list[int] | None = None) -> list[int]:
    """Every process below `root` (zombies included), breadth first; `root_children`: the root's
    children where the caller has read them already."""
    found: list[int] = []
    seen = {root}
    queue = [root]
    while queue:
        pid = queue.pop(0)
        below = root_children if pid == root and root_children is not None else children(pid)
        for child in below:
            if child not in seen:
                seen.add(child)
                found.append(child)
                queue.append(child)
    return found


class ProcessTree:
    """A host process (the runner) and everything below it, read from /proc.

    The runner's own entries (``stat``, ``status``, ``clear_refs``, ``task`` and each thread's
    ``children``) are opened once and re-read with `os.pread`: a run reads them before and after it,
    and opening and closing ten files a run was a third of the parent's side of a warm run. A
    descriptor of a /proc entry stays bound to the process it was opened for, so once that process
    is gone it reads as an error, never as another process that got the pid; the first open is
    checked against the start time read at construction (before any code ran). `close` releases the
    descriptors (the worker calls it at its kill; reads after it say "gone").
    `clear_peak` writes ``5`` to ``clear_refs`` (Linux 4.0+: resets ``VmHWM`` to the current RSS),
    which needs the right to write that file (root, or the process's own user); without it the
    peak is the process's whole life's (`peak_scope` ``"session"``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._lock = threading.Lock()  # a kill (another thread) may close while the loop reads
        self._fds: dict[str, int] = {}
        self._children: dict[str, int] = {}  # thread id -> its ``children`` file
        self._closed = False
        self._clear_refused = False
        text = read_text(f"/proc/{pid}/stat")
        self.start_time = parse_stat(text)[1] if text else None

    def _fd(self, name: str, flags: int = os.O_RDONLY) -> int:
        fd = self._fds.get(name)
        if fd is None:
            fd = os.open(f"/proc/{self.pid}/{name}", flags)
            if name == "stat":  # the first descriptor: is the pid still the process we were made for?
                text = os.pread(fd, 1 << 16, 0).decode("ascii", "replace")
                if self.start_time is None or parse_stat(text)[1] != self.start_time:
                    os.close(fd)
                    raise ProcessLookupError(self.pid)
            self._fds[name] = fd
        return fd

    def _read_own(self, name: str) -> str | None:
        with self._lock:
            if self._closed:
                return None
            if name != "stat":
                self._fd("stat")  # opened (and checked) first
            try:
                return os.pread(self._fd(name), 1 << 16, 0).decode("ascii", "replace")
            except (OSError, ValueError):
                return None

    def alive(self) -> bool:
        return self._read_own("stat") is not None

    def _own_children(self) -> list[int]:
        found: list[int] = []
        with self._lock:
            if self._closed:
                return found
            try:
                self._fd("stat")
                tasks = os.listdir(self._fd("task", os.O_RDONLY | os.O_DIRECTORY))
            except (OSError, ValueError):
                return found
            for gone in set(self._children) - set(tasks):
                os.close(self._children.pop(gone))
            for task in tasks:
                try:
                    fd = self._children.get(task)
                    if fd is None:
                        fd = self._children[task] = os.open(
                            f"{task}/children", os.O_RDONLY, dir_fd=self._fds["task"]
                        )
                    text = os.pread(fd, 1 << 16, 0).decode("ascii", "replace")
                except OSError:
                    continue  # the thread ended between the listing and the read
                found.extend(int(p) for p in text.split())
        return found

    def cpu(self) -> CpuReading | None:
        """CPU of the runner, what its reaped children left it, and every descendant still in the
        table (zombies keep their figures until reaped, and reaping moves them to the parent's
        ``cutime``: the sum stays whole while the tree reaps itself)."""
        root = self._read_own("stat")
        if root is None:
            return None  # gone
        try:
            _state, _start, user, system, _ppid = parse_stat(root)
        except (IndexError, ValueError):
            return None
        # below the runner's own children (read through its descriptors), the code's processes, if
        # any, by path: rare, and they come and go
        for pid in descendants(self.pid, self._own_children()):
            text = read_text(f"/proc/{pid}/stat")
            if text is None:
                continue  # ended between the listing and the read: its parent's cutime has it
            try:
                _state, _start, u, s, _ppid = parse_stat(text)
            except (IndexError, ValueError):
                continue
            user += u
            system += s
        return CpuReading(user, system)

    def clear_peak(self) -> bool:
        """Reset the peak RSS to the current RSS; False where that is not permitted here."""
        with self._lock:
            if self._closed or self._clear_refused:
                return False
            try:
                self._fd("stat")
                os.write(self._fd("clear_refs", os.O_WRONLY), b"5")
                return True
            except PermissionError:
                self._clear_refused = True  # not ours to reset: do not try on every run
                return False
            except (OSError, ValueError):
                return False

    def peak_rss(self) -> int | None:
        """The peak RSS."""
        text = self._read_own("status")
        return parse_status_kib(text, "VmHWM") if text else None

    def close(self) -> None:
        """Release the descriptors; every later reading says the process is gone."""
        with self._lock:
            self._closed = True
            for fd in [*self._children.values(), *self._fds.values()]:
                os.close(fd)
            self._children.clear()
            self._fds.clear()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


def find_in_namespace(root: int, ns_pid: int | None, skip: Iterable[str] = ("bwrap",)) -> int | None:
    """The host pid of a process below `root` (bubblewrap's) in a PID namespace: the one whose
    innermost pid is `ns_pid`, or (`ns_pid` None) the first below `root` that is not one of `skip`."""
    skipped = set(skip)
    for pid in descendants(root):
        status = read_text(f"/proc/{pid}/status")
        if status is None:
            continue
        if ns_pid is not None:
            nspid = parse_nspid(status)
            if len(nspid) > 1 and nspid[-1] == ns_pid:
                return pid
            continue
        name = next((line.split()[1] for line in status.splitlines() if line.startswith("Name:")), "")
        if name not in skipped:
            return pid
    return None


def make_usage(
    user: float | None,
    system: float | None,
    peak: int | None,
    wall: float,
    scope: str,
    source: str,
    *,
    cpu_exact: bool,
    peak_exact: bool,
    total: float | None = None,
) -> RunUsage:
    """A `RunUsage` from its figures; `total` where the platform gives only user plus system."""
    if total is None and user is not None and system is not None:
        total = user + system
    return RunUsage(
        cpu_user_seconds=None if user is None else round(user, 6),
        cpu_system_seconds=None if system is None else round(system, 6),
        cpu_seconds=None if total is None else round(total, 6),
        peak_memory_bytes=peak,
        wall_seconds=round(wall, 6),
        peak_scope="run" if scope == "run" else "session",
        exact={"cpu": cpu_exact, "peak_memory": peak_exact, "wall": True},
        source=source,
    )


# ---------------------------------------------------------------------- cgroup v1 (Docker)


def parse_cpuacct_stat(text: str) -> CpuReading:
    """cpuacct.stat (``user N`` / ``system N`` in clock ticks) as seconds."""
    values = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
    return CpuReading(int(values.get("user", 0)) / CLOCK_TICKS, int(values.get("system", 0)) / CLOCK_TICKS)


def cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """/proc/<pid>/cgroup as controller -> path (v1 lines ``id:controllers:path``; v2 is controller '')."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def split_cpu(total: float, reading: CpuReading) -> tuple[float, float]:
    """Split an exact total (cpuacct.usage, ns) in the proportion of the tick-based user/system figures."""
    ticks = reading.user + reading.system
    if ticks <= 0:
        return total, 0.0
    user = total * reading.user / ticks
    return user, total - user


# ---------------------------------------------------------------------- E2B metrics


def metrics_usage(
    samples: Sequence[Any], started: float, ended: float, wall: float, previous: float | None = None
) -> RunUsage:
    """A run's usage from E2B sandbox metrics (`SandboxMetrics`: timestamp, cpu_count, cpu_used_pct,
    mem_used): each sample's CPU percentage holds over the interval since the sample before it
    (`previous`: the last sample's time before these), prorated to the part of it inside the run
    [`started`, `ended`] (Unix seconds). Memory is the highest `mem_used` of those samples: in use
    then, not a true peak, and of the whole microVM. Both approximate, session scope."""
    cpu = 0.0
    peak: int | None = None
    last = previous
    measured = False
    for sample in sorted(samples, key=lambda s: _timestamp(s)):
        at = _timestamp(sample)
        begin = at - 1.0 if last is None else last
        last = at
        overlap = min(at, ended) - max(begin, started)
        if at >= started:
            used = int(getattr(sample, "mem_used", 0) or 0)
            peak = used if peak is None else max(peak, used)
        if overlap <= 0 or at <= begin:
            continue
        measured = True
        share = (
            float(getattr(sample, "cpu_used_pct", 0.0) or 0.0)
            / 100
            * int(getattr(sample, "cpu_count", 1) or 1)
        )
        cpu += share * overlap
    return make_usage(
        None,
        None,
        peak,
        wall,
        "session",
        "e2b-metrics",
        cpu_exact=False,
        peak_exact=False,
        total=cpu if measured else None,
    )


def _timestamp(sample: Any) -> float:
    stamp = getattr(sample, "timestamp", None)
    if stamp is not None and hasattr(stamp, "timestamp"):
        return float(stamp.timestamp())
    return float(getattr(sample, "timestamp_unix", 0))
