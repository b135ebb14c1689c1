"""Grading at volume: many programs, a fresh session each, and a verdict nobody can misread.

Graders and RL trainers run one program per sample and read one bit of reward from it, so two
things matter more than anything else here:

- *What the program did* and *what the sandbox did* are two types, `Verdict` and `SandboxFailure`.
  A worker that crashed or a backend that could not open is never a failed program (training on it
  corrupts the reward), and a program that ended the process itself is never a pass: `sys.exit(0)`
  and `os._exit(0)` before the tests ran are `ProgramStatus.EXITED`, the reward hack a grader that
  reads only the exit code falls for.
- Volume: `grade_all` runs a fresh session per program, `concurrency` at a time, on the lean path
  (no usage readings, no artifact walks), and pulls its input only as fast as results are taken, so
  a generator of a million samples is never read into memory.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import re
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Mapping
from typing import Annotated, Any, Literal

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from .errors import SandboxError
from .models import ExecutionError, ExecutionResult
from .policy import Limits, Policy
from .runtime import values
from .runtime.protocol import WORKER_CRASHED

__all__ = [
    "Graded",
    "Grading",
    "Program",
    "ProgramStatus",
    "SandboxFailure",
    "Verdict",
    "grade",
    "grade_all",
    "grade_sync",
]

DEFAULT_GRADING_TIMEOUT = 10.0
"""Seconds a program may run when neither it nor its `Grading` says otherwise."""

MAX_FETCH_BYTES = 16 * 1024 * 1024
"""Largest file `Program.fetch_files` brings back (a bigger one is a `SandboxFailure`-free miss:
it is left out of `Verdict.files` and named in `Verdict.files_missing`)."""

_EXIT_CALL = re.compile(r"^the code called exit\((?P<code>.*)\); the session goes on$", re.S)
_EXIT_CODE = re.compile(r"\(exit code (?P<code>-?\d+)\)")
_KILLED = "(killed by "
_SITE_SETUP = """\
import builtins as _b, site as _s
_s.setquit(); _s.setcopyright(); _s.sethelper()
_d = __builtins__ if isinstance(__builtins__, dict) else __builtins__.__dict__
for _n in ("exit", "quit", "copyright", "credits", "license", "help"):
    _d[_n] = getattr(_b, _n)
del _b, _s, _d, _n"""
_SITE_NAMES = re.compile(r"\b(?:exit|quit|copyright|credits|license|help)\b")


class ProgramStatus(enum.StrEnum):
    """How a program ended. Only `PASSED` is a pass."""

    PASSED = "passed"
    """It ran to its end (or to `final_answer`) without an exception."""
    FAILED = "failed"
    """It raised an exception (its `Verdict.error` says which), a syntax error included."""
    TIMED_OUT = "timed_out"
    """It ran longer than its timeout and was killed."""
    OUT_OF_MEMORY = "out_of_memory"
    """It used up its memory limit."""
    EXITED = "exited"
    """It ended the process itself (`sys.exit`, `exit`, `os._exit`), whatever the code: the tests
    after that call never ran, so this is never a pass."""


class Program(BaseModel):
    """One program to grade, with its own settings (each overrides the batch's `Grading`).

    Attributes:
        code: the Python source, run as a script is (plain Python under the default policy).
        id: the caller's own label, handed back on its result (any JSON scalar).
        timeout: wall-clock seconds for the run; the batch's when None.
        limits: memory, CPU, processes, file size; the batch policy's when None.
        stdin: what the program reads from `sys.stdin` (`input()`); empty when None.
        files: files written into the working directory before the run (relative path: content).
        fetch_files: relative paths read back after the run, into `Verdict.files`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str
    id: str | int | None = None
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)
    limits: Limits | None = None
    stdin: str | None = None
    files: Mapping[str, bytes] = Field(default_factory=dict)
    fetch_files: tuple[str, ...] = ()


