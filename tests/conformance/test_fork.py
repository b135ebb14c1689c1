"""The fork contract (`Executor.fork`, snapshots; docs/fork.md), written once and run against every
backend: a fork starts with a copy of its parent's state and files, then the two are independent
sessions (kills, limits, timeouts, files, tools) that share only what docs/fork.md says they share.

Where a test must see an effect outside the session it asks (a runner or its processes gone, a
directory removed), it asks another session of the same family that may open any file (`files="any"`): a family
shares its user and its container, sandbox or node on every backend, so that session sees the same
`/proc` and directories as the one it checks. Where the family lives (container, sandbox, node,
private user) and what is left after it, is each backend's own: `tests/backends/<name>/`.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import pytest
from support.tiers import BACKEND_MARKS, BACKEND_NAMES

from sandboxes import (
    ExecutorBusy,
    ExecutorClosed,
    ForkError,
    Limits,
    Policy,
    SyncExecutor,
    open_executor,
)

pytestmark = pytest.mark.anyio

POLICY = Policy(
    allowed_imports=["os", "posixpath", "signal", "subprocess", "threading", "time"], subprocess=True
)
OBSERVER = POLICY.model_copy(update={"files": "any"})
"""For the tests that look at processes and directories from a session of the same family."""
CRASH = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
ALIVE = (
    "import os, time\n"
    "def alive(pid):\n"
    "    try:\n"
    "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] not in 'ZT'\n"
    "    except OSError:\n"
    "        return False\n"
)


def backends(**defects: str) -> Any:
    """Every backend as the `backend` parameter, those named with a known defect as strict xfails (so a
    fix shows as an unexpected pass, and the mark must go)."""
    params = []
    for name in BACKEND_NAMES:
        marks = list(BACKEND_MARKS.get(name, []))
        if name in defects:
            marks.append(pytest.mark.xfail(strict=True, reason=f"defect: {defects[name]}"))
        params.append(pytest.param(name, id=name, marks=marks))
    return pytest.mark.parametrize("backend", params, indirect=True)


async def pid_of(ex: Any) -> int:
    result = await ex.run("import os\nprint(os.getpid())")
    assert result.error is None, result.error
    return int(result.stdout)


async def gone_within(observer: Any, pids: list[int], paths: list[str] = (), seconds: float = 10) -> str:  # type: ignore[assignment]
    """Ask `observer` (a session of the family) until `pids` no longer run (gone, zombies, or stopped:
    Docker stops a container's main runner while forks of it live) and `paths` are absent; what is left."""
    code = (
        ALIVE
        + f"pids, paths = {pids!r}, {list(paths)!r}\n"
        + f"deadline = time.monotonic() + {seconds}\n"
        + "while time.monotonic() < deadline:\n"
        + "    left = [p for p in pids if alive(p)] + [p for p in paths if os.path.exists(p)]\n"
        + "    if not left:\n"
        + "        break\n"
        + "    time.sleep(0.05)\n"
        + "print(left)"
    )
    result = await observer.run(code)
    assert result.error is None, result.error
    return result.stdout


async def test_state_and_files_are_copied_then_independent_both_ways(executor_factory: Any) -> None:
    async with executor_factory(timeout=20, policy=POLICY) as parent:
        await parent.run("import os\nx = 41\ndata = list(range(50_000))\nopen('a.txt', 'w').write('parent')")
        await parent.upload("sub/b.bin", b"\x00\x01" * 1000)
        async with await parent.fork() as child:
            report = child.fork_report
            seen = await child.run(
                "print(x, len(data), open('a.txt').read(), open('sub/b.bin', 'rb').read()[:2])\n"
                "print(os.getcwd())"
            )
            await child.run(
                "x = 1\nopen('a.txt', 'w').write('child')\nopen('only-child.txt', 'w').write('c')"
            )
            await parent.run("x = 2\nopen('only-parent.txt', 'w').write('p')")
            listing = "print(x, open('a.txt').read(), sorted(os.listdir('.')), os.getcwd())"
            in_child = (await child.run(listing)).stdout.split(" /")
            in_parent = (await parent.run(listing)).stdout.split(" /")
            # the files API reaches each session's own directory
            downloaded = (await child.download("a.txt"), await parent.download("a.txt"))
            await child.upload("up.txt", b"mine")
            uploaded = (
                await child.run("print(open('up.txt').read())"),
                await parent.run("print(os.path.exists('up.txt'))"),
            )
    assert report is not None and (report.files_copied, report.bytes_copied) == (2, 2006), report
    assert seen.error is None and seen.stdout.splitlines()[0] == "41 50000 parent b'\\x00\\x01'", seen
    assert in_child[0] == "1 child ['a.txt', 'only-child.txt', 'sub']"
    assert in_parent[0] == "2 parent ['a.txt', 'only-parent.txt', 'sub']"
    assert in_child[1] != in_parent[1], "each session has its own directory"
    assert downloaded == (b"child", b"parent")
    assert (uploaded[0].stdout, uploaded[1].stdout) == ("mine\n", "False\n")


@backends()
async def test_a_fork_of_a_fork_lives_on_whichever_of_its_family_closes_first(executor_factory: Any) -> None:
    parent = await executor_factory(timeout=20, policy=POLICY).open()
    await parent.run("trail = ['parent']")
    child = await parent.fork()
    await child.run("trail.append('child')")
    grandchild = await child.fork()
    try:
        pids = {await pid_of(ex) for ex in (parent, child, grandchild)}
        await child.close()  # the middle one first: the others go on
        middle = await grandchild.run("trail.append('grandchild')\nprint(trail)")
        kept = await parent.run("print(trail)")
        await parent.close()
        last = await grandchild.run("print(len(trail))")
    finally:
        await grandchild.close()
        await parent.close()
    assert len(pids) == 3
    assert middle.stdout == "['parent', 'child', 'grandchild']\n"
    assert kept.stdout == "['parent']\n"
    assert last.stdout == "3\n" and not last.state_lost
    assert grandchild.fork_report is not None and grandchild.fork_report.seconds > 0


async def test_a_timeout_or_crash_in_the_child_leaves_the_parent_untouched(executor_factory: Any) -> None:
    async with executor_factory(timeout=4, policy=OBSERVER) as parent:
        await parent.run("x = 'kept'")
        outcomes = []
        for code in ("while True:\n    pass", CRASH):
            async with await parent.fork() as child:
                runner = await pid_of(child)
                lost = await child.run(code)
                left = await gone_within(parent, [runner], seconds=3)
                survived = await parent.run("print(x)")
                fresh = await child.run("print('fresh' if 'x' not in dir() else x)")
                outcomes.append((lost, left, survived, fresh))
    (timed_out, *_), (crashed, *_) = outcomes
    assert timed_out.timed_out and timed_out.state_lost
    assert crashed.state_lost and crashed.error is not None and crashed.error.type == "WorkerCrashed"
    for _lost, left, survived, fresh in outcomes:
        assert left == "[]\n", f"the child's runner outlived its loss: {left}"
        assert survived.ok and survived.stdout == "kept\n" and not survived.state_lost
        assert fresh.stdout == "fresh\n"  # the child's own fresh session, not the parent's


async def test_a_timeout_set_on_the_child_applies_to_the_child(executor_factory: Any) -> None:
    async with executor_factory(timeout=10) as parent:
        async with await parent.fork() as child:
            child.timeout = 1.0
            stuck = await child.run("while True:\n    pass")
    assert stuck.timed_out
    assert stuck.duration < 8, f"the child ran {stuck.duration:.1f} s: its own 1 s timeout did not apply"


async def test_a_timeout_in_the_parent_leaves_its_fork_running(executor_factory: Any) -> None:
    async with executor_factory(timeout=2) as parent:
        await parent.run("x = 'state'")
        async with await parent.fork() as child:
            stuck = await parent.run("while True:\n    pass")
            kept = await child.run("print(x)")
            fresh = await parent.run("print('fresh' if 'x' not in dir() else x)")
    assert stuck.timed_out and stuck.state_lost
    assert kept.stdout == "state\n" and not kept.state_lost
    assert fresh.stdout == "fresh\n"


async def test_closing_the_child_ends_its_processes_and_directory_and_leaves_the_parent(
    executor_factory: Any,
) -> None:
    async with executor_factory(timeout=20, policy=OBSERVER) as parent:
        await parent.run("x = 5")
        child = await parent.fork()
        started = await child.run(
            "import os, subprocess\nbusy = subprocess.Popen(['sleep', '300'])\n"
            "print(busy.pid, os.getpid(), os.getcwd())"
        )
        busy, runner, workdir = started.stdout.split()
        await child.close()
        left = await gone_within(parent, [int(busy), int(runner)], [workdir])
        for _ in range(2):  # and forking again goes on as before
            async with await parent.fork() as again:
                await again.run("x = 6")
        kept = await parent.run("print(x)")
    assert left == "[]\n", f"left after the child's close: {left}"
    assert kept.stdout == "5\n" and not kept.state_lost


async def test_closing_the_parent_ends_its_processes_and_leaves_the_child(executor_factory: Any) -> None:
    parent = await executor_factory(timeout=20, policy=OBSERVER).open()
    started = await parent.run(
        "import os, subprocess\nx = 1\nsleeper = subprocess.Popen(['sleep', '300'])\nprint(sleeper.pid, os.getpid())"
    )
    sleeper, runner = (int(pid) for pid in started.stdout.split())
    child = await parent.fork()
    try:
        await parent.close()
        left = await gone_within(child, [sleeper, runner])
        after = await child.run("x += 1\nprint(x)")
    finally:
        await child.close()
    assert left == "[]\n", f"the parent's processes outlived its close: {left}"
    assert after.stdout == "2\n" and not after.state_lost


@backends()
async def test_limits_apply_to_the_child(executor_factory: Any) -> None:
    policy = Policy(limits=Limits(memory_mb=512))
    async with executor_factory(timeout=20, policy=policy) as parent:
        await parent.run("small = 1")
        async with await parent.fork() as child:
            hog = await child.run("big = 'a' * (1024 * 1024 * 1024 * 2)")
            after = await child.run("print('fine')")
        kept = await parent.run("print(small)")
    assert hog.oom and hog.error is not None, hog
    assert after.stdout == "fine\n"
    assert kept.stdout == "1\n" and not kept.state_lost


async def test_what_cannot_cross_a_fork_is_reported(executor_factory: Any) -> None:
    async with executor_factory(timeout=20, policy=POLICY) as parent:
        await parent.run(
            "import threading\nstop = threading.Event()\n"
            "worker = threading.Thread(target=stop.wait, daemon=True)\nworker.start()"
        )
        async with await parent.fork() as child:
            report = child.fork_report
            alive = await child.run("print(worker.is_alive())")
        await parent.run("stop.set()")
    assert report is not None and report.threads_not_copied == 1
    assert report.files_copied == 0 and report.bytes_copied == 0
    assert alive.stdout in ("True\n", "False\n")  # the Thread object came along; its thread did not


async def test_the_parents_directory_by_its_absolute_path_stays_out_of_reach(executor_factory: Any) -> None:
    async with executor_factory(timeout=20, policy=POLICY) as parent:
        await parent.run("import os\nhere = os.getcwd()\nopen('secret.txt', 'w').write('parent')")
        async with await parent.fork() as child:
            where = await child.run("print(os.getcwd() != here)")
            read = await child.run("print(open(here + '/secret.txt').read())")
            write = await child.run("open(here + '/secret.txt', 'w').write('child')")
            own = await child.run("print(open('secret.txt').read())")
        kept = await parent.run("print(open('secret.txt').read())")
    assert where.stdout == "True\n"
    for attempt in (read, write):
        assert attempt.error is not None and attempt.error.type == "PermissionError", attempt
    assert own.stdout == "parent\n"  # the child's own copy
    assert kept.stdout == "parent\n"


async def test_tools_called_in_a_fork_run_in_this_process_and_answer_their_own_run(
    executor_factory: Any,
) -> None:
    callers: list[int] = []

    async def echo(value: int) -> int:
        callers.append(os.getpid())
        await anyio.sleep(0.2)  # both runs' calls are in flight at once
        return value * 10

    results: dict[str, Any] = {}

    async def call(name: str, ex: Any, value: int) -> None:
        results[name] = await ex.run(f"print(echo({value}))\nfinal_answer({name!r})")

    async with executor_factory(timeout=20, tools={"echo": echo}) as parent:
        async with await parent.fork() as child:
            async with anyio.create_task_group() as group:
                group.start_soon(call, "parent", parent, 1)
                group.start_soon(call, "child", child, 2)
    assert results["parent"].stdout == "10\n" and results["parent"].final_answer == "parent", results
    assert results["child"].stdout == "20\n" and results["child"].final_answer == "child", results
    assert callers == [os.getpid()] * 2


async def test_fork_is_refused_while_busy_closed_or_lost_and_the_parent_goes_on(
    executor_factory: Any,
) -> None:
    parent = executor_factory(timeout=20, policy=POLICY)
    with pytest.raises(ExecutorClosed):
        await parent.fork()
    await parent.open()
    try:
        await parent.run("x = 1")
        outcome: list[Any] = []

        async def run() -> None:
            outcome.append(await parent.run("import time\ntime.sleep(1.5)\nprint(x)"))

        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await anyio.sleep(0.5)
            with pytest.raises(ExecutorBusy, match="in progress"):
                await parent.fork()
        await parent.run(CRASH)  # the session is gone until the next run starts a fresh one
        with pytest.raises(ForkError, match="lost"):
            await parent.fork()
        on = await parent.run("print('on')")
    finally:
        await parent.close()
    with pytest.raises(ExecutorClosed):
        await parent.fork()
    assert outcome[0].stdout == "1\n" and not outcome[0].state_lost, outcome
    assert on.stdout == "on\n"


@backends()
async def test_snapshots_open_forks_and_close_with_their_executor(executor_factory: Any) -> None:
    parent = await executor_factory(timeout=20).open()
    try:
        await parent.run("counter = 10")
        snapshot = await parent.snapshot()
        await parent.run("counter = 99")  # later changes do not reach the snapshot
        outputs = []
        for _ in range(2):
            async with open_executor(snapshot.backend, from_snapshot=snapshot) as opened:
                outputs.append((await opened.run("counter += 1\nprint(counter)")).stdout)
        with pytest.raises(TypeError, match="snapshot's options"):
            open_executor(snapshot.backend, from_snapshot=snapshot, timeout=3)
        kept = await parent.run("print(counter)")
    finally:
        await parent.close()
    assert snapshot.closed
    with pytest.raises(ExecutorClosed, match="snapshot was closed"):
        open_executor(snapshot.backend, from_snapshot=snapshot)
    assert outputs == ["11\n", "11\n"]
    assert kept.stdout == "99\n"


def test_the_sync_facade_forks(executor_factory: Any) -> None:
    with SyncExecutor(executor_factory(timeout=20)) as parent:
        parent.run("x = 3")
        with parent.fork() as child:
            child.run("x = 4")
            seen = child.run("print(x)").stdout
        kept = parent.run("print(x)").stdout
    assert (seen, kept) == ("4\n", "3\n")
