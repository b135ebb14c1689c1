"""The host probe reads /proc twice a run, not four times: a run's figures start where the previous
run's reading ended (`UsageProbe.continues`). What that must never do: count a run twice, count a
run that was not measured, or let anything but a run sit between the two readings."""

from __future__ import annotations

import anyio
import pytest

from sandboxes import HostExecutor, Policy

pytestmark = pytest.mark.anyio

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4:\n    pass\n"
PLAIN = Policy(python_guards=False, allowed_imports=["*"])


def cpu(result: object) -> float:
    usage = getattr(result, "usage", None)
    assert usage is not None and usage.cpu_seconds is not None, result
    return float(usage.cpu_seconds)


async def test_a_run_after_a_burning_one_does_not_count_its_cpu() -> None:
    async with HostExecutor(timeout=30) as ex:
        burn = await ex.run(BURN)
        quiet = [await ex.run("print(1)") for _ in range(3)]
    assert cpu(burn) >= 0.3, burn.usage
    assert all(cpu(r) < 0.1 for r in quiet), [r.usage for r in quiet]
    assert all(r.usage is not None and r.usage.peak_scope == "run" for r in quiet)


async def test_a_run_not_measured_is_not_counted_in_the_next_measured_one() -> None:
    async with HostExecutor(timeout=30) as ex:
        await ex.run("print(1)")
        ex.measure_usage = False
        unmeasured = await ex.run(BURN)
        ex.measure_usage = True
        after = await ex.run("print(1)")
    assert unmeasured.usage is None
    assert cpu(after) < 0.1, after.usage


async def test_define_and_file_transfers_between_runs_start_the_next_reading_afresh() -> None:
    # A define whose value takes the runner a while to bind: its CPU is not the next run's.
    async with HostExecutor(timeout=30, policy=PLAIN) as ex:
        await ex.run("print(1)")
        await ex.send_variables({"rows": [[i, str(i)] for i in range(100_000)]})
        after_define = await ex.run("print(len(rows))")
        await ex.upload("data.bin", b"x" * (8 << 20))
        after_upload = await ex.run("print(1)")
    assert after_define.stdout == "100000\n"
    assert cpu(after_define) < 0.05, after_define.usage
    assert cpu(after_upload) < 0.05, after_upload.usage


async def test_background_work_between_runs_counts_in_the_next_run() -> None:
    # The documented meaning of the carried reading: from the end of the previous run to this one's
    # reply, so a thread the code left burning is counted (a fresh 'before' would have hidden it).
    async with HostExecutor(timeout=30, policy=PLAIN) as ex:
        started = await ex.run(
            "import threading, time\n"
            "def burn():\n"
            "    t = time.thread_time()\n"
            "    while time.thread_time() - t < 0.4:\n"
            "        pass\n"
            "worker = threading.Thread(target=burn)\n"
            "worker.start()\n"
        )
        await anyio.sleep(1.0)  # the thread is done before the next run starts
        finished = await ex.run("worker.join()\nprint('done')")
    assert started.ok and finished.stdout == "done\n", (started.error, finished.error)
    assert cpu(finished) >= 0.3, (started.usage, finished.usage)


async def test_a_child_of_a_thread_that_took_an_ended_threads_place_is_counted() -> None:
    # The probe lists the runner's threads afresh only when their count changed or one of those it
    # knows ended: here one thread ends and another starts in its place (the count stays), and the
    # new one's child burns CPU, alive at the reading. Its CPU is the run's.
    async with HostExecutor(timeout=30, policy=PLAIN) as ex:
        first = await ex.run(
            "import threading\n"
            "stop, hold = threading.Event(), threading.Event()\n"
            "old = threading.Thread(target=stop.wait)\n"
            "old.start()\n"
            "count = threading.active_count()\n"
        )
        await ex.run("print(1)")  # a reading with the old thread known
        replaced = await ex.run(
            "import subprocess, sys, time\n"
            "burn = 'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4:\\n"
            "    pass\\ntime.sleep(30)'\n"
            "def start_child():\n"
            "    child = subprocess.Popen([sys.executable, '-c', burn])\n"
            "    hold.wait()\n"
            "    child.kill()\n"
            "    child.wait()\n"
            "stop.set()\n"
            "old.join()\n"
            "new = threading.Thread(target=start_child)\n"
            "new.start()\n"
            "time.sleep(1.2)\n"
            "print(threading.active_count() == count)\n"
        )
        await ex.run("hold.set()\nnew.join()")
    assert first.ok and replaced.ok, (first.error, replaced.error)
    assert replaced.stdout == "True\n"  # the same number of threads at the reading
    assert cpu(replaced) >= 0.3, replaced.usage
