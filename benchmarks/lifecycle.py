"""A fresh session's parts, timed one way for every benchmark (`bench humaneval`, `bench latency`).

A session opened for one program pays for: taking a started worker (the pool take), the runner's
answer to `init` (the handshake), the `run()` call — of it the part under the executor's lock
(`ExecutionResult.duration`: the static check, the usage probe, the request, the runner's time on
it and of that the code's own, as the runner reports them, the reply) — and `close()`. Timing
them the same way everywhere is what lets a change to one part be read in every table; CPU
(`ExecutionResult.usage`) is kept beside the wall time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio

from .common import summarize


@dataclass
class SessionParts:
    """Seconds of one session's parts (None: not measured, e.g. a reused session has no open)."""

    open_seconds: float | None = None
    handshake_seconds: float | None = None
    """Of `open_seconds`, the runner's answer to `init` (`RunnerSession.handshake_seconds`: 0 for a
    host session whose worker the pool initialised ahead)."""
    run_call_seconds: float | None = None
    """The parent's `run()` call: the locked run plus waiting for the lock and building the result."""
    run_seconds: float | None = None
    """Of the run() call, the run under the executor's lock (`ExecutionResult.duration`)."""
    runner_seconds: float | None = None
    """Of the locked run, the runner's time on the run request as the runner reports it
    (`RunnerSession.runner_seconds`); the rest is the protocol and the parent's work: the static
    check, the usage probe, sending the request, reading and checking the reply. None where the
    backend's runner does not report it."""
    exec_seconds: float | None = None
    """Of the runner's time, the code's own (`RunnerSession.exec_seconds`; under `bench humaneval`'s
    harness semantics the code is the driver, so this is the driver's work); the rest is the
    runner's: compiling, the capture, the file snapshot."""
    cpu_seconds: float | None = None
    """CPU seconds of the run and all it started, measured by the sandbox (`ExecutionResult.usage`)."""
    close_seconds: float | None = None

    @property
    def pool_take_seconds(self) -> float | None:
        """Of `open_seconds`, all but the handshake: taking (or starting) a worker."""
        if self.open_seconds is None or self.handshake_seconds is None:
            return None
        return max(0.0, self.open_seconds - self.handshake_seconds)

    @classmethod
    def of_result(cls, result: Any, session: Any = None) -> SessionParts:
        """The parts a run's result (and its session, if still known) tell: locked run, exec, CPU."""
        usage = getattr(result, "usage", None)
        return cls(
            run_seconds=result.duration,
            runner_seconds=getattr(session, "runner_seconds", None),
            exec_seconds=getattr(session, "exec_seconds", None),
            cpu_seconds=usage.cpu_seconds if usage is not None else None,
        )


PARTS: tuple[tuple[str, str, str], ...] = (
    ("session_open", "open_seconds", "open()"),
    ("pool_take", "pool_take_seconds", "  of it the pool take"),
    ("handshake", "handshake_seconds", "  of it the handshake"),
    ("run_call", "run_call_seconds", "run() call"),
    ("per_program_run_only", "run_seconds", "  of it the locked run"),
    ("runner_time", "runner_seconds", "    of it in the runner"),
    ("runner_exec", "exec_seconds", "      of it the code itself"),
    ("session_close", "close_seconds", "close()"),
    ("per_program_cpu", "cpu_seconds", "CPU of the run"),
)
"""(result key, `SessionParts` attribute, label) of every part, in the order tables show them."""


async def open_and_run(executor: Any, code: str) -> tuple[Any, SessionParts]:
    """Open `executor` (unopened), run `code` once: the result and the parts so far (no close yet,
    so that a caller can hand its slot on before closing). On failure the executor is closed."""
    started = time.perf_counter()
    try:
        await executor.open()
        opened_at = time.perf_counter()
        handshake = getattr(executor.session, "handshake_seconds", None)
        result = await executor.run(code)
        ran_at = time.perf_counter()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await executor.close()
        raise
    parts = SessionParts.of_result(result, executor.session)
    parts.open_seconds, parts.handshake_seconds = opened_at - started, handshake
    parts.run_call_seconds = ran_at - opened_at
    return result, parts


async def close_timed(executor: Any, parts: SessionParts) -> None:
    """`executor.close()`, its seconds recorded in `parts` (the reap may go on after it returns)."""
    started = time.perf_counter()
    await executor.close()
    parts.close_seconds = time.perf_counter() - started


def summarize_parts(parts: Iterable[SessionParts]) -> dict[str, dict[str, float | int]]:
    """`summarize` of every part measured at least once, keyed as in `PARTS`."""
    collected = list(parts)
    summary = {}
    for key, attribute, _ in PARTS:
        values = [v for p in collected if (v := getattr(p, attribute)) is not None]
        if values:
            summary[key] = summarize(values)
    return summary


def parts_rows(
    benchmark: str, parts: Iterable[SessionParts], skip: Iterable[str] = ("session_open",)
) -> list[dict[str, Any]]:
    """One row per part of fresh sessions (`PARTS` but `skip`: by default open(), which the latency
    tables already have as "session from the pool"), named ``fresh session: <part>``."""
    summary = summarize_parts(parts)
    skipped = set(skip)
    return [
        {"benchmark": benchmark, "name": f"fresh session: {label.strip()}", "part": key, **summary[key]}
        for key, _, label in PARTS
        if key in summary and key not in skipped
    ]
