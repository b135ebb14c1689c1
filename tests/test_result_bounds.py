"""Output never changes what a program does, and every part of a result that code controls is bounded.

Run against every backend. Each test checks two things: the program behaved as it would with no
sandbox (it went on after writing, its exception is the one it raised, it reached its last line), and
the serialized `ExecutionResult` stays within `result_size_limit(output_limit)` characters.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from support.security_helpers import assert_usable

from sandboxes import ExecutionResult, Limits, Policy
from sandboxes.errors import BackendUnavailable
from sandboxes.runtime.bounds import (
    ARTIFACT_COUNT_LIMIT,
    ERROR_MESSAGE_LIMIT,
    TOOL_MESSAGE_LIMIT,
    TRACEBACK_LIMIT,
    result_size_limit,
)

pytestmark = pytest.mark.anyio

LIMIT = 2_000
OS = Policy(allowed_imports=["os", "sys", "json"])


def assert_bounded(result: ExecutionResult, limit: int = LIMIT) -> None:
    size = len(result.model_dump_json())
    assert size <= result_size_limit(limit), f"the result is {size:,} characters"


def omitted_in_marker(text: str) -> int:
    found = re.findall(r"\.\.\. \[([\d,]+) characters omitted\] \.\.\.", text)
    assert len(found) == 1, text[:300]
    return int(found[0].replace(",", ""))


async def test_500_mb_printed_in_1_mb_chunks_runs_to_the_end(executor_factory: Any) -> None:
    code = "import sys\nfor i in range(500):\n    sys.stdout.write('x' * (1 << 20))\nprint('END')\nfinal_answer('done')"
    async with executor_factory(policy=OS, timeout=120, output_limit=LIMIT) as ex:
        result = await ex.run(code)
        assert result.ok and result.final_answer == "done", result.error
        assert result.stdout.startswith("xxx") and result.stdout.endswith("xEND\n")
        total = 500 * (1 << 20) + len("END\n")
        kept = len(result.stdout) - len(f"\n... [{total - LIMIT:,} characters omitted] ...\n")
        assert result.stdout_omitted == total - kept == omitted_in_marker(result.stdout)
        assert result.truncated
        assert_bounded(result)
        await assert_usable(ex)


async def test_many_small_writes_past_the_pipe_run_to_the_end_counted_exactly(executor_factory: Any) -> None:
    # 4 MB in 16-byte lines: more than any capture pipe holds, written too slowly for one look of
    # the drain to call it a flood. The drain must keep up on its timer, or the program would block.
    code = (
        "import sys\nfor i in range(250_000):\n    sys.stdout.write('%015d\\n' % i)\n    sys.stdout.flush()"
    )
    async with executor_factory(policy=OS, timeout=120, output_limit=LIMIT) as ex:
        result = await ex.run(code)
        assert result.ok, result.error
        assert result.stdout.startswith("000000000000000\n") and result.stdout.endswith("000000000249999\n")
        assert result.stdout_omitted == 250_000 * 16 - LIMIT == omitted_in_marker(result.stdout)
        await assert_usable(ex)


async def test_a_thread_printing_between_runs_past_the_pipe_neither_blocks_nor_leaks(
    executor_factory: Any,
) -> None:
    # Between runs nobody collects: the drain empties the pipe on its own, so the thread finishes,
    # and what it wrote before the next run started is not that run's output.
    code = (
        "import threading\n"
        "def spam():\n"
        "    for _ in range(64):\n"
        "        print('t' * 65535)\n"
        "worker = threading.Thread(target=spam)\n"
        "worker.start()\n"
    )
    policy = Policy(allowed_imports=["threading", "time"])
    async with executor_factory(policy=policy, timeout=60, output_limit=LIMIT) as ex:
        started = await ex.run(code)
        assert started.ok, started.error
        await anyio.sleep(3)  # idle: only the drain empties the pipe now
        later = await ex.run("print(worker.is_alive())")
    assert later.ok and later.stdout == "False\n", (later.error, later.stdout[-200:])


async def test_omitted_count_is_exact_in_characters(executor_factory: Any) -> None:
    code = "print('é' * 5000 + '|' + 'ü' * 5000)"  # two bytes per character in UTF-8
    async with executor_factory(timeout=20, output_limit=LIMIT) as ex:
        result = await ex.run(code)
    assert result.stdout.startswith("é" * (LIMIT // 2)) and result.stdout.endswith(
        "ü" * (LIMIT // 2 - 1) + "\n"
    )
    assert result.stdout_omitted == 10_002 - LIMIT == omitted_in_marker(result.stdout)
    assert result.stderr_omitted == 0 and result.stderr == ""


async def test_output_is_not_limited_by_the_file_size_limit(executor_factory: Any) -> None:
    policy = Policy(allowed_imports=["sys"], limits=Limits(max_file_mb=1))
    code = "import sys\nfor _ in range(8):\n    sys.stderr.write('e' * (1 << 20))\nprint('still here')"
    async with executor_factory(policy=policy, timeout=60, output_limit=LIMIT) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert result.stdout == "still here\n"
    assert result.stderr_omitted == 8 * (1 << 20) - LIMIT


async def test_100_mb_exception_message_is_bounded(executor_factory: Any) -> None:
    code = "raise ValueError('<' + 'm' * 100_000_000 + '>')"
    async with executor_factory(timeout=60, output_limit=LIMIT) as ex:
        result = await ex.run(code)
        assert result.error is not None and result.error.type == "ValueError"
        assert result.error.message.startswith("<mmm") and result.error.message.endswith("mm>")
        assert len(result.error.message) <= ERROR_MESSAGE_LIMIT + 60
        assert result.error.traceback and len(result.error.traceback) <= TRACEBACK_LIMIT + 60
        assert "characters omitted" in result.error.message
        assert_bounded(result)
        await assert_usable(ex)


async def test_100_mb_str_of_an_exception_is_bounded(executor_factory: Any) -> None:
    code = "class Loud(Exception):\n    def __str__(self):\n        return 'L' * 100_000_000\nraise Loud()"
    async with executor_factory(timeout=60, output_limit=LIMIT) as ex:
        result = await ex.run(code)
        assert result.error is not None and result.error.type == "Loud", result.error
        assert (
            result.error.message.startswith("LLL") and len(result.error.message) <= ERROR_MESSAGE_LIMIT + 60
        )
        assert_bounded(result)
        await assert_usable(ex)


async def test_final_answer_over_the_limit_is_cut_and_says_so(executor_factory: Any) -> None:
    async with executor_factory(timeout=60, output_limit=LIMIT) as ex:
        text = await ex.run("final_answer('A' + 'b' * 2_000_000 + 'Z')")
        assert text.has_final_answer and text.truncated
        assert text.final_answer.startswith("Abbb") and text.final_answer.endswith("bbZ")
        assert omitted_in_marker(text.final_answer) == 2_000_002 - LIMIT
        assert_bounded(text)
        data = await ex.run("final_answer(list(range(1_000_000)))")
        assert data.has_final_answer and data.truncated
        assert isinstance(data.final_answer, str) and data.final_answer.startswith("[0, 1, 2, ")
        assert data.final_answer.endswith("999998, 999999]")
        assert_bounded(data)
        small = await ex.run("final_answer({'a': [1, 2]})")
        assert small.final_answer == {"a": [1, 2]} and not small.truncated


async def test_many_long_artifact_names_are_bounded(executor_factory: Any) -> None:
    code = "for i in range(300):\n    open(f'{i:03d}' + 'n' * 200 + '.txt', 'w').write('x')"
    async with executor_factory(timeout=60, output_limit=LIMIT) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert (
        len(result.artifacts) == ARTIFACT_COUNT_LIMIT
        and result.artifacts_omitted == 300 - ARTIFACT_COUNT_LIMIT
    )
    assert result.truncated
    assert_bounded(result)


async def test_a_tool_returning_100_mb_is_refused_and_the_program_goes_on(executor_factory: Any) -> None:
    calls: list[int] = []

    def big(n: int) -> str:
        calls.append(n)
        return "x" * n

    code = (
        "try:\n    big(100_000_000)\nexcept ToolError as exc:\n    print('refused:', str(exc)[:300])\n"
        "print(len(big(10)))"
    )
    async with executor_factory(timeout=60, output_limit=LIMIT, tools={"big": big}) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert calls == [100_000_000, 10]
    assert "refused: tool 'big' failed: ToolResultTooLarge" in result.stdout
    assert f"at most {TOOL_MESSAGE_LIMIT:,}" in result.stdout
    assert result.stdout.endswith("\n10\n")
    assert_bounded(result)


async def test_tool_arguments_over_the_bridge_limit_never_reach_the_parent(executor_factory: Any) -> None:
    seen: list[int] = []

    def echo(text: str) -> int:
        seen.append(len(text))
        return len(text)

    code = (
        "try:\n    echo('y' * 20_000_000)\nexcept TypeError as exc:\n    print('refused')\nprint(echo('abc'))"
    )
    async with executor_factory(timeout=60, output_limit=LIMIT, tools={"echo": echo}) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert result.stdout == "refused\n3\n"
    assert seen == [3]


async def test_rebinding_final_answer_does_not_carry_into_the_next_run(executor_factory: Any) -> None:
    def lookup(key: str) -> str:
        return f"value of {key}"

    async with executor_factory(timeout=20, tools={"lookup": lookup}) as ex:
        first = await ex.run(
            "def final_answer(x):\n    print('FORGED', x)\n"
            "def lookup(key):\n    return 'forged value'\n"
            "kept = 1"
        )
        assert first.ok and not first.has_final_answer
        second = await ex.run("print(kept, lookup('k'))\nfinal_answer('real')")
    assert second.stdout == "1 value of k\n"
    assert second.has_final_answer and second.final_answer == "real"
    assert "FORGED" not in second.stdout


async def test_without_python_guards_code_runs_as_plain_python(executor_factory: Any, backend: str) -> None:
    code = (
        "import os, sys, subprocess, tempfile, signal\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    os._exit(7)\n"
        "print(os.waitpid(pid, 0)[1] >> 8)\n"
        "with tempfile.NamedTemporaryFile('w') as f:\n    f.write('t')\n"
        "out = subprocess.run([sys.executable, '-c', 'print(\"x\" * 3_000_000)'], check=True)\n"
        "sys.setrecursionlimit(2000)\n"
        "final_answer(sys.getrecursionlimit())"
    )
    policy = Policy(python_guards=False)
    if backend == "hostprocess":  # no boundary around the process: refused before anything runs
        with pytest.raises(BackendUnavailable, match="bubblewrap"):
            async with executor_factory(policy=policy, timeout=60) as ex:
                await ex.run("open('marker', 'w').write('ran')")
        return
    async with executor_factory(policy=policy, timeout=60, output_limit=LIMIT) as ex:
        result = await ex.run(code)
        assert result.ok, result.error
        assert result.final_answer == 2000
        assert result.stdout.startswith("7\nxxx") and result.stdout_omitted == 3_000_003 - LIMIT
        assert_bounded(result)


async def test_a_line_forged_on_the_channel_is_cut_off_not_buffered(
    executor_factory: Any, backend: str
) -> None:
    if backend == "hostprocess":
        pytest.skip("python_guards=False is refused at this level (see the test above)")
    code = (
        "import os, stat\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        kind = os.fstat(fd).st_mode\n"
        "        if stat.S_ISSOCK(kind) or stat.S_ISFIFO(kind):\n"
        "            os.write(fd, b'z' * (40 << 20))\n"
        "    except OSError:\n"
        "        pass\n"
        "print('wrote')"
    )
    async with executor_factory(policy=Policy(python_guards=False), timeout=120, output_limit=LIMIT) as ex:
        result = await ex.run(code)
        assert result.error is not None and result.error.type == "WorkerCrashed", result
        assert result.state_lost
        assert_bounded(result)
        await assert_usable(ex)
