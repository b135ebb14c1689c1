"""Watching a run: output streams while the code runs, on every backend (conformance).

What is proved here, per backend: chunks arrive as the code writes them (spaced in time, before the
run ends), also from `os.write` and child processes; a 100 MB flood streams within its budget with
every character accounted for (streamed or counted as dropped) and the session lives on; a timeout
ends the stream with the timed-out result; leaving the stream early discards the worker (the next run
says `state_lost`); the stream's result equals `run()`'s; tool calls show as events; the callbacks and
the sync facade see the same stream.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from sandboxes import (
    ExecutionResult,
    OutputEvent,
    Policy,
    ResultEvent,
    SyncExecutor,
    ToolCallEvent,
    ToolResultEvent,
)

pytestmark = pytest.mark.anyio

OS_POLICY = Policy(allowed_imports=["os", "subprocess", "sys", "time"], subprocess=True)
TIME_POLICY = Policy(allowed_imports=["sys", "time"])


async def watch(ex: Any, code: str, **budget: Any) -> tuple[list[tuple[float, Any]], ExecutionResult]:
    """Every event of a streamed run with its arrival time; and the run's result (the last event)."""
    seen: list[tuple[float, Any]] = []
    async with ex.stream(code, **budget) as events:
        async for event in events:
            seen.append((time.monotonic(), event))
    assert isinstance(seen[-1][1], ResultEvent), seen[-1]
    assert not any(isinstance(e, ResultEvent) for _, e in seen[:-1])
    return seen, seen[-1][1].result


def text_of(seen: list[tuple[float, Any]], stream: str = "stdout") -> str:
    return "".join(e.text for _, e in seen if isinstance(e, OutputEvent) and e.stream == stream)


def arrival(seen: list[tuple[float, Any]], marker: str) -> float:
    """When the chunk holding `marker` arrived (the text streamed so far first contains it)."""
    streamed = {"stdout": "", "stderr": ""}
    for at, event in seen:
        if isinstance(event, OutputEvent):
            streamed[event.stream] += event.text
            if marker in streamed[event.stream]:
                return at
    raise AssertionError(f"{marker!r} never streamed: {seen!r}")


async def test_prints_spaced_in_time_arrive_spaced(executor_factory) -> None:
    code = "import time\nprint('one')\ntime.sleep(0.6)\nprint('two')\ntime.sleep(0.6)\nprint('three')\n"
    async with executor_factory(policy=TIME_POLICY, timeout=20) as ex:
        seen, result = await watch(ex, code)
        assert result.ok, result
        assert text_of(seen) == "one\ntwo\nthree\n" == result.stdout
        one, two, three, end = arrival(seen, "one"), arrival(seen, "two"), arrival(seen, "three"), seen[-1][0]
        # Had the output come with the result, all of it would arrive at once: the sleeps space it out.
        assert two - one >= 0.4 and three - two >= 0.4, seen
        assert end - one >= 0.8, seen


async def test_os_write_and_a_child_process_stream(executor_factory) -> None:
    code = (
        "import os, subprocess, time\n"
        "os.write(1, b'raw-out\\n')\n"
        "os.write(2, b'raw-err\\n')\n"
        "subprocess.run(['sh', '-c', 'echo child-out; echo child-err >&2'])\n"
        "time.sleep(0.8)\n"
    )
    async with executor_factory(policy=OS_POLICY, timeout=20) as ex:
        seen, result = await watch(ex, code)
        assert result.ok, result
        assert text_of(seen) == "raw-out\nchild-out\n" == result.stdout
        assert text_of(seen, "stderr") == "raw-err\nchild-err\n" == result.stderr
        end = seen[-1][0]
        for marker in ("raw-out", "raw-err", "child-out", "child-err"):
            assert end - arrival(seen, marker) >= 0.5, (marker, seen)  # came while the code slept


