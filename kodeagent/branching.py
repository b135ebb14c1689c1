"""Branching from one sandbox state: run n candidate code steps on n forks, keep one, close the rest.

An agent that samples several candidate steps (or backtracks after a bad one) needs each candidate to
start from the same live state: the variables, imports, loaded data and files that earlier steps
built. `Executor.fork()` copies that state in milliseconds on host (copy-on-write), so nothing is
replayed: no earlier step runs again, and none of its side effects (tool calls, writes) repeats.

    branch = await first_success(executor, [code_a, code_b, code_c])
    async with branch.executor:                # the kept fork: open, the caller's to close
        ...                                    # go on from the winner's state

- `first_success`: every candidate runs at once, each on its own fork; the first to succeed wins, the
  others are cancelled; `BranchError` if none succeeds.
- `best_of`: every candidate runs to the end; `rank` scores each (default: success), the best is kept.
  `observer_rank(observer)` scores them as an `Observer` sees them (a failing, looping or stalling
  step ranks below a clean one).
- `adopt_branch(run, branch)`: a CodeAct run goes on from the kept branch (its executor replaced, the
  candidate and its observation added to the conversation).

The parent executor is never changed: its session is only forked (it must be idle, as for any fork).
Every fork that is not kept is closed before these functions return or raise, so no branch is left
running; what each candidate's fork did (variables, files) is gone with it.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from .errors import KodeAgentError
from .models import StepRecord
from .observation import format_observation
from .observer import Observer

if TYPE_CHECKING:
    from sandboxes import ExecutionResult, Executor

    from .run import AgentRun

__all__ = ["Branch", "BranchError", "adopt_branch", "best_of", "first_success", "observer_rank"]

Rank = Callable[[str, "ExecutionResult"], float | Awaitable[float]]
"""Scores one candidate from its code and its result: higher is better."""


@dataclass
class Branch:
    """The candidate that was kept, and what every candidate's run gave.

    Attributes:
        index: which candidate (its position in the list given).
        code: that candidate's code.
        result: its run's result.
        executor: its fork, open and owned by the caller (close it, or use `async with`).
        results: every candidate's result in the order given; None for a run cancelled because
            another one won first.
        scores: `best_of`'s score of every candidate (empty for `first_success`).
    """

    index: int
    code: str
    result: ExecutionResult
    executor: Executor
    results: list[ExecutionResult | None] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)


class BranchError(KodeAgentError):
    """No candidate succeeded (`first_success`). Every fork is closed; the parent is unchanged.

    `results` holds each candidate's result, in the order given."""

    def __init__(self, message: str, results: list[ExecutionResult | None]) -> None:
        super().__init__(message)
        self.results = results


def _candidates(candidates: Sequence[str]) -> list[str]:
    if isinstance(candidates, str):
        raise TypeError("candidates must be a list of code strings, not one string")
    codes = list(candidates)
    if not codes:
        raise ValueError("candidates is empty: give at least one code string to run")
    for index, code in enumerate(codes):
        if not isinstance(code, str):
            raise TypeError(f"candidate {index} is a {type(code).__name__}, not a code string")
    return codes


async def _close(executors: Sequence[Executor]) -> None:
    """Close every fork, together; shielded, so a cancelled caller still leaves none running."""
    with anyio.CancelScope(shield=True):
        async with anyio.create_task_group() as group:
            for executor in executors:
                group.start_soon(executor.close)


async def _fork(executor: Executor, n: int) -> list[Executor]:
    """`n` forks of `executor`, one after another (a fork needs its parent idle). Forks are made
    before any candidate runs, never inside a cancel scope that a winner cancels: a fork cut short
    would cost the parent its session."""
    forks: list[Executor] = []
    try:
        for _ in range(n):
            forks.append(await executor.fork())
    except BaseException:
        await _close(forks)
        raise
    return forks


def _succeeded(result: ExecutionResult) -> bool:
    return result.ok


