"""Fork on the E2B backend, on the loopback stand-in driven by the unmodified SDK (docs/fork.md, E2B).

A forked session lives in its parent's sandbox: each test proves an effect there (processes that do
or do not run, directories that do or do not exist, sandboxes the stand-in sees alive), not only what
the client reports. The stand-in's commands are local processes, so their pids are this machine's.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
import pytest
from support.backend_e2b import make_executor, standin, unavailable

from sandboxes import Policy, open_executor
from sandboxes.backends.e2b import E2BExecutor

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.e2b,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
]

POLICY = Policy(allowed_imports=["os", "posixpath", "signal", "subprocess", "time"], subprocess=True)
CRASH = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"


def make(**options: Any) -> E2BExecutor:
    options.setdefault("timeout", 20)
    options.setdefault("policy", POLICY)
    return make_executor(**options)


def running(pid: int) -> bool:
    """Whether local process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def eventually(predicate: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        await anyio.sleep(0.05)
    return bool(predicate())


async def pid_of(ex: E2BExecutor) -> int:
    result = await ex.run("import os\nprint(os.getpid())")
    assert result.error is None, result.error
    return int(result.stdout)


async def test_state_and_files_are_copied_then_independent_both_ways():
    async with make() as parent:
        await parent.run("x = 41\ndata = list(range(50_000))\nopen('a.txt', 'w').write('parent')")
        async with await parent.fork() as child:
            assert child.sandbox_id == parent.sandbox_id, "a fork lives in its parent's sandbox"
            assert child.fork_report is not None and child.fork_report.files_copied == 1
            seen = await child.run("print(x, len(data), open('a.txt').read())")
            assert seen.stdout == "41 50000 parent\n"
            await child.run("x = 1\nopen('a.txt', 'w').write('child')")
            await parent.run("x = 2\nopen('only-parent.txt', 'w').write('p')")
            in_child = await child.run("import os\nprint(x, open('a.txt').read(), sorted(os.listdir('.')))")
            in_parent = await parent.run("import os\nprint(x, open('a.txt').read(), sorted(os.listdir('.')))")
            assert in_child.stdout == "1 child ['a.txt']\n"
            assert in_parent.stdout == "2 parent ['a.txt', 'only-parent.txt']\n"
            assert await child.download("a.txt") == b"child"
            assert await parent.download("a.txt") == b"parent"
            await child.upload("up.txt", b"mine")
            assert (await child.run("print(open('up.txt').read())")).stdout == "mine\n"
            assert (await parent.run("print(os.path.exists('up.txt'))")).stdout == "False\n"


async def test_a_childs_timeout_or_crash_leaves_the_parent_and_its_sandbox():
    async with make(timeout=2) as parent:
        await parent.run("x = 'kept'")
        sandbox = parent.sandbox_id
        for code in ("while True:\n    pass", CRASH):
            child = await parent.fork()
            async with child:
                pid = await pid_of(child)
                result = await child.run(code)
                assert result.state_lost
                assert await eventually(lambda pid=pid: not running(pid))
                assert sandbox in standin().running_ids(), "the sandbox stays"
                result = await parent.run("print(x)")
                assert result.stdout == "kept\n" and not result.state_lost
                # the child starts afresh in the same sandbox (its runner, not the VM, was lost)
                assert (await child.run("print('again')")).stdout == "again\n"
                assert child.sandbox_id == sandbox


async def test_closing_the_parent_leaves_the_child_and_the_last_close_kills_the_sandbox():
    parent = make()
    await parent.open()
    await parent.run("x = 1\nimport subprocess\nsleeper = subprocess.Popen(['sleep', '300'])")
    sandbox = parent.sandbox_id
    sleeper = int((await parent.run("print(sleeper.pid)")).stdout)
    root = await pid_of(parent)
    child = await parent.fork()
    try:
        await parent.close()
        assert await eventually(lambda: not running(root) and not running(sleeper)), (
            "the parent's runner and what it started end with it"
        )
        assert sandbox in standin().running_ids()
        result = await child.run("x += 1\nprint(x)")
        assert result.stdout == "2\n" and not result.state_lost
        forked = await pid_of(child)
    finally:
        await child.close()
    assert sandbox not in standin().running_ids(), "the family's last close kills the sandbox"
    assert await eventually(lambda: not running(forked))


async def test_closing_the_child_ends_its_processes_and_directory_and_leaves_the_parent():
    async with make() as parent:
        await parent.run("x = 5")
        sandbox = parent.sandbox_id
        assert sandbox is not None
        child = await parent.fork()
        result = await child.run(
            "import os, subprocess\nbusy = subprocess.Popen(['sleep', '300'])\nprint(busy.pid, os.getcwd())"
        )
        busy, workdir = result.stdout.split()
        forked = await pid_of(child)
        assert os.path.isdir(workdir)
        await child.close()
        assert await eventually(lambda: not running(int(busy)) and not running(forked))
        assert await eventually(lambda: not os.path.exists(workdir)), "its copy is removed"
        assert (await parent.run("print(x)")).stdout == "5\n"
        assert sandbox in standin().running_ids()


async def test_a_fork_of_a_fork_and_nothing_left_after_all_close():
    parent = make()
    await parent.open()
    await parent.run("depth = 0")
    sandbox = parent.sandbox_id
    child = await parent.fork()
    await child.run("depth += 1")
    grandchild = await child.fork()
    assert grandchild.sandbox_id == sandbox
    assert (await grandchild.run("depth += 1\nprint(depth)")).stdout == "2\n"
    pids = [await pid_of(ex) for ex in (parent, child, grandchild)]
    assert len(set(pids)) == 3
    await child.close()
    assert (await grandchild.run("print(depth)")).stdout == "2\n"
    await parent.close()
    assert (await grandchild.run("print(depth + 1)")).stdout == "3\n"
    assert sandbox in standin().running_ids()
    await grandchild.close()
    assert sandbox not in standin().running_ids()
    assert await eventually(lambda: not any(running(pid) for pid in pids)), "no process left"


async def test_snapshots_open_forks_in_the_sandbox_and_close_with_their_executor():
    parent = make()
    await parent.open()
    await parent.run("counter = 10")
    sandbox = parent.sandbox_id
    snapshot = await parent.snapshot()
    await parent.run("counter = 99")
    outputs = []
    for _ in range(2):
        async with open_executor("e2b", from_snapshot=snapshot) as opened:
            assert opened.sandbox_id == sandbox
            outputs.append((await opened.run("counter += 1\nprint(counter)")).stdout)
    assert outputs == ["11\n", "11\n"]
    assert sandbox in standin().running_ids()
    await parent.close()
    assert snapshot.closed
    assert sandbox not in standin().running_ids(), "the snapshot's sandbox goes with its executor"


def relays(sandbox_id: str) -> int:
    """How many `forkrelay.py relay` processes run in the stand-in's sandbox (not zombies)."""
    marker = f"HOME={standin().home_dir(sandbox_id)}".encode()
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                command = handle.read().rstrip(b"\0").split(b"\0")
            with open(f"/proc/{name}/environ", "rb") as handle:
                environment = handle.read().split(b"\0")
        except OSError:
            continue
        if marker in environment and command[-1:] == [b"relay"] and running(int(name)):
            count += any(part.endswith(b"forkrelay.py") for part in command)
    return count


async def test_relays_end_with_their_sessions():
    """Each fork's relay, and the spare a forking session keeps for its next fork, end with it."""
    async with make() as parent:
        await parent.run("x = 1")
        sandbox = parent.sandbox_id
        assert sandbox is not None
        assert relays(sandbox) == 0, "no relay before the first fork"
        child = await parent.fork()
        assert await eventually(lambda: relays(sandbox) == 2)  # the child's, and the parent's spare
        grandchild = await child.fork()
        assert await eventually(lambda: relays(sandbox) == 4)
        again = await parent.fork()  # takes the parent's spare, starts the next one
        assert (await again.run("print(x)")).stdout == "1\n"
        assert await eventually(lambda: relays(sandbox) == 5)
        await child.close()
        assert await eventually(lambda: relays(sandbox) == 3), "the child's relay and spare end with it"
        assert (await grandchild.run("print(x)")).stdout == "1\n"
        await grandchild.close()
        await again.close()
        assert await eventually(lambda: relays(sandbox) == 1)  # the parent's spare, for its next fork
    assert await eventually(lambda: relays(sandbox) == 0)