async def test_a_100_mb_flood_streams_bounded_and_the_session_lives_on(executor_factory) -> None:
    code = (
        "import sys\nfor i in range(100):\n    sys.stdout.write('x' * 1_000_000)\nsys.stderr.write('done')\n"
    )
    chars, rate = 20_000, 10_000
    async with executor_factory(policy=TIME_POLICY, timeout=60) as ex:
        started = time.monotonic()
        seen, result = await watch(ex, code, chars=chars, chars_per_second=rate)
        elapsed = time.monotonic() - started
        assert result.ok, result
        assert result.stdout_omitted > 99_000_000 and result.truncated  # the result cuts as run() does
        outputs = [e for _, e in seen if isinstance(e, OutputEvent) and e.stream == "stdout"]
        streamed = sum(len(e.text) for e in outputs)
        dropped = sum(e.dropped for e in outputs)
        assert streamed + dropped == 100_000_000, (streamed, dropped)  # every character accounted for
        assert 0 < streamed <= chars + rate * elapsed, (streamed, elapsed)
        assert set(text_of(seen)) == {"x"}
        err = [e for _, e in seen if isinstance(e, OutputEvent) and e.stream == "stderr"]
        assert "done".startswith(text_of(seen, "stderr")) and sum(len(e.text) + e.dropped for e in err) == 4
        after = await ex.run("print('alive')")
        assert after.ok and after.stdout == "alive\n" and not after.state_lost, after


async def test_a_timeout_mid_stream_ends_it_with_the_timed_out_result(executor_factory) -> None:
    code = "import time\nwhile True:\n    print('tick')\n    time.sleep(0.1)\n"
    async with executor_factory(policy=TIME_POLICY, timeout=2) as ex:
        seen, result = await watch(ex, code)
        assert result.timed_out and result.state_lost and result.error and result.error.type == "Timeout"
        assert text_of(seen).startswith("tick\n") and text_of(seen).count("tick") >= 3, seen
        after = await ex.run("print('fresh')")
        assert after.ok and after.stdout == "fresh\n", after


async def test_leaving_the_stream_early_discards_the_worker(executor_factory) -> None:
    code = "import time\nprint('started')\ntime.sleep(30)\nprint('never')\n"
    async with executor_factory(policy=TIME_POLICY, timeout=60) as ex:
        await ex.run("kept = 1")
        first = ex.session
        started = time.monotonic()
        async with ex.stream(code) as events:
            async for event in events:
                assert isinstance(event, OutputEvent) and event.text == "started\n", event
                break
        assert time.monotonic() - started < 20  # not waited out: the run was cancelled
        after = await ex.run("print('fresh')\n'kept' in dir()")
        assert after.state_lost and after.stdout == "fresh\n" and after.value is False, after
        assert ex.session is not first


async def test_the_stream_result_equals_the_run_result(executor_factory) -> None:
    code = (
        "import sys\n"
        "with open('made.txt', 'w') as f:\n    f.write('hello')\n"
        "print('out')\nsys.stderr.write('err\\n')\n"
        "total = sum(range(10))\n{'total': total}\n"
    )
    failing = "print('before')\n1 / 0\n"
    policy = Policy(allowed_imports=["sys"])
    # Two sessions given the same runs: the cells' numbers (in tracebacks) then match too.
    async with (
        executor_factory(policy=policy, timeout=20) as plain,
        executor_factory(policy=policy, timeout=20) as ex,
    ):
        for snippet in (code, failing):
            ran = await plain.run(snippet)
            _, streamed = await watch(ex, snippet)
            # Everything but what was measured (wall time, and the CPU and memory the run used).
            measured = {"duration", "usage"}
            assert streamed.model_dump(exclude=measured) == ran.model_dump(exclude=measured)
            assert (streamed.usage is None) == (ran.usage is None)
            if ran.usage is not None and streamed.usage is not None:
                assert (
                    streamed.usage.source == ran.usage.source
                    and streamed.usage.peak_scope == ran.usage.peak_scope
                )
            if snippet is code:
                assert [a.path for a in ran.artifacts] == ["made.txt"] and ran.value == {"total": 45}, ran
        assert ran.error and ran.error.type == "ZeroDivisionError"
        assert streamed.duration > 0