class Grading(BaseModel):
    """The batch's settings: where programs run and what they may do.

    Attributes:
        backend: "host", "docker", "e2b" or "ray".
        options: the backend's own options (`open_executor`'s), e.g. ``{"preload": [...]}``; the
            lean path (`measure_usage=False`, `track_artifacts=False`) unless they say otherwise.
        policy: what every program may do. Default: plain Python (`python_guards=False`), as
            `python file.py` runs it, held by the backend's isolation (a backend that cannot
            isolate unguarded code refuses, and every result is a `SandboxFailure` saying so).
        timeout: seconds per program when the program does not set its own.
        output_limit: characters kept of stdout and of stderr each (head and tail).
        concurrency: programs at a time in `grade_all` (default: this machine's CPUs).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    backend: str = "host"
    options: Mapping[str, Any] = Field(default_factory=dict)
    policy: Policy = Field(default_factory=lambda: Policy(python_guards=False))
    timeout: float = Field(DEFAULT_GRADING_TIMEOUT, gt=0, allow_inf_nan=False)
    output_limit: int = Field(64_000, ge=100)
    concurrency: int | None = Field(None, ge=1)

    @field_validator("options")
    @classmethod
    def _no_common_clash(cls, options: Mapping[str, Any]) -> Mapping[str, Any]:
        clash = {"policy", "timeout", "output_limit"} & set(options)
        if clash:
            raise ValueError(f"set {', '.join(sorted(clash))} on Grading (or Program), not in options")
        return options


class Verdict(BaseModel):
    """What the program did: it ran, and this is how it ended."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    kind: Literal["verdict"] = "verdict"
    id: str | int | None = None
    status: ProgramStatus
    return_code: int | None = Field(
        None,
        description="The exit status a `python file.py` would have had: 0 passed, 1 an exception, "
        "the code given to exit for EXITED; None for a timeout or a memory kill.",
    )
    stdout: str = ""
    stderr: str = ""
    error: ExecutionError | None = None
    answer: Any = Field(None, description="The value the program passed to `final_answer()`, if any.")
    has_answer: bool = False
    truncated: bool = Field(False, description="stdout or stderr was longer than the bound and was cut.")
    seconds: float = Field(0.0, description="Wall seconds from opening the session to the verdict.")
    open_seconds: float = Field(0.0, description="Of `seconds`, opening the session.")
    run_seconds: float = Field(0.0, description="Of `seconds`, the run itself (`ExecutionResult.duration`).")
    files: dict[str, bytes] = Field(default_factory=dict, description="The `fetch_files` that existed.")
    files_missing: list[str] = Field(default_factory=list, description="`fetch_files` not found or too big.")

    @property
    def passed(self) -> bool:
        """True only for `ProgramStatus.PASSED`."""
        return self.status is ProgramStatus.PASSED

    @field_serializer("answer", when_used="json")
    def _tagged(self, value: Any) -> Any:
        return values.encode(value)


class SandboxFailure(BaseModel):
    """The sandbox failed: the program has no verdict. Retry it, or drop the sample; never score it."""

    kind: Literal["sandbox_failure"] = "sandbox_failure"
    id: str | int | None = None
    message: str = Field(description="What went wrong and what to do about it.")
    error_type: str = Field(description="The exception class or error kind behind it.")
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Always False: there is nothing to pass."""
        return False


Graded = Annotated[Verdict | SandboxFailure, Field(discriminator="kind")]
"""One program's result: a `Verdict` or a `SandboxFailure` (tell them apart with `isinstance`)."""


# ------------------------------------------------------------------------------ one program


def _as_program(item: Program | str, index: int) -> Program:
    if isinstance(item, Program):
        return item
    if isinstance(item, str):
        return Program(code=item, id=index)
    raise TypeError(f"grade_all takes Program or str items, not {type(item).__name__} (item {index})")


def _exit_code(text: str) -> int:
    """`sys.exit(x)`'s process status from `repr(x)`: None 0, an int itself, anything else 1."""
    text = text.strip()
    if text in ("None", ""):
        return 0
    with contextlib.suppress(ValueError):
        return int(text)
    if text in ("True", "False"):
        return int(text == "True")
    return 1


def _judged(program: Program, result: ExecutionResult) -> Verdict | SandboxFailure:
    """The verdict of one run, or the sandbox failure it really was."""
    error = result.error
    code: int | None = 0
    status = ProgramStatus.PASSED
    if result.oom:
        status, code = ProgramStatus.OUT_OF_MEMORY, None
    elif result.timed_out:
        status, code = ProgramStatus.TIMED_OUT, None
    elif error is not None and error.type == "SystemExit":
        match = _EXIT_CALL.match(error.message)
        status, code = ProgramStatus.EXITED, _exit_code(match.group("code") if match else "1")
    elif error is not None and error.type == WORKER_CRASHED:
        if _KILLED in error.message or "sandbox was replaced" in error.message:
            # A signal or a broken channel: nothing says the program did it.
            return SandboxFailure(
                id=program.id,
                error_type=WORKER_CRASHED,
                message=f"{error.message}. The program has no verdict: retry it (a program that kills "
                "its own process by a signal also ends here, and fails again)",
            )
        exited = _EXIT_CODE.search(error.message)
        # The process ended by itself (`os._exit`): its status where the backend knows it.
        status, code = ProgramStatus.EXITED, int(exited.group("code")) if exited else None
    elif error is not None:
        status, code = ProgramStatus.FAILED, 1
    return Verdict(
        id=program.id,
        status=status,
        return_code=code,
        stdout=result.stdout,
        stderr=result.stderr,
        error=error,
        answer=result.final_answer if result.has_final_answer else None,
        has_answer=result.has_final_answer,
        truncated=bool(result.stdout_omitted or result.stderr_omitted),
        run_seconds=result.duration,
    )


