"""Forking a live session, beside rebuilding its state in a fresh one: rows for `bench latency`.

For each state size (about 1 MB, 100 MB and 1 GB by default) a session builds its state, then:
- fork, <size>: `await executor.fork()` of that session, call to return (the child is closed after,
  untimed). The host's fork is copy-on-write, so its cost grows with the page tables, not the data.
- rebuild, <size>: what the state costs without a fork: `open()` of a fresh executor plus the run of
  the code that builds the state. This is the cheapest possible replay (one step that makes the data;
  an agent's real history also repeats its model calls and side effects). The first rebuild warms
  the pool and is not counted.
- memory per fork: after each child has *read* its whole state (`sum(len(c) for c in state)`, which
  increments every chunk's reference count and so dirties the page holding each object's header),
  its runner's ``/proc/<pid>/smaps_rollup``: Private_Clean + Private_Dirty (the memory that is the
  child's alone, i.e. what the fork added), beside its RSS and PSS. Measured where the session's
  worker can name its runner's host process (`worker.process_tree()`: host); "-" elsewhere.

The state is a list of 64 KiB `bytes` chunks of distinct content (`bytes(n)` would be calloc'd zero
pages that cost nothing). Target on host: fork p50 at least 10x faster than rebuild p50, measured in
the same run. Nothing is asserted: the rows say whether the target was met.

Any backend plugs in through `fork_rows(backend, ...)` (sessions made by `open_executor(backend)`); a
backend whose sessions cannot fork yet gives no rows and the reason (its `ForkError`).
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from sandboxes import Executor, ForkError, Limits, Policy, open_executor
from sandboxes.backends import backend_name

from .common import ratio, summarize

MB = 1 << 20
CHUNK = 64 * 1024
SIZES: tuple[int, ...] = (MB, 100 * MB, 1024 * MB)
"""The default state sizes, in bytes."""
BIG = 512 * MB
"""Sizes from here on are measured with the `big_n`/`big_rebuild_n` repetitions (slow to rebuild)."""
SPEEDUP_TARGET = 10.0
"""Host target: fork p50 this many times faster than rebuild p50."""
READ = "print(sum(len(chunk) for chunk in state))"


def build_code(size: int) -> str:
    """The code that makes a state of about `size` bytes: distinct chunks, so every page is real."""
    count = max(1, size // CHUNK)
    return f"state = [i.to_bytes(8, 'little') * {CHUNK // 8} for i in range({count})]\nprint(len(state))"


def state_bytes(size: int) -> int:
    return max(1, size // CHUNK) * CHUNK


def size_label(size: int) -> str:
    """1 MB, 100 MB, 1 GB: the names the rows carry."""
    if size >= 1024 * MB and size % (1024 * MB) == 0:
        return f"{size // (1024 * MB)} GB"
    if size >= MB:
        return f"{size / MB:g} MB"
    return f"{size / 1024:g} KB"


def parse_size(text: str) -> int:
    """``"1MB"``, ``"100 MB"``, ``"1GB"``, ``"512KB"`` -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG])i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 1MB, 100MB or 1GB")
    scale = {"K": 1024, "M": MB, "G": 1024 * MB}[match.group(2).upper()]
    value = int(float(match.group(1)) * scale)
    if value < CHUNK:
        raise ValueError(f"{text!r} is smaller than one {CHUNK // 1024} KB chunk of state")
    return value