async def first_success(
    executor: Executor,
    candidates: Sequence[str],
    *,
    succeeded: Callable[[ExecutionResult], bool] = _succeeded,
) -> Branch:
    """Run each candidate on its own fork of `executor`, all at once; keep the first that succeeds.

    `succeeded` decides what counts (default: `result.ok`, no error and no timeout). The moment one
    succeeds the other runs are cancelled and their forks closed. Raises `BranchError` (with every
    result) when none succeeds, `ForkError`/`ExecutorBusy`/`ExecutorClosed` when `executor` cannot be
    forked; `TypeError`/`ValueError` for an empty or malformed list. What a run raises (it raises
    only for misuse, or a sandbox that cannot be restarted) ends the race and is raised as itself,
    every fork closed."""
    codes = _candidates(candidates)
    forks = await _fork(executor, len(codes))
    results: list[ExecutionResult | None] = [None] * len(codes)
    failure: list[Exception] = []
    winner: int | None = None
    try:
        async with anyio.create_task_group() as group:

            async def attempt(index: int) -> None:
                nonlocal winner
                try:
                    result = await forks[index].run(codes[index])
                    won = winner is None and succeeded(result)
                except Exception as exc:  # re-raised below as itself, not inside an exception group
                    failure.append(exc)
                    group.cancel_scope.cancel()
                    return
                results[index] = result
                if won:
                    winner = index
                    group.cancel_scope.cancel()

            for index in range(len(codes)):
                group.start_soon(attempt, index)
        if failure:
            raise failure[0]
    except BaseException:
        await _close(forks)
        raise
    if winner is None:
        await _close(forks)
        failures = "; ".join(
            f"{i}: {r.error or ('timed out' if r.timed_out else 'not a success')}"
            for i, r in enumerate(results)
            if r is not None
        )
        raise BranchError(f"none of the {len(codes)} candidates succeeded ({failures})", results)
    await _close([fork for index, fork in enumerate(forks) if index != winner])
    kept = results[winner]
    assert kept is not None  # set before `winner`
    return Branch(winner, codes[winner], kept, forks[winner], results)


def _default_rank(code: str, result: ExecutionResult) -> float:
    return 1.0 if result.ok else 0.0


async def best_of(executor: Executor, candidates: Sequence[str], *, rank: Rank = _default_rank) -> Branch:
    """Run every candidate to its end, each on its own fork of `executor`; keep the best ranked.

    `rank(code, result)` (sync or async) scores a candidate, higher is better (default: 1 for a
    success, 0 otherwise; ties go to the earlier candidate; a NaN score ranks last). The best is kept
    even when it failed: look at `branch.result`. The other forks are closed; so are all of them if
    a run or the ranking raises (raised as itself)."""
    codes = _candidates(candidates)
    forks = await _fork(executor, len(codes))
    results: list[ExecutionResult | None] = [None] * len(codes)
    failure: list[Exception] = []
    try:
        async with anyio.create_task_group() as group:

            async def attempt(index: int) -> None:
                try:
                    results[index] = await forks[index].run(codes[index])
                except Exception as exc:  # re-raised below as itself, not inside an exception group
                    failure.append(exc)
                    group.cancel_scope.cancel()

            for index in range(len(codes)):
                group.start_soon(attempt, index)
        if failure:
            raise failure[0]
        scores: list[float] = []
        for code, result in zip(codes, results, strict=True):
            assert result is not None  # every run finished: the group waited for them all
            score = rank(code, result)
            if inspect.isawaitable(score):
                score = await score
            scores.append(float(score))
    except BaseException:
        await _close(forks)
        raise
    ordered = [-math.inf if math.isnan(s) else s for s in scores]
    best = max(range(len(codes)), key=lambda i: (ordered[i], -i))
    await _close([fork for index, fork in enumerate(forks) if index != best])
    kept = results[best]
    assert kept is not None
    return Branch(best, codes[best], kept, forks[best], results, scores)


def observer_rank(observer: Observer, *, steps_left: int | None = None, limit: int = 8000) -> Rank:
    """A `best_of` rank that asks `observer` about each candidate as the run's next step.

    Each candidate is shown to a copy of `observer` (so it is judged against the steps the run has
    already taken, and the run's own observer is not changed): 2 for a success the observer has no
    note on, 1 for a success it notes (a repeated action, a stall: output already seen), 0 for a
    failure. `steps_left` is passed on (default: enough that no "few steps left" reminder fires)."""

    def rank(code: str, result: ExecutionResult) -> float:
        watcher = copy.deepcopy(observer)
        record = StepRecord(
            index=0,  # the observer reads what a step did, not its number
            code=code,
            observation=format_observation(result, limit=limit),
            error=None if result.ok else str(result.error or "the code did not finish"),
        )
        left = steps_left if steps_left is not None else watcher.warn_remaining + 1
        note = watcher.observe(record, left)
        if not result.ok:
            return 0.0
        return 1.0 if note else 2.0

    return rank


async def adopt_branch(run: AgentRun, branch: Branch, *, limit: int = 8000) -> None:
    """Let a CodeAct run go on from `branch`: its executor becomes the run's (closed with the run),
    the run's previous executor is closed, and the conversation is told which candidate ran and
    what it printed, so the model's next step builds on it. Call it between steps (from `on_step`)."""
    previous, run.executor = run.executor, branch.executor
    if previous is not None and previous is not branch.executor:
        with anyio.CancelScope(shield=True):
            await previous.close()
    observation = format_observation(branch.result, limit=limit)
    run.add_to_history(
        {
            "role": "user",
            "content": (
                f"Candidate {branch.index + 1} of {len(branch.results)} ran on a copy of the session "
                f"and was kept (the others were discarded, with whatever they changed):\n"
                f"```python\n{branch.code}\n```\nObservation:\n{observation}"
            ),
        }
    )