def _executor_options(program: Program, grading: Grading) -> dict[str, Any]:
    policy = grading.policy
    if program.limits is not None:
        policy = policy.model_copy(update={"limits": program.limits})
    return {
        "measure_usage": False,
        "track_artifacts": False,
        **grading.options,
        "policy": policy,
        "timeout": program.timeout or grading.timeout,
        "output_limit": grading.output_limit,
    }


async def _fetch(executor: Any, program: Program, verdict: Verdict) -> None:
    for path in program.fetch_files:
        try:
            verdict.files[path] = await executor.download(path, max_bytes=MAX_FETCH_BYTES)
        except SandboxError:  # not there, not a regular file, too big: named, never fatal
            verdict.files_missing.append(path)


def _setup(program: Program, grading: Grading) -> str:
    """What runs before the program: its stdin, and the builtins `site` adds to `python file.py`
    (`exit`, `quit`, `copyright`, `credits`, `license`, `help`), which a session's interpreter
    (started without `site`) lacks; only for plain Python, and only when the code names one."""
    lines = []
    if not grading.policy.python_guards and _SITE_NAMES.search(program.code):
        lines.append(_SITE_SETUP)
    if program.stdin is not None:
        lines.append(
            f"import io as _io, sys as _sys\n_sys.stdin = _io.StringIO({program.stdin!r})\ndel _io, _sys"
        )
    return "\n".join(lines)


async def opened_and_judged(program: Program, grading: Grading) -> tuple[Any, Graded]:
    """Open a session, run the program, judge it; the executor (None when none is left open) is
    handed back still open so that the caller can hand its slot on, or answer, before the close
    (killing a worker is mostly waiting). For `grade_all` and `kodeagent serve`'s `/run_code`;
    not exported: `grade` is the public form."""
    from .backends import open_executor

    started = time.perf_counter()
    try:
        executor = open_executor(grading.backend, **_executor_options(program, grading))  # type: ignore[call-overload]
    except SandboxError as exc:
        return None, _failure(program, exc, started)
    try:
        await executor.open()
        opened = time.perf_counter()
        for path, data in program.files.items():
            await executor.upload(path, data)
        setup = _setup(program, grading)
        if setup:  # a run of its own, so that the program's line numbers stay its own
            done = await executor.run(setup)
            if done.error is not None:
                raise SandboxError(f"could not set up the program's stdin or builtins: {done.error.message}")
        result = await executor.run(program.code)
        graded = _judged(program, result)
        if isinstance(graded, Verdict):
            await _fetch(executor, program, graded)
            graded.open_seconds = opened - started
            graded.seconds = time.perf_counter() - started
        else:
            graded.seconds = time.perf_counter() - started
        return executor, graded
    except (SandboxError, OSError) as exc:
        with anyio.CancelScope(shield=True):
            await executor.close()
        return None, _failure(program, exc, started)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await executor.close()
        raise


def _failure(program: Program, exc: BaseException, started: float) -> SandboxFailure:
    message = str(exc).rstrip(".") or type(exc).__name__
    return SandboxFailure(
        id=program.id,
        error_type=type(exc).__name__,
        message=f"{message}. The program did not run to a verdict: fix the sandbox (the message says how) "
        "and retry it",
        seconds=time.perf_counter() - started,
    )


async def grade(program: Program | str, grading: Grading | None = None) -> Graded:
    """Run one program in a fresh session and judge it.

    Args:
        program: the program (a bare string is `Program(code=...)`).
        grading: the batch settings; `Grading()` when None.

    Returns:
        A `Verdict` (the program ran) or a `SandboxFailure` (it could not run to a verdict). Never
        raises for what the program or the sandbox did.
    """
    executor, graded = await opened_and_judged(_as_program(program, 0), grading or Grading())
    if executor is not None:
        await executor.close()
    return graded


