"""Tool calls belong to their run, and nothing the sandbox sends on the tool bridge makes the parent
raise, execute a tool twice, or execute one for a run that ended.

Attacks, each with the effect that must not happen:

- a forged tool call of the wrong shape (the code holds its runner without the Python-level guards):
  `run()` must still return a result (the session discarded, `state_lost`), the tool never runs;
- a thread the code left running calls a tool after its run returned: the call is refused (the thread
  sees `ToolError`), the tool never runs, the next run sees nothing of it;
- a call tagged with an ended run (forged): the parent refuses it without running the tool;
- several threads calling tools at once: each gets its own tool's answer, never another's;
- a blocking tool still running when its run times out: the result says so (`tools_running`), and its
  late answer never lands in the next run; an async tool is cancelled (its marker never appears).

Host backend: the wire is the same on every runner-based backend (the conformance suite runs the tool
contract on each).

Not attack-corpus entries: each needs tools registered with the session, threads and runs
before and after, and what the parent's tool function saw.
"""

from __future__ import annotations

import pathlib
import threading
from typing import Any

import anyio
import pytest

from sandboxes import HostExecutor, Policy
from sandboxes.events import ResultEvent, ToolCallEvent
from sandboxes.policy import DEFAULT_ALLOWED_IMPORTS

pytestmark = pytest.mark.anyio

UNGUARDED = Policy(python_guards=False)
THREADS = Policy(allowed_imports=(*DEFAULT_ALLOWED_IMPORTS, "threading", "time"))

FIND_RUNNER = (
    "import gc, json, time\n"
    "runner = next(o for o in gc.get_objects() if type(o).__name__ == 'Runner' and hasattr(o, 'channel'))\n"
    "channel = runner.channel\n"
)


def recorder(calls: list[Any]) -> dict[str, Any]:
    """Tools that record every call that reached them."""

    def mark(*args: Any, **kwargs: Any) -> str:
        calls.append((args, kwargs))
        return "marked"

    return {"mark": mark}


async def wait_for_file(ex: HostExecutor, path: str) -> bytes | None:
    """The file once the sandbox wrote it (None if it never did, within a generous bound)."""
    for _ in range(400):
        try:
            return await ex.download(path)
        except Exception:
            await anyio.sleep(0.05)
    return None


# ------------------------------------------------------------------------------------------------ malformed calls

FORGED_CALLS = {
    "name is a list": "{'op': 'tool_call', 'id': 1, 'run': RUN, 'name': ['mark'], 'args': [], 'kwargs': {}}",
    "name is a dict": "{'op': 'tool_call', 'id': 1, 'run': RUN, 'name': {'a': 1}, 'args': [], 'kwargs': {}}",
    "args is a dict": "{'op': 'tool_call', 'id': 1, 'run': RUN, 'name': 'mark', 'args': {'a': 1}, 'kwargs': {}}",
    "args is a number": "{'op': 'tool_call', 'id': 1, 'run': RUN, 'name': 'mark', 'args': 7, 'kwargs': {}}",
    "kwargs is a list": "{'op': 'tool_call', 'id': 1, 'run': RUN, 'name': 'mark', 'args': [], 'kwargs': [1]}",
    "id is a list": "{'op': 'tool_call', 'id': [1], 'run': RUN, 'name': 'mark', 'args': [], 'kwargs': {}}",
    "no run": "{'op': 'tool_call', 'id': 1, 'name': 'mark', 'args': [], 'kwargs': {}}",
    "run is text": "{'op': 'tool_call', 'id': 1, 'run': 'RUN', 'name': 'mark', 'args': [], 'kwargs': {}}",
}


