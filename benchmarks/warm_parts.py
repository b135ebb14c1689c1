"""Where a warm `print(1)` on a default `open_executor("host")` spends its time, beside smolagents.

    python -m benchmarks.warm_parts [--n 1000] [--json]

End to end (medians and p95, ms; measured in alternating blocks of `WARM_BLOCK`, so load that comes
and goes on a shared machine falls on every row alike):
- the default warm run, `measure_usage=False`, `track_artifacts=False`, and both off (the lean path);
- the default warm run with the channel's short poll off (`sandboxes.polling`): what the poll saves;
- smolagents' `LocalPythonExecutor` on the same snippet (its AST interpreter, which isolates nothing);
- the floor: one JSON line to a Python process over a socketpair and its JSON line back, read the way
  the executor reads a reply (`SocketLineReader` on anyio, its poll included): what any process
  boundary costs here.

Parts (microseconds, medians, in this same run): of the default run, the runner's time (as it
reports it) and the code's own; the usage probe's readings as the executor takes them (on the host,
the previous run's 'after' is this run's 'before': one reading a run); the working-directory
listing (`runtime/artifacts.py` on an empty directory, as the session's is: a scan and its diff, and
the one stat that stands in for them while the directory stays empty and quiet); the memory
reserve's map and unmap; the capture's restart, a write and its collect through the drain thread.
What is left of the run's wall time after the runner's time and the floor is the parent's side
(static check, the request, the reply's checks and the result's model).

The first run in a just-forked process (`--fresh N` sessions from the pool, each opened once the
pool refilled): its runner time and minor page faults (read from /proc), beside a second run of a
new source in the same session (so both compile): what a first run pays for being the first.
Nothing here is asserted: the ratio target (`TARGET_OVER_SMOLAGENTS`) is reported as met or not.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from sandboxes.runtime import RUNTIME_DIR

from .common import make_console, print_table, publish, ratio, script_main, summarize

SNIPPET = "print(1)"
WARM_BLOCK = 50
TARGET_OVER_SMOLAGENTS = 1.5
"""The default warm run's p50 over smolagents' interpreter's, at most (issue 31)."""
ECHO = (
    "import json, os, sys\n"
    "r = os.fdopen(0, 'rb')\n"
    "for line in r:\n"
    "    m = json.loads(line)\n"
    "    os.write(1, (json.dumps({'op': 'reply', 'stdout': '1\\n', 'run': m['run']}) + '\\n').encode())\n"
)
"""The floor's other end: read a JSON line, answer one (no capture, no guard, no readings)."""

EXECUTOR_ROWS: dict[str, dict[str, Any]] = {
    "warm run, default": {},
    "warm run, measure_usage=False": {"measure_usage": False},
    "warm run, track_artifacts=False": {"track_artifacts": False},
    "warm run, lean (both off)": {"measure_usage": False, "track_artifacts": False},
    "warm run, default, sleeping at once (no poll)": {},
}
SLEEPING_ROWS = {"warm run, default, sleeping at once (no poll)"}
"""Rows measured with the channel's short poll off (`sandboxes.polling`): what the poll saves."""


