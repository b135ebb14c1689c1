"""Fork on the E2B backend, on the loopback stand-in driven by the unmodified SDK (docs/fork.md, E2B).

The fork contract itself runs on e2b in `tests/conformance/test_fork.py`. Here, what only E2B has: a
family lives in its parent's sandbox (which the stand-in sees alive until the family's last close, a
lost runner leaving it), and the fork relays in it. The stand-in's commands are local processes, so
their pids are this machine's.
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


async def test_a_family_lives_in_one_sandbox_until_its_last_close():
    parent = make(timeout=2)
    await parent.open()
    await parent.run("depth = 0")
    sandbox = parent.sandbox_id
    child = await parent.fork()
    grandchild = await child.fork()
    try:
        assert child.sandbox_id == sandbox and grandchild.sandbox_id == sandbox
        for code in ("while True:\n    pass", CRASH):
            assert (await grandchild.run(code)).state_lost
            assert sandbox in standin().running_ids(), "a lost runner leaves the sandbox"
            # its next session starts afresh in the same sandbox (its runner, not the VM, was lost)
            assert (await grandchild.run("print('again')")).stdout == "again\n"
            assert grandchild.sandbox_id == sandbox
        await child.close()  # the middle one first
        assert sandbox in standin().running_ids()
        await parent.close()
        assert sandbox in standin().running_ids()
        assert (await grandchild.run("print('last')")).stdout == "last\n"
    finally:
        await grandchild.close()
        await child.close()
        await parent.close()
    assert sandbox not in standin().running_ids(), "the family's last close kills the sandbox"


async def test_a_snapshot_opens_in_the_sandbox_and_the_sandbox_goes_with_its_executor():
    parent = make()
    await parent.open()
    await parent.run("counter = 10")
    sandbox = parent.sandbox_id
    snapshot = await parent.snapshot()
    async with open_executor("e2b", from_snapshot=snapshot) as opened:
        assert opened.sandbox_id == sandbox
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
