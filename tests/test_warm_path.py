"""The warm path's caches and kept objects change nothing a run can see.

A snippet run again reuses its static check's verdict (parent, per policy and tool names) and its
compiled cell (runner, per session), and the runner keeps its sys.stdout/sys.stderr from run to run.
Each test below fails if one of them leaks a previous run into this one: a traceback naming an
earlier cell, a value computed from the old namespace, a verdict of another policy, output that an
earlier run left in a stream's buffer or a stream the code replaced or reconfigured.
"""

from __future__ import annotations

import pytest

from sandboxes import Policy

pytestmark = pytest.mark.anyio

SYS_POLICY = Policy(allowed_imports=["os", "sys", "io"])


async def test_a_snippet_run_again_names_its_own_cell_and_reads_the_current_namespace(executor_factory):
    code = "def f():\n    return 1 / n\nf()"
    async with executor_factory(timeout=20) as ex:
        await ex.run("n = 0")
        first = await ex.run(code)
        second = await ex.run(code)
        await ex.run("n = 4")
        third = await ex.run(code)
    assert first.error is not None and second.error is not None
    assert first.error.type == second.error.type == "ZeroDivisionError"
    # every frame (the module's and the function's) names the cell that ran, not the first one
    assert first.error.traceback.count('File "<cell 2>"') == 2, first.error.traceback
    assert second.error.traceback.count('File "<cell 3>"') == 2, second.error.traceback
    assert "<cell 2>" not in second.error.traceback
    assert second.error.line == 2 and "return 1 / n" in second.error.traceback
    assert third.ok and third.value == 0.25


async def test_a_cached_verdict_belongs_to_its_policy(executor_factory):
    code = "import os\nos.getpid() > 0"
    async with executor_factory(timeout=20) as strict:
        refused = [await strict.run(code) for _ in range(2)]
    async with executor_factory(timeout=20, policy=SYS_POLICY) as lenient:
        allowed = await lenient.run(code)
    assert [r.error.type if r.error else None for r in refused] == ["PolicyViolation"] * 2
    assert refused[0].error == refused[1].error
    assert allowed.ok and allowed.value is True, allowed


async def test_output_left_in_a_broken_stream_does_not_reach_the_next_run(executor_factory):
    # The write fails at the flush (fd 1 closed), so the text stays in the stream's buffer: a kept
    # stream would write it at the next run's first flush.
    async with executor_factory(timeout=20, policy=SYS_POLICY) as ex:
        await ex.run("import os, sys\nos.close(1)\nsys.stdout.write('stale' * 10)")
        after = await ex.run("print('fresh')")
    assert after.ok and after.stdout == "fresh\n", after


async def test_a_replaced_or_reconfigured_stdout_is_replaced_for_the_next_run(executor_factory):
    async with executor_factory(timeout=20, policy=SYS_POLICY) as ex:
        await ex.run("import io, sys\nsys.stdout = io.StringIO()\nprint('hidden')")
        replaced = await ex.run("print('one')")
        await ex.run("import sys\nsys.stdout.reconfigure(line_buffering=False, errors='strict')")
        reconfigured = await ex.run("import sys\nprint('two', sys.stdout.line_buffering, sys.stdout.errors)")
        await ex.run("import sys\nsys.stdout.detach()")
        detached = await ex.run("print('three')")
    assert replaced.stdout == "one\n", replaced
    assert reconfigured.stdout == "two True backslashreplace\n", reconfigured
    assert detached.ok and detached.stdout == "three\n", detached


def test_the_static_check_cache_keeps_policies_and_tool_names_apart() -> None:
    strict, lenient = Policy(), Policy(allowed_imports=["os"])
    for _ in range(2):
        assert strict.check("import os") is not None
        assert lenient.check("import os") is None
        assert strict.check("input('x')") is not None  # a banned builtin...
        assert strict.check("input('x')", ["input"]) is None  # ...unless a tool has that name
    verdict = strict.check("import os")
    assert verdict is not None
    verdict.message = "changed by the caller"
    again = strict.check("import os")
    assert again is not None and again.message.startswith("import of 'os' is not allowed")