# ------------------------------------------------------------------------------ a batch


async def _items(
    programs: Iterable[Program | str] | AsyncIterable[Program | str],
) -> AsyncIterator[Program | str]:
    if isinstance(programs, AsyncIterable):
        async for item in programs:
            yield item
    else:
        for item in programs:
            yield item


async def grade_all(
    programs: Iterable[Program | str] | AsyncIterable[Program | str],
    grading: Grading | None = None,
    *,
    concurrency: int | None = None,
    ordered: bool = True,
    lookahead: int | None = None,
) -> AsyncGenerator[Graded, None]:
    """Grade every program, each in a fresh session, `concurrency` at a time.

    Back-pressure: an item is taken from `programs` only when one of the `concurrency` slots is
    free and fewer than `concurrency + lookahead` results are waiting to be taken by you, so a
    generator is read about as fast as you read the results, never all ahead.

    Args:
        programs: `Program`s (or strings: their `id` is their index), sync or async iterable.
        grading: where and how they run; `Grading()` when None.
        concurrency: programs at a time; `grading.concurrency`, else this machine's CPUs.
        ordered: results in input order (True), or as they finish (False).
        lookahead: results that may wait for you past the running ones (default `concurrency`):
            room for a slow program at the head of an ordered batch not to stall the others.

    Yields:
        One `Verdict` or `SandboxFailure` per program. Break out early inside
        ``contextlib.aclosing(grade_all(...))`` so that the sessions still running are stopped at once.
    """
    grading = grading or Grading()
    width = concurrency or grading.concurrency or os.cpu_count() or 1
    if width < 1:
        raise ValueError(f"concurrency must be at least 1, got {width}")
    window = anyio.Semaphore(width + (width if lookahead is None else max(0, lookahead)))
    running = anyio.CapacityLimiter(width)
    send, receive = anyio.create_memory_object_stream[tuple[int, Graded | None]](math.inf)
    done: dict[int, Graded] = {}
    # The batch ends once every session is gone (on the host, close() returns before the reap):
    # what a batch costs includes its clean-up, and none is left behind it. One task waits for the
    # closed sessions in turn, so that most waits find the session already gone and cost nothing.
    closed_send, closed_receive = anyio.create_memory_object_stream[Any](4 * width)

    async def one(index: int, program: Program, closed: MemoryObjectSendStream[Any]) -> None:
        async with closed:
            async with running:
                executor, graded = await opened_and_judged(program, grading)
            await send.send((index, graded))
            if executor is not None:  # after the slot is handed on and the result is out
                await executor.close()
                await closed.send(executor)

    async def wait_closed() -> None:
        async with closed_receive:
            async for executor in closed_receive:
                await executor.wait_closed()

    async def feed(group: anyio.abc.TaskGroup) -> None:
        async with closed_send:
            index = 0
            async for item in _items(programs):
                program = _as_program(item, index)  # a bad item fails the batch here, before it runs
                await window.acquire()
                group.start_soon(one, index, program, closed_send.clone())
                index += 1
            total[0] = index
            await send.send((-1, None))  # the count is known now

    total = [-1]
    async with anyio.create_task_group() as group, receive:
        group.start_soon(wait_closed)
        group.start_soon(feed, group)
        following, received, ended = 0, 0, False
        while not ended or received < total[0]:
            index, graded = await receive.receive()
            if graded is None:
                ended = True
                continue
            received += 1
            done[index] = graded
            ready = [done.pop(index)] if not ordered else []
            while ordered and following in done:
                ready.append(done.pop(following))
                following += 1
            for graded in ready:
                window.release()
                try:
                    yield graded
                except GeneratorExit:
                    # The caller stopped reading: stop the sessions still running, and leave the
                    # task group without an exception (a GeneratorExit raised through it would
                    # come out wrapped in a group, which an async generator may not do).
                    group.cancel_scope.cancel()
                    return
        # Every result is out: the task group ends once the last sessions are closed and gone.


def grade_sync(
    programs: Iterable[Program | str],
    grading: Grading | None = None,
    *,
    concurrency: int | None = None,
    ordered: bool = True,
) -> list[Graded]:
    """`grade_all` from synchronous code: every result, as a list (for a stream, use `grade_all`)."""

    async def collect() -> list[Graded]:
        async with contextlib.aclosing(
            grade_all(programs, grading, concurrency=concurrency, ordered=ordered)
        ) as results:
            return [graded async for graded in results]

    return anyio.run(collect)