def forge(message: str) -> str:
    """Code that sends `message` as its runner would (RUN: the run in progress), then waits to be killed."""
    return (
        FIND_RUNNER + "RUN = getattr(channel, 'run', 1)\n" + f"channel.send({message})\n" + "time.sleep(60)\n"
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "stream"])
@pytest.mark.parametrize("shape", list(FORGED_CALLS))
async def test_a_malformed_tool_call_ends_the_session_not_the_caller(shape: str, streamed: bool) -> None:
    calls: list[Any] = []
    events: list[Any] = []
    async with HostExecutor(policy=UNGUARDED, timeout=30, tools=recorder(calls)) as ex:
        await ex.run("x = 1")
        if streamed:
            async with ex.stream(forge(FORGED_CALLS[shape])) as stream:
                events = [event async for event in stream]
            result = events[-1].result
        else:
            result = await ex.run(forge(FORGED_CALLS[shape]))
        after = await ex.run("print(x)")
    assert result.state_lost and result.error is not None, result
    assert result.error.type == "WorkerCrashed", result.error
    assert not result.timed_out  # discarded at once, not left to its timeout
    assert calls == []  # the tool never ran
    assert not any(isinstance(event, ToolCallEvent) for event in events)
    assert after.error is not None and after.error.type == "NameError"  # a fresh session


# ------------------------------------------------------------------------------------------------ calls after their run

LEFTOVER = """
import threading, time

def late():
    while True:  # until the parent says the run has ended (it uploads 'go' between runs)
        try:
            open('go').close()
            break
        except OSError:
            time.sleep(0.01)
    try:
        outcome = 'returned ' + str(mark('late'))
    except ToolError as exc:
        outcome = 'ToolError ' + str(exc)
    with open('outcome', 'w') as f:
        f.write(outcome)

threading.Thread(target=late, daemon=True).start()
print('run 1 done')
"""


async def test_a_thread_left_by_a_run_cannot_call_a_tool_after_the_run_ended() -> None:
    calls: list[Any] = []
    async with HostExecutor(policy=THREADS, timeout=30, tools=recorder(calls)) as ex:
        first = await ex.run(LEFTOVER)
        assert first.ok and first.stdout == "run 1 done\n", first
        await ex.upload("go", b"")  # between runs: the thread calls now
        outcome = await wait_for_file(ex, "outcome")
        second = await ex.run("print('run 2')")
    assert outcome is not None, "the leftover thread's call was never answered"
    assert outcome.decode().startswith("ToolError "), outcome
    assert "the run that made this call has ended" in outcome.decode()
    assert calls == []  # the tool never ran, not in run 1, not in run 2
    assert second.ok and second.stdout == "run 2\n" and not second.state_lost, second


async def test_a_call_tagged_with_an_ended_run_is_refused_by_the_parent() -> None:
    """The runner is the code's (no guards): it tags a call with the previous run. The parent refuses
    it without running the tool; the code sees `ToolError`, the session goes on."""
    calls: list[Any] = []
    code = (
        FIND_RUNNER
        + "current = getattr(channel, 'run', 1)\n"
        + "channel.run = current - 1\n"
        + "try:\n"
        + "    print('returned', mark('forged'))\n"
        + "except ToolError as exc:\n"
        + "    print('ToolError', exc)\n"
        + "channel.run = current\n"
        + "print(mark('honest'))\n"
    )
    async with HostExecutor(policy=UNGUARDED, timeout=30, tools=recorder(calls)) as ex:
        await ex.run("x = 1")
        result = await ex.run(code)
        after = await ex.run("print(x)")
    assert result.ok, result.error
    first, second = result.stdout.splitlines()
    assert first.startswith("ToolError ") and "ToolCallRefused" in first, first
    assert "the run that made this call has ended" in first
    assert second == "marked"
    assert calls == [(("honest",), {})]  # only the call of the run in progress ran
    assert after.stdout == "1\n" and not after.state_lost