async def test_tool_calls_inside_a_streamed_run_are_events(executor_factory) -> None:
    def add(a: int, b: int) -> int:
        return a + b

    def broken() -> None:
        raise RuntimeError("no luck")

    code = "print(add(2, 3))\ntry:\n    broken()\nexcept Exception as e:\n    print('caught')\n"
    async with executor_factory(timeout=20, tools={"add": add, "broken": broken}) as ex:
        seen, result = await watch(ex, code)
        assert result.ok and result.stdout == "5\ncaught\n", result
        kinds = [e for _, e in seen if not isinstance(e, OutputEvent)]
        assert kinds[0] == ToolCallEvent(name="add", args=[2, 3], kwargs={})
        assert kinds[1] == ToolResultEvent(name="add", ok=True)
        assert kinds[2] == ToolCallEvent(name="broken", args=[], kwargs={})
        assert (
            isinstance(kinds[3], ToolResultEvent) and not kinds[3].ok and "no luck" in (kinds[3].error or "")
        )
        assert isinstance(kinds[4], ResultEvent)
        order = [e for _, e in seen if isinstance(e, OutputEvent | ToolCallEvent)]
        assert isinstance(order[0], ToolCallEvent) and order[1].text.startswith("5")  # type: ignore[union-attr]


async def test_run_callbacks_sync_and_async_see_the_output_in_order(executor_factory) -> None:
    code = "import sys, time\nprint('a')\nsys.stderr.write('b\\n')\ntime.sleep(0.2)\nprint('c')\n"
    out: list[str] = []
    err: list[str] = []

    async def on_stderr(event: OutputEvent) -> None:
        await anyio.sleep(0)
        err.append(event.text)

    async with executor_factory(policy=TIME_POLICY, timeout=20) as ex:
        result = await ex.run(code, on_stdout=lambda event: out.append(event.text), on_stderr=on_stderr)
        assert result.ok and "".join(out) == "a\nc\n" == result.stdout and "".join(err) == "b\n", result


def test_the_sync_facade_streams_as_an_iterator(executor_factory) -> None:
    with SyncExecutor(executor_factory(policy=TIME_POLICY, timeout=20)) as ex:
        events = list(ex.stream("import time\nprint('x')\ntime.sleep(0.3)\nprint('y')"))
        assert isinstance(events[-1], ResultEvent) and events[-1].result.stdout == "x\ny\n"
        assert "".join(e.text for e in events if isinstance(e, OutputEvent)) == "x\ny\n"
        with ex.stream("import time\nprint('first')\ntime.sleep(30)") as stream:
            assert next(stream) == OutputEvent(stream="stdout", text="first\n")
        after = ex.run("print(2)")
        assert after.state_lost and after.stdout == "2\n", after


async def test_what_a_thread_wrote_before_a_streamed_run_is_not_streamed(executor_factory: Any) -> None:
    """Output a background thread wrote between two runs, still in the capture pipe when a streamed
    run starts, is dropped with that run's start: it is neither streamed nor the run's output."""
    policy = Policy(allowed_imports=["threading", "time"])
    async with executor_factory(policy=policy, timeout=20) as ex:
        for _ in range(3):  # the drain's idle look may empty the pipe first: try a few times
            started = await ex.run(
                "import threading, time\n"
                "t = threading.Thread(target=lambda: (time.sleep(0.05), print('early')))\n"
                "t.start()"
            )
            assert started.ok, started.error
            await anyio.sleep(0.1)
            seen, result = await watch(ex, "t.join()\nprint('late')")
            assert "early" not in text_of(seen) and result.stdout == "late\n", (seen, result)