def _runtime(name: str) -> Any:
    """A runtime file as the runner loads it (`siblings.py`), for timing its parts in this process."""
    key = "_kodeagent_siblings"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(RUNTIME_DIR, "siblings.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key].load(name)


def _timed(function: Callable[[], Any], n: int) -> list[float]:
    for _ in range(20):
        function()
    found = []
    for _ in range(n):
        started = time.perf_counter()
        function()
        found.append(time.perf_counter() - started)
    return found


class _Trusted:
    """The reserve's `system`: nothing to lift here (no audit hook in this process)."""

    def trusted(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


def runner_part_samples(n: int) -> dict[str, list[float]]:
    """The runner's own per-run parts, timed in this process with the runner's code."""
    artifacts = _runtime("artifacts")
    limits = _runtime("limits")
    capture = _runtime("capture")
    found: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as root:
        found["working-directory scan + diff (empty directory)"] = _timed(
            lambda: artifacts.changed_files({}, artifacts.snapshot(root)), n
        )
        time.sleep(2 * artifacts.QUIET_NS / 1e9)
        stamp = artifacts.empty_stamp(root)
        if stamp is not None:  # a filesystem whose change times vouch for it (see artifacts.py)
            found["of it what a quiet empty directory costs (one stat)"] = _timed(
                lambda: artifacts.unchanged(root, stamp), n
            )
    reserve = limits.MemoryReserve(limits.RESERVE_BYTES, _Trusted())

    def map_and_unmap() -> None:
        reserve.take()
        reserve.release()

    found["memory reserve map + unmap (32 MiB; paid only after a run that took the limit)"] = _timed(
        map_and_unmap, n
    )
    targets = [os.open(os.devnull, os.O_WRONLY) for _ in range(2)]
    captures = (capture.Capture(targets[0], "stdout"), capture.Capture(targets[1], "stderr"))
    drain = capture.Drain(captures)

    def capture_cycle() -> None:
        drain.restart(64_000)
        os.write(targets[0], b"1\n")
        drain.collect()

    found["capture restart + write + collect (drain thread)"] = _timed(capture_cycle, n)
    return found


async def floor_samples(n: int) -> list[float]:
    """One JSON line each way to a Python process over a socketpair, read as the executor reads."""
    from sandboxes.worker import SocketLineReader

    ours, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", ECHO], stdin=theirs.fileno(), stdout=theirs.fileno()
    )
    theirs.close()
    reader = SocketLineReader(ours)
    found: list[float] = []
    try:
        for index in range(n + 20):
            started = time.perf_counter()
            await reader.send(json.dumps({"op": "run", "code": SNIPPET, "run": index}).encode() + b"\n")
            json.loads(await reader.receive_line())
            if index >= 20:
                found.append(time.perf_counter() - started)
    finally:
        ours.close()
        child.wait(timeout=10)
    return found


async def executor_samples(
    n: int, beside: Callable[[], float] | None
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Warm runs of every `EXECUTOR_ROWS` session and smolagents calls, in alternating blocks; and
    the default session's parts (runner, code, usage probe)."""
    from contextlib import AsyncExitStack

    from sandboxes import HostExecutor, polling
    from sandboxes.executor import USAGE_TIMEOUT, _stop_probe

    spare_cpu = polling.SPARE_CPU
    rows: dict[str, list[float]] = {name: [] for name in EXECUTOR_ROWS}
    if beside is not None:
        rows["smolagents LocalPythonExecutor (unisolated)"] = []
    parts: dict[str, list[float]] = {"runner's time (reported)": [], "of it the code's own (reported)": []}
    async with AsyncExitStack() as stack:
        executors = {
            name: await stack.enter_async_context(HostExecutor(timeout=10, **options))
            for name, options in EXECUTOR_ROWS.items()
        }
        default = executors["warm run, default"]
        for _ in range(30):
            for executor in executors.values():
                await executor.run(SNIPPET)
        while len(rows["warm run, default"]) < n:
            block = min(WARM_BLOCK, n - len(rows["warm run, default"]))
            for name, executor in executors.items():
                polling.SPARE_CPU = spare_cpu and name not in SLEEPING_ROWS
                for _ in range(block):
                    started = time.perf_counter()
                    result = await executor.run(SNIPPET)
                    rows[name].append(time.perf_counter() - started)
                    if result.stdout != "1\n":
                        raise RuntimeError(f"{name} printed {result.stdout!r} ({result.error})")
                    if executor is default:
                        session: Any = default.session
                        parts["runner's time (reported)"].append(session.runner_seconds or 0.0)
                        parts["of it the code's own (reported)"].append(session.exec_seconds or 0.0)
            polling.SPARE_CPU = spare_cpu
            if beside is not None:
                rows["smolagents LocalPythonExecutor (unisolated)"].extend(beside() for _ in range(block))
        session = default.session
        probe_times: list[float] = []
        for _ in range(min(n, 2000)):
            probe = session.usage_probe()
            started = time.perf_counter()
            if probe is not None:
                with anyio.move_on_after(USAGE_TIMEOUT):
                    await probe.start()
                await _stop_probe(probe)
            probe_times.append(time.perf_counter() - started)
        parts["usage readings (parent, as the executor takes them)"] = probe_times
    return rows, parts


PROGRAM = "def add(a, b):\n    return a + b\nassert add(2, 3) == 5\nprint(add(1, 2))"
"""A grader's program in miniature, for the first-run rows."""


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


async def first_run_samples(sessions: int) -> dict[str, list[float]]:
    """Of fresh sessions (the lean options, from the pool): the first run's runner time and minor
    faults, and a second run's (a new source, so it compiles too)."""
    from sandboxes import HostExecutor
    from sandboxes.backends.host import executor as host

    found: dict[str, list[float]] = {
        "first run: runner's time": [],
        "second run (new source): runner's time": [],
        "first run: minor page faults": [],
        "second run: minor page faults": [],
    }
    for index in range(sessions + 2):
        while host.refilling():
            await anyio.sleep(0.005)
        await anyio.sleep(0.05)
        async with HostExecutor(timeout=10, measure_usage=False, track_artifacts=False) as executor:
            session: Any = executor.session
            pid = session.worker.usage_probe().tree.pid
            faults = _minor_faults(pid)
            first = await executor.run(PROGRAM)
            first_seconds, middle = session.runner_seconds or 0.0, _minor_faults(pid)
            second = await executor.run(PROGRAM + "  # again")
            second_seconds, last = session.runner_seconds or 0.0, _minor_faults(pid)
        if first.stdout != "3\n" or second.stdout != "3\n":
            raise RuntimeError(f"the program printed {first.stdout!r} ({first.error})")
        if index >= 2:  # the first ones start the pools
            found["first run: runner's time"].append(first_seconds)
            found["second run (new source): runner's time"].append(second_seconds)
            found["first run: minor page faults"].append(middle - faults)
            found["second run: minor page faults"].append(last - middle)
    return found


def measure(n: int = 1000, fresh: int = 30) -> dict[str, Any]:
    from .latency import smolagents_interpreter

    missing: str | None = None
    try:
        beside: Callable[[], float] | None = smolagents_interpreter()
    except ImportError as exc:
        beside, missing = None, f"smolagents is not importable ({exc}): pip install -e '.[bench]'"
    rows, parts = anyio.run(executor_samples, n, beside)
    floor = anyio.run(floor_samples, n)
    parts.update(runner_part_samples(n))
    default = summarize(rows["warm run, default"])
    table: list[dict[str, Any]] = []
    for name, samples in rows.items():
        table.append({"name": name, **summarize(samples)})
    table.append({"name": "floor: a JSON line to a Python process and back", **summarize(floor)})
    smol = rows.get("smolagents LocalPythonExecutor (unisolated)")
    verdict: dict[str, Any] = {"smolagents_missing": missing}
    if smol:
        stats = summarize(smol)
        verdict.update(
            default_over_smolagents_p50=ratio(default["p50_ms"], stats["p50_ms"]),
            default_over_smolagents_p95=ratio(default["p95_ms"], stats["p95_ms"]),
            lean_over_smolagents_p50=ratio(
                summarize(rows["warm run, lean (both off)"])["p50_ms"], stats["p50_ms"]
            ),
            floor_over_smolagents_p50=ratio(summarize(floor)["p50_ms"], stats["p50_ms"]),
            target=TARGET_OVER_SMOLAGENTS,
        )
        verdict["meets_target"] = verdict["default_over_smolagents_p50"] <= TARGET_OVER_SMOLAGENTS
    part_rows = [{"part": name, "p50_us": summarize(s)["p50_ms"] * 1000} for name, s in parts.items()]
    runner_us = summarize(parts["runner's time (reported)"])["p50_ms"] * 1000
    floor_us = summarize(floor)["p50_ms"] * 1000
    part_rows.append(
        {
            "part": "parent's side and the rest (default p50 - runner - floor)",
            "p50_us": default["p50_ms"] * 1000 - runner_us - floor_us,
        }
    )
    first = anyio.run(first_run_samples, fresh) if fresh else {}
    first_rows = []
    for name, values in first.items():
        stats = summarize(values)  # `summarize` takes seconds: a count comes out x1000
        faults = "faults" in name
        first_rows.append(
            {
                "part": name,
                "p50": stats["p50_ms"] / 1000 if faults else stats["p50_ms"] * 1000,
                "unit": "faults" if faults else "us",
            }
        )
    return {
        "benchmark": "warm parts",
        "n": n,
        "rows": table,
        "parts": part_rows,
        "first_run": first_rows,
        **verdict,
    }


def report(console: Any, result: dict[str, Any]) -> None:
    print_table(
        console,
        "warm print(1) on host, beside smolagents (ms)",
        ["row", "p50", "p95"],
        [[r["name"], f"{r['p50_ms']:.3f}", f"{r['p95_ms']:.3f}"] for r in result["rows"]],
    )
    print_table(
        console,
        "parts of the default warm run (us, p50)",
        ["part", "p50"],
        [[p["part"], f"{p['p50_us']:.1f}"] for p in result["parts"]],
    )
    if result.get("first_run"):
        print_table(
            console,
            "the first run in a just-forked process (p50)",
            ["part", "p50", "unit"],
            [[p["part"], f"{p['p50']:.1f}", p["unit"]] for p in result["first_run"]],
        )
    if result.get("smolagents_missing"):
        console.print(f"smolagents not measured: {result['smolagents_missing']}", markup=False)
    else:
        console.print(
            f"default / smolagents p50 {result['default_over_smolagents_p50']:.2f}x "
            f"(p95 {result['default_over_smolagents_p95']:.2f}x), lean {result['lean_over_smolagents_p50']:.2f}x, "
            f"floor {result['floor_over_smolagents_p50']:.2f}x; target <= {result['target']}x: "
            f"{'met' if result['meets_target'] else 'not met'}",
            markup=False,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=1000, help="warm runs per row")
    parser.add_argument(
        "--fresh", type=int, default=30, help="fresh sessions for the first-run rows (0: none)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--output", default=None, help="where to write the result file")


def execute(args: Any) -> int:
    console = make_console(args.json)
    publish("warm_parts", measure(args.n, args.fresh), args, console, report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.warm_parts", add_arguments, execute, argv)


if __name__ == "__main__":
    raise SystemExit(main())