async def test_a_result_no_call_awaits_is_dropped_not_taken_for_a_request_or_another_result() -> None:
    """The code sends a call past the stub (its runner is unguarded): the parent answers it, and that
    answer must reach neither the next call of the stub nor the runner's request loop."""
    code = (
        FIND_RUNNER
        + "channel.send({'op': 'tool_call', 'id': 10**6, 'run': getattr(channel, 'run', 1), "
        + "'name': 'echo', 'args': ['raw'], 'kwargs': {}})\n"
        + "print(echo('own'))\n"
    )
    async with HostExecutor(policy=UNGUARDED, timeout=30, tools={"echo": lambda *a: list(a)}) as ex:
        await ex.run("x = 1")
        result = await ex.run(code)
        after = await ex.run("print(x, echo('next'))")
    assert result.ok and result.stdout == "['own']\n", result
    assert after.ok and after.stdout == "1 ['next']\n" and not after.state_lost, after


CONCURRENT = """
import threading

mixed = []

def caller(n):
    for i in range(40):
        answer = echo(n, i)
        if answer != [n, i]:
            mixed.append((n, i, answer))

threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print('mixed', mixed)
"""


async def test_threads_calling_tools_at_once_each_get_their_own_answer() -> None:
    async def echo(*args: Any) -> list[Any]:
        await anyio.sleep(0)
        return list(args)

    async with HostExecutor(policy=THREADS, timeout=60, tools={"echo": echo}) as ex:
        result = await ex.run(CONCURRENT)
        after = await ex.run("print('next')")
    assert result.ok, result.error
    assert result.stdout == "mixed []\n"
    assert after.ok and after.stdout == "next\n"


# ------------------------------------------------------------------------------------------------ timeouts


async def test_a_blocking_tool_still_running_at_the_timeout_is_reported_and_cannot_answer_later(
    tmp_path: pathlib.Path,
) -> None:
    release, finished = threading.Event(), threading.Event()
    marker = tmp_path / "late-effect"

    def slow() -> str:
        release.wait(60)
        marker.write_text("landed")
        finished.set()
        return "late answer"

    def let_slow_finish() -> bool:
        release.set()
        return finished.wait(60)

    tools = {"slow": slow, "let_slow_finish": let_slow_finish, "fast": lambda: "fast answer"}
    async with HostExecutor(timeout=1.5, tools=tools) as ex:
        stopped = await ex.run("print(slow())")
        running_after_the_result = not marker.exists()
        # The next run lets the old call finish while it talks to the parent itself.
        after = await ex.run("print(let_slow_finish())\nprint(fast())")
    assert stopped.timed_out and stopped.tools_running == ["slow"], stopped
    assert stopped.error is not None
    assert "tool 'slow' was still running in this process and may still have effects" in stopped.error.message
    assert running_after_the_result  # what the result warned of: its effect came after it
    assert marker.read_text() == "landed"
    assert after.ok and after.stdout == "True\nfast answer\n", after
    assert after.tools_running == []


async def test_an_async_tool_is_cancelled_by_the_timeout(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "async-effect"
    go = anyio.Event()

    async def slow() -> str:
        await go.wait()
        marker.write_text("landed")
        return "late"

    async with HostExecutor(timeout=1.5, tools={"slow": slow}) as ex:
        stopped = await ex.run("print(slow())")
        go.set()
        after = await ex.run("print('next')")  # the loop runs on: a live tool would finish now
    assert stopped.timed_out and stopped.tools_running == [], stopped
    assert stopped.error is not None and "still running" not in stopped.error.message
    assert not marker.exists()
    assert after.ok and after.stdout == "next\n"


async def test_a_streamed_run_reports_a_refused_leftover_call_nowhere() -> None:
    """The stream of the run in progress shows its own tool calls only, never a leftover's."""
    calls: list[Any] = []
    async with HostExecutor(policy=THREADS, timeout=30, tools=recorder(calls)) as ex:
        await ex.run(LEFTOVER)
        await ex.upload("go", b"")
        assert await wait_for_file(ex, "outcome") is not None
        async with ex.stream("print(mark('own'))") as stream:
            events = [event async for event in stream]
    tool_events = [event for event in events if isinstance(event, ToolCallEvent)]
    assert [event.args for event in tool_events] == [["own"]]
    assert isinstance(events[-1], ResultEvent) and events[-1].result.stdout == "marked\n"
    assert calls == [(("own",), {})]
