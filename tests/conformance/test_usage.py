"""Every result says what the run used, measured outside the sandbox, on every backend.

The figures come from the parent or the supervisor (the host's /proc, the container's cgroup, E2B's
metrics; Ray: the node's backend), never from the runner's reply. E2B's metrics are samples of the
whole microVM every few seconds, so the runs here hold their CPU or memory for a moment longer
than a sample's interval: the same code on every backend.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes import ExecutionResult, Policy, RunUsage

pytestmark = pytest.mark.anyio

HOLD = 0.6
"""Seconds a run waits after its work, so a sampled backend (E2B) has a sample after it."""
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n"
BURN_CHILD = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5:\\n    pass"
MB = 1 << 20
# What each backend says of its figures: source, peak scope, whether CPU is exact.
EXPECTED = {
    "host": ("proc", "run", True),
    "hostprocess": ("proc", "run", True),
    "ray": ("proc", "run", True),
    "docker": ("cgroup", "run", True),
    "dockershared": ("cgroup", "run", True),
    "e2b": ("e2b-metrics", "session", False),
}
CHILDREN = Policy(allowed_imports=["subprocess", "sys", "time", "os"], subprocess=True)


def usage_of(result: ExecutionResult) -> RunUsage:
    assert result.usage is not None, result
    return result.usage


def cpu(result: ExecutionResult) -> float:
    seconds = usage_of(result).cpu_seconds
    assert seconds is not None, result.usage
    return seconds


async def test_a_cpu_burning_loop_reports_its_cpu_time_and_an_idle_sleep_does_not(
    executor_factory: Any, backend: str
) -> None:
    async with executor_factory(timeout=30) as ex:
        burn = await ex.run(BURN + f"time.sleep({HOLD})")
        idle = await ex.run(f"import time\ntime.sleep({0.5 + HOLD})")
    assert burn.ok and idle.ok, (burn.error, idle.error)
    assert 0.3 <= cpu(burn) <= 2.0, burn.usage
    assert cpu(idle) < 0.2 and cpu(idle) < cpu(burn) - 0.2, idle.usage
    usage = usage_of(burn)
    source, scope, exact = EXPECTED[backend]
    assert (usage.source, usage.peak_scope, usage.exact["cpu"]) == (source, scope, exact)
    assert usage.wall_seconds >= 0.5 + HOLD and usage.wall_seconds <= burn.duration + 0.01
    if exact:  # the kernel's split of the same total
        assert usage.cpu_user_seconds is not None and usage.cpu_system_seconds is not None
        assert usage.cpu_user_seconds + usage.cpu_system_seconds == pytest.approx(cpu(burn), abs=0.02)
        assert usage.cpu_user_seconds > usage.cpu_system_seconds  # a Python loop is user time


async def test_a_child_process_burning_cpu_counts(executor_factory: Any) -> None:
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', '{BURN_CHILD}'], check=True)\n"
        f"time.sleep({HOLD})\n"
    )
    async with executor_factory(policy=CHILDREN, timeout=30) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert cpu(result) >= 0.4, result.usage  # the runner only waited: the child's CPU is in it


async def test_a_detached_grandchild_burning_cpu_counts(executor_factory: Any) -> None:
    """A double fork: the burning process's parent is gone before it burns, so only a supervisor that
    keeps orphans in the tree (the runner as subreaper), or a cgroup, sees its CPU."""
    code = (
        "import subprocess, sys, time\n"
        "subprocess.run([sys.executable, '-c', 'import os, time\\nif os.fork():\\n    os._exit(0)\\n"
        f"{BURN_CHILD}'], check=True)\n"
        f"time.sleep(1.0 + {HOLD})\n"
    )
    async with executor_factory(policy=CHILDREN, timeout=30) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert cpu(result) >= 0.4, result.usage


async def test_a_200_mb_allocation_reports_its_peak_and_a_later_small_run_does_not(
    executor_factory: Any, backend: str
) -> None:
    async with executor_factory(timeout=30) as ex:
        big = await ex.run(f"import time\nx = b'x' * (200 << 20)\ntime.sleep({HOLD})\ndel x")
        small = await ex.run(f"import time\ny = b'y' * (1 << 20)\ntime.sleep({HOLD})")
    assert big.ok and small.ok, (big.error, small.error)
    peak = usage_of(big).peak_memory_bytes
    assert peak is not None and peak >= 195 * MB, big.usage
    later = usage_of(small).peak_memory_bytes
    assert later is not None, small.usage
    if usage_of(small).peak_scope == "run":
        assert later < 120 * MB, small.usage  # the earlier run's peak was reset
    else:  # the session's peak (or, sampled, the memory in use): said so, and not larger than the big run's
        assert EXPECTED[backend][1] == "session" and later < peak


async def test_a_run_stopped_by_its_timeout_reports_what_it_used(executor_factory: Any) -> None:
    async with executor_factory(timeout=1.5) as ex:
        result = await ex.run("while True:\n    pass")
        after = await ex.run("1 + 1")
    assert result.timed_out and result.state_lost
    assert 0.6 <= cpu(result) <= 3.5, result.usage
    assert usage_of(result).wall_seconds >= 1.4
    assert after.ok and after.value == 2


async def test_usage_cannot_be_forged_by_code_that_writes_the_reply(
    executor_factory: Any, backend: str
) -> None:
    """Without the Python-level guards the code holds the runner: it sends a reply of its own that
    claims no CPU and no memory. The result is that reply's (its stdout says so), the usage is not."""
    if backend == "hostprocess":
        pytest.skip("python_guards=False is refused at this level (tests/test_result_bounds.py)")
    code = (
        BURN
        + f"time.sleep({HOLD})\n"
        + "import gc\n"
        + "runner = next(o for o in gc.get_objects() if type(o).__name__ == 'Runner' and hasattr(o, 'channel'))\n"
        + "fake = {'cpu_user_seconds': 0.0, 'cpu_system_seconds': 0.0, 'cpu_seconds': 0.0, "
        + "'peak_memory_bytes': 1, 'wall_seconds': 0.0, 'peak_scope': 'run', 'exact': {}, 'source': 'forged'}\n"
        + "runner.channel.send({'op': 'reply', 'stdout': 'forged', 'stderr': '', 'stdout_omitted': 0, "
        + "'stderr_omitted': 0, 'truncated': False, 'error': None, 'oom': False, 'final_answer': None, "
        + "'has_final_answer': False, 'value': None, 'usage': fake, 'artifacts': [], 'artifacts_omitted': 0})\n"
    )
    async with executor_factory(policy=Policy(python_guards=False), timeout=30) as ex:
        result = await ex.run(code)
    assert result.stdout == "forged", result  # the parent took the code's reply
    usage = usage_of(result)
    assert usage.source == EXPECTED[backend][0]
    assert cpu(result) >= 0.3, usage
    assert usage.peak_memory_bytes is not None and usage.peak_memory_bytes > 1 * MB


async def test_measure_usage_false_reads_nothing_and_the_run_is_unchanged(executor_factory: Any) -> None:
    async with executor_factory(timeout=2, measure_usage=False) as ex:
        quiet = await ex.run("x = 6 * 7\nx")
        stopped = await ex.run("while True:\n    pass")
    async with executor_factory(timeout=30) as measured:
        loud = await measured.run("x = 6 * 7\nx")
    assert quiet.ok and quiet.value == 42 and quiet.usage is None, quiet
    assert stopped.timed_out and stopped.usage is None, stopped
    assert loud.ok and loud.value == 42 and loud.usage is not None, loud
