"""Forking a live session (`Executor.fork`, snapshots) on the host backend, at both isolation levels:
a fork starts with a copy of the parent's state and files, then the two are independent sessions
(kills, limits, timeouts, files) that share only what docs/fork.md says they share."""

from __future__ import annotations

import os

import anyio
import pytest
from support.wire_helpers import pids_of

from sandboxes import (
    ExecutorBusy,
    ExecutorClosed,
    ForkError,
    HostExecutor,
    Limits,
    Policy,
    SyncExecutor,
    open_executor,
)

pytestmark = pytest.mark.anyio

POLICY = Policy(allowed_imports=["os", "signal", "threading", "time"], subprocess=True)
CRASH = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"


@pytest.fixture(params=["namespaces", "process"])
def isolation(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make(isolation: str, **options: object) -> HostExecutor:
    return HostExecutor(isolation=isolation, timeout=10, policy=POLICY, **options)  # type: ignore[arg-type]


async def test_state_and_files_are_copied_then_independent_both_ways(isolation: str) -> None:
    async with make(isolation) as parent:
        await parent.run("import os\nx = 41\ndata = list(range(50_000))\nopen('a.txt', 'w').write('parent')")
        async with await parent.fork() as child:
            seen = await child.run("print(x, len(data), open('a.txt').read())")
            await child.run(
                "x = 1\nopen('a.txt', 'w').write('child')\nopen('only-child.txt', 'w').write('c')"
            )
            await parent.run("x = 2\nopen('only-parent.txt', 'w').write('p')")
            in_child = await child.run("print(x, open('a.txt').read(), sorted(os.listdir('.')))")
            in_parent = await parent.run("print(x, open('a.txt').read(), sorted(os.listdir('.')))")
    assert seen.stdout == "41 50000 parent\n"
    assert in_child.stdout == "1 child ['a.txt', 'only-child.txt']\n"
    assert in_parent.stdout == "2 parent ['a.txt', 'only-parent.txt']\n"


async def test_a_fork_of_a_fork_and_closing_the_parent_leaves_the_children_running(isolation: str) -> None:
    parent = make(isolation)
    await parent.open()
    await parent.run("trail = ['parent']")
    child = await parent.fork()
    await child.run("trail.append('child')")
    grandchild = await child.fork()
    await parent.close()
    await child.close()
    async with grandchild:
        result = await grandchild.run("trail.append('grandchild')\nprint(trail)")
    assert result.stdout == "['parent', 'child', 'grandchild']\n"
    assert grandchild.fork_report is not None and grandchild.fork_report.seconds > 0


async def test_a_timeout_or_crash_in_the_child_leaves_the_parent_untouched(isolation: str) -> None:
    async with make(isolation) as parent:
        await parent.run("x = 'kept'")
        async with await parent.fork() as child:
            child.timeout = 1.0
            timed_out = await child.run("while True:\n    pass")
            after_timeout = await child.run("print('fresh' if 'x' not in dir() else x)")
        async with await parent.fork() as child:
            crashed = await child.run(CRASH)
        survived = await parent.run("print(x)")
    assert timed_out.timed_out and timed_out.state_lost
    assert after_timeout.stdout == "fresh\n"  # the child's own fresh session, not the parent's
    assert crashed.error is not None and crashed.error.type == "WorkerCrashed"
    assert survived.ok and survived.stdout == "kept\n" and not survived.state_lost


async def test_closing_the_child_leaves_the_parent_and_its_processes_running(isolation: str) -> None:
    async with make(isolation) as parent:
        await parent.run("import threading, time\nx = 5")
        for _ in range(3):
            async with await parent.fork() as child:
                await child.run("x = 6")
        result = await parent.run("print(x)")
    assert result.stdout == "5\n" and not result.state_lost


async def test_limits_apply_to_the_child() -> None:
    policy = Policy(limits=Limits(memory_mb=256))
    async with HostExecutor(timeout=10, policy=policy) as parent:
        await parent.run("small = 1")
        async with await parent.fork() as child:
            result = await child.run("big = bytearray(400 * 1024 * 1024)")
            after = await child.run("print(small)")
    assert result.error is not None and result.error.type == "MemoryError" and result.oom
    assert after.stdout == "1\n"


async def test_what_cannot_cross_a_fork_is_reported(isolation: str) -> None:
    async with make(isolation) as parent:
        await parent.run(
            "import threading, time\nstop = threading.Event()\n"
            "worker = threading.Thread(target=stop.wait, daemon=True)\nworker.start()"
        )
        async with await parent.fork() as child:
            report = child.fork_report
            alive = await child.run("print(worker.is_alive())")
        await parent.run("stop.set()")
    assert report is not None and report.threads_not_copied == 1
    assert report.files_copied == 0 and report.bytes_copied == 0
    assert alive.stdout in ("True\n", "False\n")  # the Thread object came along; its thread did not


async def test_the_parents_directory_by_its_absolute_path_stays_out_of_reach(isolation: str) -> None:
    async with make(isolation) as parent:
        await parent.run("import os\nhere = os.getcwd()\nopen('secret.txt', 'w').write('parent')")
        async with await parent.fork() as child:
            where = await child.run("print(os.getcwd() != here)")
            write = await child.run("open(here + '/secret.txt', 'w').write('child')")
        kept = await parent.run("print(open('secret.txt').read())")
    assert where.stdout == "True\n"
    assert write.error is not None and write.error.type == "PermissionError"
    assert kept.stdout == "parent\n"


async def test_tools_called_in_a_child_run_in_the_parent_process_for_that_child() -> None:
    calls: list[int] = []

    def record(n: int) -> int:
        calls.append(n)
        return n * 2

    async with HostExecutor(timeout=10, tools={"record": record}) as parent:
        async with await parent.fork() as child:
            result = await child.run("print(record(21))\nfinal_answer('done')")
    assert result.stdout == "42\n" and result.final_answer == "done" and calls == [21]


async def test_fork_is_refused_while_busy_closed_or_lost_and_the_parent_goes_on() -> None:
    parent = HostExecutor(timeout=10, policy=POLICY)
    with pytest.raises(ExecutorClosed):
        await parent.fork()
    await parent.open()
    async with anyio.create_task_group() as group:
        group.start_soon(parent.run, "import time\ntime.sleep(1)")
        await anyio.sleep(0.3)
        with pytest.raises(ExecutorBusy, match="in progress"):
            await parent.fork()
    await parent.run(CRASH)  # the session is gone until the next run starts a fresh one
    with pytest.raises(ForkError, match="lost"):
        await parent.fork()
    assert (await parent.run("print('on')")).stdout == "on\n"
    await parent.close()
    with pytest.raises(ExecutorClosed):
        await parent.fork()


async def test_a_session_with_its_own_sandbox_refuses_with_the_reason(tmp_path: object) -> None:
    async with HostExecutor(isolation="namespaces", timeout=10, workdir=str(tmp_path)) as parent:
        with pytest.raises(ForkError, match="sandbox of its own"):
            await parent.fork()
        assert (await parent.run("print(1)")).stdout == "1\n"


async def test_nothing_is_left_after_both_close() -> None:
    parent = HostExecutor(timeout=10, policy=POLICY)
    await parent.open()
    await parent.run("import threading\nx = 1")
    child = await parent.fork()
    await child.run("x = 2")
    uid = parent.session.worker.uid  # type: ignore[union-attr]
    workdirs = [parent.session.worker.workdir, child.session.worker.workdir]  # type: ignore[union-attr]
    await child.close()
    if uid is not None:
        assert pids_of(uid), "the parent's runner must outlive its child's close"
    await parent.close()
    await parent.wait_closed()  # the last close of the family sweeps the user, off the caller's path
    if uid is not None:
        assert not pids_of(uid)
    assert not any(os.path.exists(path) for path in workdirs)


async def test_snapshots_open_forks_and_close_with_their_executor() -> None:
    parent = HostExecutor(timeout=10, policy=POLICY)
    await parent.open()
    await parent.run("counter = 10")
    snapshot = await parent.snapshot()
    await parent.run("counter = 99")  # later changes do not reach the snapshot
    outputs = []
    for _ in range(2):
        async with open_executor("host", from_snapshot=snapshot) as opened:
            outputs.append((await opened.run("counter += 1\nprint(counter)")).stdout)
    with pytest.raises(TypeError, match="snapshot's options"):
        open_executor("host", from_snapshot=snapshot, timeout=3)
    await parent.close()
    assert snapshot.closed
    with pytest.raises(ExecutorClosed, match="snapshot was closed"):
        open_executor("host", from_snapshot=snapshot)
    assert outputs == ["11\n", "11\n"]


def test_the_sync_facade_forks() -> None:
    with SyncExecutor(HostExecutor(timeout=10)) as parent:
        parent.run("x = 3")
        with parent.fork() as child:
            child.run("x = 4")
            seen = child.run("print(x)").stdout
        kept = parent.run("print(x)").stdout
    assert (seen, kept) == ("4\n", "3\n")


async def test_unrelated_sessions_stay_separated_from_a_fork_at_the_os_layer() -> None:
    # Without the Python guards only the OS boundary holds: a fork shares its parent's user, but an
    # unrelated session still cannot read, write or signal into the fork's files and processes.
    unguarded = Policy(python_guards=False)
    async with HostExecutor(isolation="namespaces", timeout=10, policy=unguarded) as parent:
        await parent.run("open('secret.txt', 'w').write('family')")
        async with (
            await parent.fork() as child,
            HostExecutor(isolation="namespaces", timeout=10, policy=unguarded) as stranger,
        ):
            where = (await child.run("import os\nprint(os.getcwd(), os.getpid())")).stdout.split()
            workdir, pid = where[0], int(where[1])
            probe = (
                "import os\n"
                "for attempt in ('read', 'write', 'signal'):\n"
                "    try:\n"
                f"        if attempt == 'read': open({workdir!r} + '/secret.txt').read()\n"
                f"        elif attempt == 'write': open({workdir!r} + '/planted.txt', 'w').write('x')\n"
                f"        else: os.kill({pid}, 0)\n"
                "        print(attempt, 'reached')\n"
                "    except OSError as e:\n"
                "        print(attempt, type(e).__name__)"
            )
            attempts = await stranger.run(probe)
            listing = await child.run("print(sorted(os.listdir('.')))")
            shared = await child.run(f"print(open({workdir!r} + '/secret.txt').read())")
    assert "reached" not in attempts.stdout, attempts.stdout
    assert attempts.stdout.count("PermissionError") + attempts.stdout.count("ProcessLookupError") == 3
    assert listing.stdout == "['secret.txt']\n"  # nothing was planted
    assert shared.stdout == "family\n"  # (the control: the fork itself reads its own copy)
