"""`sandboxes.grading` on real host sessions: what a program did is a `Verdict`, what the sandbox
did a `SandboxFailure`; a program that ends its own process is never a pass; results come in order
or as they finish; the input is pulled only as fast as results are taken; and on HumanEval programs
the verdicts are the ones `bench humaneval`'s harness path gives."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import TypeAdapter, ValidationError

from sandboxes import Limits, Policy
from sandboxes.grading import (
    Graded,
    Grading,
    Program,
    ProgramStatus,
    SandboxFailure,
    Verdict,
    grade,
    grade_all,
    grade_sync,
)

pytestmark = pytest.mark.anyio


def _verdict(graded: Graded) -> Verdict:
    assert isinstance(graded, Verdict), graded
    return graded


async def test_a_pass_is_passed_with_its_output() -> None:
    verdict = _verdict(
        await grade(Program(id="p", code="print('hi')\nprint('err', file=__import__('sys').stderr)"))
    )
    assert verdict.status is ProgramStatus.PASSED and verdict.passed and verdict.return_code == 0
    assert (verdict.id, verdict.stdout, verdict.stderr) == ("p", "hi\n", "err\n")
    assert 0 < verdict.run_seconds <= verdict.seconds and verdict.open_seconds <= verdict.seconds


async def test_an_exception_fails_with_its_error() -> None:
    verdict = _verdict(await grade("print('before')\nraise ValueError('boom')"))
    assert verdict.status is ProgramStatus.FAILED and not verdict.passed and verdict.return_code == 1
    assert verdict.error is not None and verdict.error.type == "ValueError" and verdict.error.line == 2
    assert verdict.stdout == "before\n"


def test_the_builtins_site_adds_are_there_as_in_python_file_py() -> None:
    # A session's interpreter starts without `site`; `python file.py` has its builtins.
    [verdict] = grade_sync(["print(type(copyright).__name__, type(exit).__name__, type(help).__name__)"])
    assert _verdict(verdict).passed and verdict.stdout == "_Printer Quitter _Helper\n"


async def test_a_syntax_error_fails() -> None:
    verdict = _verdict(await grade("def broken(:\n"))
    assert verdict.status is ProgramStatus.FAILED and verdict.error is not None


async def test_a_loop_times_out_at_its_own_timeout() -> None:
    started = time.perf_counter()
    verdict = _verdict(await grade(Program(code="while True:\n    pass\n", timeout=1.0), Grading(timeout=60)))
    assert verdict.status is ProgramStatus.TIMED_OUT and verdict.return_code is None and not verdict.passed
    assert time.perf_counter() - started < 50  # its own 1 s, not the batch's 60 s (generous under load)


@pytest.mark.parametrize(
    "call, code",
    [
        ("sys.exit(0)", 0),
        ("raise SystemExit", 0),
        ("exit()", 0),
        ("quit(5)", 5),
        ("sys.exit(4)", 4),
        ("sys.exit('no')", 1),
    ],
)
async def test_exit_is_exited_never_a_pass(call: str, code: int) -> None:
    # The reward hack: end the process before the asserts after it run. A grader that reads only
    # the exit status sees 0 and a pass.
    program = f"import sys\nprint('so far')\n{call}\nassert False, 'the tests'\n"
    verdict = _verdict(await grade(program))
    assert verdict.status is ProgramStatus.EXITED and not verdict.passed
    assert verdict.return_code == code and verdict.stdout == "so far\n"


@pytest.mark.parametrize("status", [0, 3])
async def test_os_exit_is_exited_never_a_pass(status: int) -> None:
    verdict = _verdict(await grade(f"import os\nos._exit({status})\nassert False\n"))
    assert verdict.status is ProgramStatus.EXITED and not verdict.passed
    # the host's pooled workers are reaped where their status is not read: then it is None
    assert verdict.return_code in (status, None)


async def test_a_huge_output_is_bounded_and_still_judged() -> None:
    grading = Grading(output_limit=10_000)
    verdict = _verdict(await grade("import sys\nsys.stdout.write('x' * 50_000_000)\nprint('end')\n", grading))
    assert verdict.status is ProgramStatus.PASSED and verdict.truncated
    assert len(verdict.stdout) < 11_000 and verdict.stdout.endswith("end\n")


async def test_out_of_memory_is_its_own_status() -> None:
    program = Program(code="x = bytearray(2_000_000_000)\n", limits=Limits(memory_mb=512))
    verdict = _verdict(await grade(program))
    assert verdict.status is ProgramStatus.OUT_OF_MEMORY and not verdict.passed


async def test_stdin_files_and_fetch_files() -> None:
    program = Program(
        code="name = input()\nopen('out.txt', 'w').write(open('in.txt').read() + name)\n",
        stdin="world\n",
        files={"in.txt": b"hello "},
        fetch_files=("out.txt", "missing.txt"),
    )
    verdict = _verdict(await grade(program))
    assert verdict.passed and verdict.files == {"out.txt": b"hello world"}
    assert verdict.files_missing == ["missing.txt"]


async def test_a_backend_that_cannot_open_is_a_sandbox_failure_for_every_program() -> None:
    # E2B without a key refuses to open: that is the sandbox, not the programs.
    grading = Grading(backend="e2b", options={"api_key": ""})
    results = [g async for g in grade_all([Program(id=i, code="print(1)") for i in range(3)], grading)]
    assert [type(g) for g in results] == [SandboxFailure] * 3 and [g.id for g in results] == [0, 1, 2]
    assert all(not g.passed and "E2B" in g.message and "retry" in g.message for g in results)


async def test_a_policy_the_backend_refuses_is_a_sandbox_failure() -> None:
    # Plain Python (the default policy) needs an isolation boundary; the bare `process` level has
    # none, so the host backend refuses to open: the sandbox's answer, and not the program's.
    grading = Grading(options={"isolation": "process"})
    graded = await grade("print('ran')", grading)
    assert isinstance(graded, SandboxFailure) and not graded.passed
    assert graded.error_type == "BackendUnavailable" and "retry" in graded.message


async def test_a_worker_killed_from_outside_is_a_sandbox_failure(tmp_path: Path) -> None:
    # The `process` level's workers are this process's children, so their end by a signal is read
    # back. The program writes its pid and sleeps; this test kills it from outside mid-run.
    tmp_path.chmod(0o777)
    grading = Grading(
        options={"isolation": "process", "workdir": str(tmp_path)},
        policy=Policy(allowed_imports=("os", "time")),
    )
    code = "import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(120)\nprint('survived')\n"
    killed: list[int] = []

    async def kill_it() -> None:
        with anyio.fail_after(100):
            while not ((tmp_path / "pid").exists() and (tmp_path / "pid").read_text()):
                await anyio.sleep(0.05)
        killed.append(int((tmp_path / "pid").read_text()))
        os.kill(killed[0], signal.SIGKILL)

    async with anyio.create_task_group() as group:
        group.start_soon(kill_it)
        graded = await grade(Program(code=code, timeout=150), grading)
    assert killed and isinstance(graded, SandboxFailure) and not graded.passed
    assert graded.error_type == "WorkerCrashed" and "SIGKILL" in graded.message and "retry" in graded.message


def test_the_two_types_cannot_be_confused() -> None:
    adapter: TypeAdapter[Graded] = TypeAdapter(Graded)
    verdict = Verdict(id=1, status=ProgramStatus.FAILED, return_code=1)
    failure = SandboxFailure(id=1, message="m", error_type="WorkerCrashed")
    assert isinstance(adapter.validate_json(verdict.model_dump_json()), Verdict)
    assert isinstance(adapter.validate_json(failure.model_dump_json()), SandboxFailure)
    with pytest.raises(ValidationError):  # a failure's fields cannot pass as a verdict
        Verdict.model_validate(failure.model_dump())
    assert not failure.passed


def test_program_and_grading_are_validated() -> None:
    with pytest.raises(ValidationError):
        Program(code="1", timeout=-1)
    with pytest.raises(ValidationError):
        Program(code="1", surprise=True)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="on Grading"):
        Grading(options={"timeout": 3})


# ------------------------------------------------------------------------------ batches


def _sleepers(delays: list[float]) -> list[Program]:
    return [Program(id=i, code=f"import time\ntime.sleep({d})\nprint({i})") for i, d in enumerate(delays)]


async def test_results_in_input_order() -> None:
    delays = [1.5, 0.0, 0.0, 0.0, 0.5, 0.0]
    results = [g async for g in grade_all(_sleepers(delays), concurrency=3)]
    assert [_verdict(g).id for g in results] == list(range(len(delays)))
    assert [g.stdout for g in results] == [f"{i}\n" for i in range(len(delays))]


async def test_results_as_they_finish() -> None:
    delays = [4.0, 0.0, 0.0, 0.0]
    results = [g async for g in grade_all(_sleepers(delays), concurrency=4, ordered=False)]
    ids = [_verdict(g).id for g in results]
    assert sorted(ids) == [0, 1, 2, 3] and ids[-1] == 0  # the slow one is not waited for


async def test_a_generator_is_not_read_ahead() -> None:
    concurrency, taken = 2, []

    def programs() -> Iterator[Program]:
        for i in range(40):
            taken.append(i)
            yield Program(id=i, code="pass")

    seen = 0
    async with contextlib.aclosing(grade_all(programs(), concurrency=concurrency)) as results:
        async for _ in results:
            seen += 1
            # at most the running ones and the lookahead (default: `concurrency`) past what was taken
            assert len(taken) <= seen + 2 * concurrency + 1, (len(taken), seen)
            if seen == 6:
                await anyio.sleep(1.0)  # a slow consumer: the input must wait for it
                assert len(taken) <= seen + 2 * concurrency + 1
            if seen == 10:
                break
    assert len(taken) <= 10 + 2 * concurrency + 1


async def test_strings_get_their_index_as_id_and_an_async_input_works() -> None:
    async def programs() -> Any:
        for code in ("print(1)", "raise KeyError(2)"):
            yield code

    results = [g async for g in grade_all(programs(), concurrency=2)]
    assert [(_verdict(g).id, g.status) for g in results] == [
        (0, ProgramStatus.PASSED),
        (1, ProgramStatus.FAILED),
    ]


async def test_a_batch_ends_with_every_session_gone() -> None:
    """The clean-up is part of the batch: once its last result is taken, no session's working
    directory is left and (as root) no session still holds its private user."""
    from sandboxes.backends.host.executor import pooled_workers
    from sandboxes.backends.host.process import PRIVATE_USERS

    code = "import os\nprint(os.getcwd(), os.getuid())"
    results = [g async for g in grade_all([code] * 6, concurrency=2)]
    places = [_verdict(g).stdout.split() for g in results]
    assert len(places) == 6 and all(len(p) == 2 for p in places), places
    for directory, _uid in places:
        assert not os.path.exists(directory), directory
    if os.getuid() == 0:
        pooled = {w.uid for w in pooled_workers()}
        for _directory, uid in places:
            assert not PRIVATE_USERS.held(int(uid)) or int(uid) in pooled, uid


async def test_an_empty_batch() -> None:
    assert [g async for g in grade_all([])] == []


def test_grade_sync() -> None:
    results = grade_sync(["print(1)", "import sys; sys.exit(0)"], concurrency=2)
    assert [_verdict(g).status for g in results] == [ProgramStatus.PASSED, ProgramStatus.EXITED]


# ------------------------------------------------------------------------------ HumanEval


def test_humaneval_verdicts_match_the_benchmarks_harness_path() -> None:
    """The same programs through `grade_all` (plain Python, a fresh session each) and through `bench
    humaneval`'s harness path: the same category for each, passes and fails alike."""
    from benchmarks import humaneval

    problems = humaneval.load_problems()
    jobs = humaneval.canonical_jobs(problems, limit=4)
    jobs += [humaneval.Job(j.task_id, 1, j.problem, "    return None\n") for j in jobs[:2]]
    jobs += [humaneval.Job(jobs[0].task_id, 2, jobs[0].problem, "    import sys\n    sys.exit(0)\n")]
    bench = anyio.run(humaneval.run_sandbox, jobs, "host", 2, 3.0, lambda n: None, (), None, False, "harness")
    graded = grade_sync(
        [Program(id=i, code=j.program, timeout=3.0) for i, j in enumerate(jobs)], concurrency=2
    )
    ours = ["passed" if _verdict(g).passed else "failed" for g in graded]
    assert ours == [humaneval.category(o.result) for o in bench]
    assert ours == ["passed"] * 4 + ["failed"] * 3