def policy_for(size: int) -> Policy:
    """The default policy with an address-space limit that leaves room for the state (the 2 GB
    default would refuse a 1 GB state built as a list, with its interpreter around it)."""
    return Policy(limits=Limits(memory_mb=max(Limits().memory_mb, 3 * size // MB + 1024)))


# ---------------------------------------------------------------------- memory


def runner_pid(executor: Executor) -> int | None:
    """The host pid of the executor's runner, where its worker can name it (as the usage probe does)."""
    session = executor.session
    worker = getattr(session, "worker", None)
    find = getattr(worker, "process_tree", None)
    if find is None:
        return None
    tree = find()
    return tree.pid if tree is not None and tree.alive() else None


def smaps_rollup(pid: int) -> dict[str, int] | None:
    """The kB figures of ``/proc/<pid>/smaps_rollup`` (Linux 4.14+), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            text = handle.read()
    except OSError:
        return None
    figures: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            figures[parts[0][:-1]] = int(parts[1])
    return figures or None


def fork_memory(executor: Executor) -> dict[str, float] | None:
    """The child's private memory (what the fork added), RSS and PSS, in MB."""
    pid = runner_pid(executor)
    figures = smaps_rollup(pid) if pid is not None else None
    if figures is None:
        return None
    return {
        "added_mb": (figures.get("Private_Clean", 0) + figures.get("Private_Dirty", 0)) / 1024,
        "rss_mb": figures.get("Rss", 0) / 1024,
        "pss_mb": figures.get("Pss", 0) / 1024,
    }


# ---------------------------------------------------------------------- measurement


async def measure_size(make: Callable[..., Executor], size: int, n: int, rebuild_n: int) -> dict[str, Any]:
    """Fork and rebuild samples (seconds) and memory per fork for one state size.

    Raises `ForkError` when the backend's sessions cannot fork (before anything is timed)."""
    policy = policy_for(size)
    code = build_code(size)
    expected = f"{state_bytes(size)}\n"
    forks: list[float] = []
    memory: list[dict[str, float]] = []
    async with make(policy=policy, timeout=120) as parent:
        built = await parent.run(code)
        if not built.ok:
            raise RuntimeError(f"building a {size_label(size)} state failed: {built.error}")
        for index in range(n + 1):
            started = time.perf_counter()
            child = await parent.fork()
            elapsed = time.perf_counter() - started
            async with child:
                read = await child.run(READ)
                if read.stdout != expected:
                    raise RuntimeError(f"the fork read {read.stdout!r}, not {expected!r} ({read.error})")
                figures = fork_memory(child)
            if index:  # the first fork pays one-time costs (a first copy of the working directory)
                forks.append(elapsed)
                if figures is not None:
                    memory.append(figures)
        check = await parent.run(READ)  # the parent still holds its state, untouched by the forks
        if check.stdout != expected:
            raise RuntimeError(f"the parent read {check.stdout!r} after the forks ({check.error})")
    rebuilds: list[float] = []
    for index in range(rebuild_n + 1):
        fresh = make(policy=policy, timeout=120)
        try:
            started = time.perf_counter()
            await fresh.open()
            built = await fresh.run(code)
            elapsed = time.perf_counter() - started
        finally:
            await fresh.close()  # removal is not part of what a rebuild costs the caller
        if not built.ok:
            raise RuntimeError(f"rebuilding a {size_label(size)} state failed: {built.error}")
        if index:  # the first one starts the pool of sessions with this policy
            rebuilds.append(elapsed)
    return {"fork": forks, "rebuild": rebuilds, "memory": memory}


async def measure(
    make: Callable[..., Executor],
    sizes: Sequence[int] = SIZES,
    n: int = 20,
    rebuild_n: int = 10,
    big_n: int = 5,
    big_rebuild_n: int = 3,
    log: Callable[[str], None] | None = None,
) -> dict[int, dict[str, Any]]:
    """`measure_size` for every size (sizes from `BIG` on with the smaller repetitions)."""
    samples: dict[int, dict[str, Any]] = {}
    for size in sizes:
        forks, rebuilds = (big_n, big_rebuild_n) if size >= BIG else (n, rebuild_n)
        if log is not None:
            log(f"fork of a {size_label(size)} state x{forks}, rebuild x{rebuilds}")
        samples[size] = await measure_size(make, size, forks, rebuilds)
    return samples


def rows_from(benchmark: str, samples: dict[int, dict[str, Any]], target: bool) -> list[dict[str, Any]]:
    """One fork row and one rebuild row per size; the fork row carries the ratio and the memory."""
    rows: list[dict[str, Any]] = []
    for size, data in samples.items():
        label = size_label(size)
        fork_stats, rebuild_stats = summarize(data["fork"]), summarize(data["rebuild"])
        rebuild_name = f"rebuild {label} state (open + build)"
        row: dict[str, Any] = {
            "benchmark": benchmark,
            "name": f"fork, {label} state",
            "state_bytes": state_bytes(size),
            **fork_stats,
            "baseline": rebuild_name,
            "speedup_p50": ratio(rebuild_stats["p50_ms"], fork_stats["p50_ms"]),
            "speedup_p95": ratio(rebuild_stats["p95_ms"], fork_stats["p95_ms"]),
        }
        if target:
            row["target_speedup"] = SPEEDUP_TARGET
            row["meets_target"] = row["speedup_p50"] >= SPEEDUP_TARGET
        memory = data["memory"]
        if memory:
            row["memory_per_fork"] = {
                key: statistics.median(m[key] for m in memory) for key in ("added_mb", "rss_mb", "pss_mb")
            }
        rows.append(row)
        rows.append(
            {"benchmark": benchmark, "name": rebuild_name, "state_bytes": state_bytes(size), **rebuild_stats}
        )
    return rows


def fork_rows(
    backend: str,
    sizes: Sequence[int] = SIZES,
    *,
    n: int = 20,
    rebuild_n: int = 10,
    big_n: int = 5,
    big_rebuild_n: int = 3,
    log: Callable[[str], None] | None = None,
    **options: Any,
) -> tuple[list[dict[str, Any]], str | None]:
    """The fork rows of `backend` (sessions from `open_executor(backend_name(backend), **options)`), or no rows and
    why: a backend that cannot fork answers the first `fork()` with `ForkError`, before any timing."""
    import anyio

    def make(**more: Any) -> Executor:
        return open_executor(backend_name(backend), **{**options, **more})

    try:
        samples = anyio.run(measure, make, sizes, n, rebuild_n, big_n, big_rebuild_n, log)
    except ForkError as exc:
        return [], f"fork: {exc}"
    return rows_from(f"{backend} fork", samples, target=backend == "host"), None
