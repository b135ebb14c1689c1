"""The fast tier: every branch of the executor's side of the runner protocol, against a scripted
`Worker` (no process, no container) behind the one `RunnerSession` every runner-based backend uses.

Run alone with ``python -m pytest tests/unit`` (seconds). What the runner and the backends really do
is the integration tier's job (the rest of `tests/`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.wire_helpers import RUN_FIELDS

from sandboxes import BackendUnavailable, ExecutorClosed, Policy
from sandboxes.errors import ProtocolError, SandboxFileError, WorkerStartError
from sandboxes.executor import Executor, ExecutorState
from sandboxes.runtime.bounds import TOOL_MESSAGE_LIMIT, line_limit, result_size_limit
from sandboxes.session import Session
from sandboxes.worker import Worker, WorkerExit, WorkerExited

pytestmark = pytest.mark.anyio

TOKEN = "0123456789abcdef" * 2
Script = Callable[[dict[str, Any]], list[Any]]
HANG = object()


def reply(**fields: Any) -> dict[str, Any]:
    return {"token": TOKEN, "op": "reply", **fields}


def run_reply(**fields: Any) -> dict[str, Any]:
    return reply(**{**RUN_FIELDS, **fields})


def ack(message: dict[str, Any]) -> dict[str, Any]:
    """The answer to a request other than `run`: `init`'s names the runner's pid and uid."""
    return reply(pid=2, uid=1000) if message["op"] == "init" else reply()


def runner_like(message: dict[str, Any]) -> list[Any]:
    """A well-behaved runner: init and reset answer; `run` prints the code back."""
    if message["op"] == "run":
        return [run_reply(stdout=message["code"] + "\n")]
    return [ack(message)]


class ScriptedWorker(Worker):
    """Answers each request with what `script` returns for it: messages (dicts, sent as JSON lines),
    raw `bytes` lines, exceptions to raise from `receive_line`, or `HANG` (never answers)."""

    def __init__(
        self, script: Script, isolation: str = "namespaces", exit_info: WorkerExit | None = None
    ) -> None:
        self.script = script
        self.isolation = isolation
        self.sent: list[dict[str, Any]] = []
        self.killed = False
        self.files: dict[str, bytes] = {}
        self.file_trouble: BaseException | object | None = None
        """Raised by (or, `HANG`, hangs) the next file operation."""
        self.living = True
        self._exit = exit_info or WorkerExit(detail="exit code 1")
        self._send, self._receive = anyio.create_memory_object_stream[Any](math.inf)

    async def send(self, data: bytes) -> None:
        if self.killed:
            raise WorkerExited("killed")
        assert data.endswith(b"\n") and data.count(b"\n") == 1, "one protocol line per send"
        message = json.loads(data)
        self.sent.append(message)
        for item in self.script(message):
            self._send.send_nowait(item)

    async def receive_line(self) -> bytes:
        item = await self._receive.receive()
        if item is HANG:
            await anyio.sleep_forever()
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, bytes):
            return item
        if "token" in item:  # the runner writes its token first
            item = {"token": item["token"], **item}
        return json.dumps(item).encode() + b"\n"

    async def alive(self) -> bool:
        return self.living and not self.killed

    async def kill(self) -> None:
        self.killed = True

    async def exit_info(self) -> WorkerExit:
        return self._exit

    async def _file_trouble(self) -> None:
        trouble, self.file_trouble = self.file_trouble, None
        if trouble is HANG:
            await anyio.sleep_forever()
        if isinstance(trouble, BaseException):
            raise trouble

    async def write_file(self, path: str, data: bytes) -> None:
        await self._file_trouble()
        self.files[path] = data

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        await self._file_trouble()
        return self.files[path]


class ScriptedExecutor(Executor):
    """An executor whose workers are `ScriptedWorker`s made by `factory`, one per (re)start."""

    backend = "scripted"

    def __init__(self, factory: Callable[[], ScriptedWorker], **options: Any) -> None:
        super().__init__(**options)
        self.factory = factory
        self.workers: list[ScriptedWorker] = []

    async def _new_session(self) -> Session:
        worker = self.factory()
        self.workers.append(worker)
        return await self._runner_session(worker)


def executor(script: Script = runner_like, **options: Any) -> ScriptedExecutor:
    return ScriptedExecutor(lambda: ScriptedWorker(script), **options)


# ------------------------------------------------------------------------------------------------ lifecycle


async def test_open_sends_init_with_the_policy_and_learns_the_token() -> None:
    ex = executor(env={"A": "1"}, tools={"lookup": lambda: 1}, stateless=True, output_limit=500)
    async with ex:
        (worker,) = ex.workers
        init = worker.sent[0]
        assert init["op"] == "init" and init["env"] == {"A": "1"} and init["tools"] == ["lookup"]
        assert init["stateless"] is True and init["output_limit"] == 500
        assert init["policy"]["python_guards"] is True
        assert worker.channel_token == TOKEN
        assert worker.line_limit == line_limit(500)
    assert worker.killed


async def test_a_fatal_reply_at_init_is_a_start_error_and_the_worker_is_killed() -> None:
    ex = executor(lambda m: [{"op": "fatal", "token": TOKEN, "message": "no RestrictedPython"}])
    with pytest.raises(WorkerStartError, match="no RestrictedPython"):
        await ex.open()
    assert ex.workers[0].killed


async def test_a_fatal_reply_during_a_run_is_a_lost_session_not_an_exception() -> None:
    def script(message: dict[str, Any]) -> list[Any]:
        if message["op"] == "run" and message["code"] == "bad":
            return [{"token": TOKEN, "op": "fatal", "message": "given up"}]
        return runner_like(message)

    async with executor(script) as ex:
        result = await ex.run("bad")
        after = await ex.run("good")
    assert result.error is not None and result.error.type == "WorkerCrashed" and result.state_lost
    assert "the runner gave up: given up" in result.error.message
    assert after.ok and after.stdout == "good\n" and len(ex.workers) == 2


async def test_a_failing_stream_raises_its_own_error_and_so_does_the_block() -> None:
    """`stream()` runs the code in a task group: what fails in it, or in the caller's block, comes out
    as itself, never wrapped in an exception group."""
    starts: list[dict[str, Any]] = []

    def fatal_after_the_first(message: dict[str, Any]) -> list[Any]:
        if message["op"] == "init":
            starts.append(message)
            if len(starts) > 1:
                return [{"token": TOKEN, "op": "fatal", "message": "cannot start again"}]
        return runner_like(message)

    async with executor(fatal_after_the_first) as ex:
        ex.workers[0].living = False  # died while idle: the stream's run must start a new one
        with pytest.raises(WorkerStartError, match="cannot start again"):
            async with ex.stream("x") as events:
                async for _ in events:
                    pass
    async with executor() as ex:
        with pytest.raises(KeyError, match="the caller's"):
            async with ex.stream("x") as events:
                raise KeyError("the caller's")
        assert (await ex.run("next")).ok


async def test_unguarded_code_is_refused_at_the_bare_process_level_before_init() -> None:
    ex = ScriptedExecutor(
        lambda: ScriptedWorker(runner_like, isolation="process"), policy=Policy(python_guards=False)
    )
    with pytest.raises(BackendUnavailable, match="bubblewrap"):
        await ex.open()
    assert ex.workers[0].killed and ex.workers[0].sent == []


async def test_use_before_open_and_after_close_is_refused() -> None:
    ex = executor()
    with pytest.raises(ExecutorClosed):
        await ex.run("x")
    await ex.open()
    await ex.close()
    await ex.close()  # twice is fine
    with pytest.raises(ExecutorClosed):
        await ex.run("x")


async def test_unknown_and_invalid_options_are_refused() -> None:
    with pytest.raises(TypeError, match="unknown options: colour"):
        executor(colour="red")
    with pytest.raises(ValueError, match="timeout"):
        executor(timeout=0)
    with pytest.raises(ValueError, match="output_limit"):
        executor(output_limit=10)
    with pytest.raises(ValueError, match="identifier"):
        executor(tools={"not a name": print})


# ------------------------------------------------------------------------------------------------ runs


async def test_a_run_returns_the_reply_as_a_result() -> None:
    async with executor() as ex:
        result = await ex.run("print(1)")
    assert result.ok and result.stdout == "print(1)\n" and result.backend == "scripted"
    assert result.duration > 0 and not result.state_lost


@pytest.mark.parametrize(
    ("reported", "read"),
    [
        ((0.25, 0.5), (0.25, 0.5)),
        ((0, 1), (0.0, 1.0)),
        ((-1.0, None), (None, None)),  # negative
        ((10**400, float("inf")), (None, None)),  # past float's range, infinite
        ((None, float("nan")), (None, None)),
    ],
)
async def test_the_runner_reported_timings_are_kept_only_when_they_are_durations(
    reported: tuple[Any, Any], read: tuple[float | None, float | None]
) -> None:
    exec_seconds, runner_seconds = reported

    def script(message: dict[str, Any]) -> list[Any]:
        if message["op"] != "run":
            return [ack(message)]
        fields = {"exec_seconds": exec_seconds, "runner_seconds": runner_seconds}
        return [run_reply(**{k: v for k, v in fields.items() if v is not None})]

    async with executor(script) as ex:
        session: Any = ex.session
        assert (session.exec_seconds, session.runner_seconds) == (None, None)  # no run yet
        result = await ex.run("x")
        assert result.ok and (session.exec_seconds, session.runner_seconds) == read


@pytest.mark.parametrize("reported", ["1", True, [1], {"s": 1}])
async def test_a_timing_of_the_wrong_type_makes_the_reply_malformed(reported: Any) -> None:
    def script(message: dict[str, Any]) -> list[Any]:
        return [run_reply(exec_seconds=reported)] if message["op"] == "run" else [ack(message)]

    async with executor(script) as ex:
        first = await ex.run("x")
        second = await ex.run("x")
    assert first.error is not None and first.error.type == "WorkerCrashed"
    assert "RunReply.exec_seconds: expected a number" in first.error.message
    assert first.state_lost and len(ex.workers) == 2 and ex.workers[0].killed
    assert not second.ok and second.error is not None  # the replacement answers with the same script


async def test_a_policy_violation_never_reaches_the_worker() -> None:
    async with executor() as ex:
        result = await ex.run("import os")
        assert result.error is not None and result.error.type == "PolicyViolation"
        assert [m["op"] for m in ex.workers[0].sent] == ["init"]


async def test_a_forged_oversized_reply_is_cut_in_the_parent() -> None:
    huge = "x" * 100_000

    def script(message: dict[str, Any]) -> list[Any]:
        if message["op"] != "run":
            return [ack(message)]
        error = {"type": "E" * 5000, "message": huge, "traceback": huge, "line": None}
        artifacts = [{"path": "p" * 1000, "size": 1}] * 500
        return [
            run_reply(
                stdout=huge,
                stderr=huge,
                final_answer=huge,
                has_final_answer=True,
                error=error,
                artifacts=artifacts,
            )
        ]

    async with executor(script, output_limit=1000) as ex:
        result = await ex.run("x")
    assert result.truncated and result.stdout_omitted == 99_000 and result.stderr_omitted == 99_000
    assert result.artifacts_omitted == 400 and len(result.artifacts) == 100
    assert len(result.model_dump_json()) <= result_size_limit(1000)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"not json\n", "did not come from the runner"),  # refused before it is parsed
        (b"[1, 2]\n", "did not come from the runner"),
        (b'{"token": "%s", oops\n' % TOKEN.encode(), "not JSON"),
        (json.dumps({"token": "forged", "op": "reply"}).encode() + b"\n", "did not come from the runner"),
        (json.dumps({"op": "reply"}).encode() + b"\n", "did not come from the runner"),
        # The token, but not first: refused before the line is parsed.
        (json.dumps({"op": "reply", "token": TOKEN}).encode() + b"\n", "did not come from the runner"),
        # A second token key (JSON keeps the last) is no token.
        (b'{"token": "%s", "op": "reply", "token": "x"}\n' % TOKEN.encode(), "did not come from the runner"),
        (json.dumps({"token": TOKEN, "op": "surprise"}).encode() + b"\n", "unexpected message"),
        (json.dumps({"token": TOKEN, "op": 7}).encode() + b"\n", "not a message"),
        (json.dumps({"token": TOKEN, "op": "reply", "error": "oops"}).encode() + b"\n", "malformed message"),
        (
            json.dumps({"token": TOKEN, **run_reply(stdout_omitted=True)}).encode() + b"\n",
            "malformed message",
        ),
        (json.dumps({"token": TOKEN, **run_reply(error={"type": 1})}).encode() + b"\n", "malformed message"),
        (
            b'{"token": "%s", "op": "reply", "value": %s}\n' % (TOKEN.encode(), b"[" * 100_000),
            "nested too deeply",
        ),
        (
            json.dumps(
                {"token": TOKEN, "op": "tool_call", "id": 1, "name": ["x"], "args": [], "kwargs": {}}
            ).encode()
            + b"\n",
            "malformed message",
        ),
        (
            json.dumps(
                {"token": TOKEN, "op": "tool_call", "id": 1, "name": "add", "args": {}, "kwargs": {}}
            ).encode()
            + b"\n",
            "malformed message",
        ),
        (
            json.dumps(
                {"token": TOKEN, "op": "output", "stream": "stdin", "text": "x", "dropped": 0}
            ).encode()
            + b"\n",
            "unexpected message",  # output on a run that does not stream
        ),
    ],
)
async def test_a_bad_line_replaces_the_worker_and_says_the_state_is_lost(line: bytes, why: str) -> None:
    def script(message: dict[str, Any]) -> list[Any]:
        return [line] if message["op"] == "run" and message["code"] == "bad" else runner_like(message)

    async with executor(script) as ex:
        result = await ex.run("bad")
        assert (
            result.error is not None and result.error.type == "WorkerCrashed" and why in result.error.message
        )
        assert result.state_lost and ex.workers[0].killed
        again = await ex.run("good")
        assert again.ok and not again.state_lost and len(ex.workers) == 2


async def test_a_worker_that_ends_mid_run_reports_why_and_oom() -> None:
    def script(message: dict[str, Any]) -> list[Any]:
        return [WorkerExited("gone")] if message["op"] == "run" else runner_like(message)

    ex = ScriptedExecutor(
        lambda: ScriptedWorker(script, exit_info=WorkerExit(detail="killed by SIGKILL", oom=True))
    )
    async with ex:
        result = await ex.run("x")
    assert result.oom and result.state_lost and result.error is not None
    assert "killed by SIGKILL" in result.error.message


async def test_a_timeout_kills_the_worker_and_the_next_run_gets_a_new_one() -> None:
    def script(message: dict[str, Any]) -> list[Any]:
        return [HANG] if message["op"] == "run" and message["code"] == "loop" else runner_like(message)

    async with executor(script, timeout=0.2) as ex:
        result = await ex.run("loop")
        assert result.timed_out and result.state_lost and result.error is not None
        assert result.error.type == "Timeout" and ex.workers[0].killed
        assert (await ex.run("after")).stdout == "after\n" and len(ex.workers) == 2


async def test_a_worker_that_died_while_idle_is_replaced_before_the_run_with_state_lost() -> None:
    async with executor() as ex:
        ex.workers[0].living = False
        result = await ex.run("x")
    assert result.ok and result.state_lost and len(ex.workers) == 2


async def test_cancelling_a_run_discards_the_worker() -> None:
    def script(message: dict[str, Any]) -> list[Any]:
        return [HANG] if message["op"] == "run" else runner_like(message)

    async with executor(script, timeout=30) as ex:
        with anyio.move_on_after(0.1):
            await ex.run("x")
        assert ex.workers[0].killed


# ------------------------------------------------------------------------------------------------ tools


def tool_round_trip(name: str, *args: Any) -> Script:
    """A runner that, for a run, calls tool `name` and replies with what came back."""
    pending: list[dict[str, Any]] = []

    def script(message: dict[str, Any]) -> list[Any]:
        if message["op"] == "run":
            pending.append(message)
            return [
                {
                    "op": "tool_call",
                    "token": TOKEN,
                    "id": 1,
                    "run": message["run"],
                    "name": name,
                    "args": list(args),
                    "kwargs": {},
                }
            ]
        if message["op"] == "tool_result":
            return [run_reply(final_answer=message, has_final_answer=True)]
        return runner_like(message)

    return script


async def test_a_tool_call_runs_the_tool_in_the_parent() -> None:
    async with executor(tool_round_trip("add", 2, 3), tools={"add": lambda a, b: a + b}) as ex:
        result = await ex.run("x")
    assert result.final_answer == {"op": "tool_result", "id": 1, "value": 5}


async def test_an_async_tool_is_awaited() -> None:
    async def slow_double(x: int) -> int:
        await anyio.sleep(0)
        return 2 * x

    async with executor(tool_round_trip("double", 21), tools={"double": slow_double}) as ex:
        result = await ex.run("x")
    assert result.final_answer["value"] == 42


@pytest.mark.parametrize(
    ("tools", "kind"),
    [
        ({}, "NameError"),
        ({"f": lambda: 1 / 0}, "ZeroDivisionError"),
        ({"f": lambda: object()}, "TypeError"),
        ({"f": lambda: "x" * (TOOL_MESSAGE_LIMIT + 1)}, "ToolResultTooLarge"),
    ],
)
async def test_a_failing_tool_sends_an_error_back_to_the_code(tools: dict[str, Any], kind: str) -> None:
    async with executor(tool_round_trip("f"), tools=tools) as ex:
        result = await ex.run("x")
    answer = result.final_answer
    assert "value" not in answer and answer["error"]["type"] == kind


# ------------------------------------------------------------------------------------------------ state and files


async def test_reset_asks_the_runner_and_a_hung_reset_replaces_the_worker() -> None:
    def script(message: dict[str, Any]) -> list[Any]:
        return [HANG] if message["op"] == "reset" and len(calls) > 1 else runner_like(message)

    calls: list[int] = []
    async with executor(script, timeout=0.2) as ex:
        calls.append(1)
        await ex.reset()
        assert ex.workers[0].sent[-1]["op"] == "reset" and not ex.workers[0].killed
        calls.append(2)
        await ex.reset()
        assert ex.workers[0].killed
        assert (await ex.run("x")).ok and len(ex.workers) == 2


async def test_files_go_through_the_worker_with_paths_kept_inside_the_workdir() -> None:
    async with executor() as ex:
        await ex.upload("data/../in.txt", "text")
        assert ex.workers[0].files == {"in.txt": b"text"}
        assert await ex.download("./in.txt") == b"text"
        for bad in ("/etc/passwd", "../up", "..", ".", "", "a\x00b"):
            with pytest.raises(SandboxFileError):
                await ex.upload(bad, b"x")


# ------------------------------------------------------------------------------------------------ the one rule
# An operation that does not end with its answer (cancelled, timed out, malformed, lost) discards the
# worker, and the next run says `state_lost`; one that ends with its answer keeps both.


def hang_on(op: str) -> Script:
    def script(message: dict[str, Any]) -> list[Any]:
        return [HANG] if message["op"] == op and message.get("code", "") != "fine" else runner_like(message)

    return script


def bad_line_on(op: str) -> Script:
    def script(message: dict[str, Any]) -> list[Any]:
        return [b"garbage\n"] if message["op"] == op else runner_like(message)

    return script


async def next_run_reports_state_lost(ex: ScriptedExecutor) -> None:
    result = await ex.run("fine")
    assert result.ok and result.state_lost, result
    assert (await ex.run("fine")).state_lost is False  # said once


async def test_a_cancelled_reset_replaces_the_worker_and_the_next_result_is_its_own() -> None:
    # The bug this rule closes: a reset cancelled while its reply was in flight left the channel one
    # reply behind, and every later run returned the result of the run before it.
    async with executor(hang_on("reset")) as ex:
        await ex.run("x = 41")
        with anyio.move_on_after(0.05) as scope:
            await ex.reset()
        assert scope.cancelled_caught and ex.workers[0].killed
        first = await ex.run("print('hello')")
        assert first.stdout == "print('hello')\n" and first.state_lost
        assert (await ex.run("again")).stdout == "again\n"


@pytest.mark.parametrize("trouble", ["timeout", "bad line", "lost"])
async def test_a_reset_without_its_answer_replaces_the_worker_and_says_state_lost(trouble: str) -> None:
    script = {
        "timeout": hang_on("reset"),
        "bad line": bad_line_on("reset"),
        "lost": lambda m: [WorkerExited("gone")] if m["op"] == "reset" else runner_like(m),
    }[trouble]
    async with executor(script, timeout=0.2) as ex:
        await ex.reset()  # the session's variables are gone either way: reset does not raise
        assert ex.workers[0].killed
        await next_run_reports_state_lost(ex)


async def test_a_reset_that_answers_keeps_the_worker_and_clears_a_pending_loss() -> None:
    async with executor() as ex:
        ex.workers[0].living = False  # died while idle: the reset's fresh session is the reset
        await ex.reset()
        assert len(ex.workers) == 2
        await ex.reset()
        assert not ex.workers[1].killed and ex.workers[1].sent[-1]["op"] == "reset"
        assert not (await ex.run("fine")).state_lost


@pytest.mark.parametrize("operation", ["upload", "download"])
@pytest.mark.parametrize("trouble", ["cancelled", "protocol error", "lost"])
async def test_a_file_operation_without_its_answer_replaces_the_worker(operation: str, trouble: str) -> None:
    async with executor() as ex:
        await ex.upload("f.txt", b"1")
        worker = ex.workers[0]
        worker.file_trouble = {
            "cancelled": HANG,
            "protocol error": ProtocolError("garbled"),
            "lost": WorkerExited("gone"),
        }[trouble]
        call = ex.upload("f.txt", b"2") if operation == "upload" else ex.download("f.txt")
        if trouble == "cancelled":
            with anyio.move_on_after(0.05) as scope:
                await call
            assert scope.cancelled_caught
        else:
            with pytest.raises(ProtocolError if trouble == "protocol error" else SandboxFileError):
                await call
        assert worker.killed
        await next_run_reports_state_lost(ex)


async def test_a_refused_file_operation_keeps_the_worker_and_its_state() -> None:
    async with executor() as ex:
        ex.workers[0].file_trouble = SandboxFileError("no such file")
        with pytest.raises(SandboxFileError, match="no such file"):
            await ex.download("missing.txt")
        assert not ex.workers[0].killed
        assert not (await ex.run("fine")).state_lost


async def test_a_cancelled_run_says_state_lost_next_time() -> None:
    async with executor(hang_on("run")) as ex:
        with anyio.move_on_after(0.05):
            await ex.run("loop")
        assert ex.workers[0].killed
        await next_run_reports_state_lost(ex)


async def test_the_life_cycle_is_one_state() -> None:
    ex = executor()
    assert ex.state is ExecutorState.UNOPENED and ex.session is None
    await ex.open()
    assert ex.state is ExecutorState.OPEN and ex.session is not None
    await ex.close()
    assert ex.state is ExecutorState.CLOSED and ex.session is None
    with pytest.raises(ExecutorClosed):
        await ex.open()


async def test_a_failed_open_can_be_tried_again() -> None:
    attempts: list[int] = []

    def script(message: dict[str, Any]) -> list[Any]:
        attempts.append(1)
        if len(attempts) == 1:
            return [{"op": "fatal", "token": TOKEN, "message": "first start fails"}]
        return runner_like(message)

    ex = executor(script)
    with pytest.raises(WorkerStartError):
        await ex.open()
    assert ex.state is ExecutorState.UNOPENED
    async with ex:
        assert (await ex.run("fine")).ok
