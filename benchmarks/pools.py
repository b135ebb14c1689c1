"""Host session opens under concurrency: the pools sized to the load against the fixed sizing of before.

What is timed: `open()` of a default `HostExecutor` (pool on), the call to its return, with `c` opens
at a time, in two shapes:

- **burst**: `c` sessions opened at once, each run once (`print(1)`) and closed; the pools settle
  (their refills end) and a short gap passes before the next burst, as a grader's batches come.
- **steady**: `c` workers, each opening, running and closing sessions back to back, never waiting
  for the pools: how many sessions a second the spawners keep up with.

Each shape runs on the pools sized by `sandboxes/backends/host/demand.py` ("sized") and on the fixed
sizing of before ("fixed": 2 idle workers per key, one spawner thread, `KODEAGENT_HOST_FIXED_POOLS=1`),
each in processes of its own (the spawner threads are set at import), alternating, in the same run;
the ratio is fixed over sized (above 1: the sized pools open faster). "pool hits" counts the opens
that found a worker initialised ahead (no handshake on the open's path). The floor: a bare fork of
the fork server (its request and answer, no warm-up, no handshake), one at a time.

    python -m benchmarks.pools --rounds 10 --n 40
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio

from .common import fmt_ms, fmt_ratio, make_console, print_table, publish, ratio, script_main, summarize

CONCURRENCY: tuple[int, ...] = (1, 2, 4, 8)
CODE = "print(1)"
GAP = 0.5
"""Seconds between bursts (after the pools settled): well inside `SHRINK_AFTER`, as a grader's batches."""
VARIANTS = ("sized", "fixed")


# ---------------------------------------------------------------------- in the measuring process


async def _session(samples: list[float], hits: list[bool]) -> None:
    from sandboxes import HostExecutor
    from sandboxes.session import RunnerSession

    executor = HostExecutor(timeout=30)
    started = time.perf_counter()
    await executor.open()
    samples.append(time.perf_counter() - started)
    session = executor.session
    hits.append(isinstance(session, RunnerSession) and session.handshake_seconds == 0.0)
    try:
        result = await executor.run(CODE)
        if result.stdout != "1\n":
            raise RuntimeError(f"the run answered {result.stdout!r} ({result.error})")
    finally:
        await executor.close()


async def _settle() -> None:
    from sandboxes.backends.host import executor as host

    with anyio.fail_after(120):
        while host.refilling():
            await anyio.sleep(0.005)


async def _shrunk() -> None:
    """Wait until an earlier shape's peak is forgotten (the pools back at their base)."""
    from sandboxes.backends.host import executor as host

    with anyio.fail_after(120):
        while host.POOLS.sizes()["pool_size"] > host.POOL_SIZE or host.refilling():
            await anyio.sleep(0.1)


async def burst(c: int, rounds: int) -> dict[str, Any]:
    samples: list[float] = []
    hits: list[bool] = []
    await _burst_once(c, [], [])  # the first burst of this size fills the pools for it: not counted
    for _ in range(rounds):
        await _settle()
        await anyio.sleep(GAP)
        await _burst_once(c, samples, hits)
    return {"samples": samples, "hits": sum(hits)}


async def _burst_once(c: int, samples: list[float], hits: list[bool]) -> None:
    async with anyio.create_task_group() as group:
        for _ in range(c):
            group.start_soon(_session, samples, hits)


async def steady(c: int, n: int) -> dict[str, Any]:
    samples: list[float] = []
    hits: list[bool] = []
    each = max(1, -(-n // c))

    async def worker() -> None:
        await _session([], [])  # each worker's first session brings the shape to its steady state
        for _ in range(each):
            await _session(samples, hits)

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(c):
            group.start_soon(worker)
    wall = time.perf_counter() - started
    return {"samples": samples, "hits": sum(hits), "sessions_per_s": (len(samples) + c) / wall}


def floor(n: int) -> list[float]:
    """A bare fork of the fork server, one at a time; the worker is killed off the clock."""
    from sandboxes.backends.host import executor as host
    from sandboxes.backends.host.process import fork_worker

    level = host._LEVELS.get("auto") or "process"
    samples = []
    for _ in range(n + 1):
        started = time.perf_counter()
        worker = fork_worker(level, False, ())
        samples.append(time.perf_counter() - started)
        worker.kill_now()
    return samples[1:]


async def measure_here(concurrency: Sequence[int], rounds: int, n: int, with_floor: bool) -> dict[str, Any]:
    """Every shape in this process (one variant: the environment says which)."""
    from sandboxes.backends.host import executor as host

    for _ in range(3):  # the fork server, the level and the base pools of these options
        await _session([], [])
        await _settle()
    out: dict[str, Any] = {"sizes": host.POOLS.sizes(), "burst": {}, "steady": {}}
    for c in concurrency:
        out["burst"][str(c)] = await burst(c, rounds)
    for c in concurrency:
        await _shrunk()
        out["steady"][str(c)] = await steady(c, n)
    if with_floor:
        out["floor"] = await anyio.to_thread.run_sync(floor, n)
    return out


# ---------------------------------------------------------------------- the run


def _child(variant: str, args: argparse.Namespace, with_floor: bool) -> dict[str, Any]:
    from sandboxes.backends.host.demand import FIXED_ENV

    env = {**os.environ, FIXED_ENV: "1" if variant == "fixed" else "0"}
    command = [
        sys.executable,
        "-m",
        "benchmarks.pools",
        "--child",
        "--concurrency",
        ",".join(map(str, args.concurrency)),
        "--rounds",
        str(args.rounds),
        "--n",
        str(args.n),
        *(["--floor"] if with_floor else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the {variant} measurement failed: {done.stderr.strip()[-2000:]}")
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def measure(concurrency: Sequence[int], rounds: int, n: int, repeats: int) -> dict[str, Any]:
    """Each variant in `repeats` processes of its own, alternating; their samples pooled per shape."""
    args = argparse.Namespace(concurrency=list(concurrency), rounds=rounds, n=n)
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    for index in range(repeats):
        for variant in VARIANTS if index % 2 == 0 else reversed(VARIANTS):
            runs[variant].append(_child(variant, args, with_floor=variant == "sized" and index == 0))
    rows: list[dict[str, Any]] = []
    for shape in ("burst", "steady"):
        for c in concurrency:
            pooled: dict[str, dict[str, Any]] = {}
            for variant in VARIANTS:
                parts = [run[shape][str(c)] for run in runs[variant]]
                samples = [s for part in parts for s in part["samples"]]
                pooled[variant] = {
                    **summarize(samples),
                    "hits": sum(part["hits"] for part in parts),
                    "sessions_per_s": _mean([p["sessions_per_s"] for p in parts if "sessions_per_s" in p]),
                }
            sized, fixed = pooled["sized"], pooled["fixed"]
            rows.append(
                {
                    "shape": shape,
                    "concurrency": c,
                    "sized": sized,
                    "fixed": fixed,
                    "ratio_p50": ratio(fixed["p50_ms"], sized["p50_ms"]),
                    "ratio_p95": ratio(fixed["p95_ms"], sized["p95_ms"]),
                }
            )
    targets = targets_of(rows)
    floor_samples = runs["sized"][0].get("floor", [])
    return {
        "code": CODE,
        "rounds": rounds,
        "n": n,
        "repeats": repeats,
        "gap_s": GAP,
        "sizes": {variant: runs[variant][0]["sizes"] for variant in VARIANTS},
        "rows": rows,
        "targets": targets,
        "floor": summarize(floor_samples),
        "load": os.getloadavg(),
    }


def targets_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The target: under the largest burst, every open of the sized pools from the pool (none
    outside it, so none in the p95 tail)."""
    bursts = [row for row in rows if row["shape"] == "burst"]
    if not bursts:
        return []
    row = max(bursts, key=lambda r: r["concurrency"])
    sized = row["sized"]
    return [
        {
            "name": f"sized pools, bursts of {row['concurrency']} at once: every open from the pool",
            "met": sized["hits"] == sized["n"],
            "measured": f"{sized['hits']}/{sized['n']} from the pool, p95 {sized['p95_ms']:.2f} ms",
        }
    ]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def report(console: Any, result: dict[str, Any]) -> None:
    rows = []
    for row in result["rows"]:
        sized, fixed = row["sized"], row["fixed"]
        rate = ""
        if row["shape"] == "steady":
            rate = f"{sized['sessions_per_s']:.0f} / {fixed['sessions_per_s']:.0f}"
        rows.append(
            [
                f"{row['shape']}, {row['concurrency']} at once",
                fmt_ms(sized["p50_ms"]),
                fmt_ms(sized["p95_ms"]),
                fmt_ms(fixed["p50_ms"]),
                fmt_ms(fixed["p95_ms"]),
                fmt_ratio(row["ratio_p50"]),
                fmt_ratio(row["ratio_p95"]),
                f"{sized['hits']}/{sized['n']} vs {fixed['hits']}/{fixed['n']}",
                rate,
            ]
        )
    floor = result["floor"]
    rows.append(
        ["floor: a bare fork server fork", fmt_ms(floor["p50_ms"]), fmt_ms(floor["p95_ms"])] + [""] * 6
    )
    sized = result["sizes"]["sized"]
    print_table(
        console,
        "host session open, pools sized to the load against the fixed sizing (same run)",
        [
            "shape",
            "sized p50",
            "sized p95",
            "fixed p50",
            "fixed p95",
            "x p50",
            "x p95",
            "pool hits",
            "sessions/s",
        ],
        rows,
        note=(
            f"x: fixed over sized (above 1: sized opens faster). Sized: up to {sized['max_pool']} idle "
            f"per key, {sized['max_spawners']} spawners, on {sized['cores']} cores; load average at the "
            f"end {', '.join(f'{v:.1f}' for v in result['load'])}."
        ),
        left=(0, 7),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=lambda text: [int(v) for v in text.split(",")],
        default=list(CONCURRENCY),
        help="opens at a time, comma-separated (default 1,2,4,8)",
    )
    parser.add_argument("--rounds", type=int, default=10, help="bursts per concurrency (default 10)")
    parser.add_argument("--n", type=int, default=40, help="sessions per steady shape (default 40)")
    parser.add_argument(
        "--repeats", type=int, default=2, help="processes per variant, alternating (default 2)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/pools-<time>.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def execute(args: argparse.Namespace) -> int:
    """Run from parsed arguments; 2 for bad options."""
    console = make_console(args.json)
    if args.rounds < 1 or args.n < 1 or args.repeats < 1 or not args.concurrency or min(args.concurrency) < 1:
        console.print(
            "error: --rounds, --n, --repeats and every --concurrency must be at least 1",
            markup=False,
            highlight=False,
        )
        return 2
    if args.child:
        print(json.dumps(anyio.run(measure_here, args.concurrency, args.rounds, args.n, args.floor)))
        return 0
    result = measure(args.concurrency, args.rounds, args.n, args.repeats)
    publish("pools", result, args, console, report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.pools", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
