"""The host backend's fork server being replaced (`sandboxes/backends/host/process.py`, `ForkServer`).

A fork server that died (killed from outside, out of memory) is replaced by a new one on the next
open. At the ``process`` level the sessions it had forked outlive it (they are their own process
groups, run as their own users): they must keep their working directories, which live under the old
server's base directory, and keep running. Real fork servers and sessions throughout.
"""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from sandboxes import HostExecutor
from sandboxes.backends.host import executor as host
from sandboxes.backends.host import process
from sandboxes.backends.host.process import HostWorker
from sandboxes.backends.host.reap import REAPER

pytestmark = pytest.mark.anyio

KEY = ("process", False, ())


def _worker(executor: HostExecutor) -> HostWorker:
    session = executor.session
    worker = getattr(session, "worker", None)
    assert isinstance(worker, HostWorker)
    return worker


async def _kill_fork_server() -> process.ForkServer:
    """Kill this level's fork server as a crash would, with no idle pooled worker of it left (so
    what remains under its base is the open sessions' directories only)."""
    host.POOLS.close()
    REAPER.drain()
    server = process._FORK_SERVERS[KEY]
    os.kill(server.process.pid, signal.SIGKILL)
    await anyio.to_thread.run_sync(server.process.wait)
    assert not server.usable()
    return server


async def test_a_session_opened_before_the_fork_server_was_replaced_keeps_its_files_and_runs() -> None:
    async with HostExecutor(isolation="process", pool=False, timeout=20) as before:
        worker = _worker(before)
        assert worker.process is None  # forked by the fork server, its directory under the server's base
        await before.upload("kept.txt", b"still here")
        old = await _kill_fork_server()
        assert os.path.dirname(worker.workdir) == os.path.realpath(old.base)
        async with HostExecutor(isolation="process", pool=False, timeout=20) as after:
            assert _worker(after).process is None  # forked by the replacement
            assert process._FORK_SERVERS[KEY] is not old
            assert (await after.run("print(1)")).stdout == "1\n"
        assert os.path.isdir(worker.workdir), "the replacement removed a live session's directory"
        assert await before.download("kept.txt") == b"still here"
        result = await before.run("print(2 + 2)")
        assert result.ok and result.stdout == "4\n" and not result.state_lost, result
        await before.upload("later.txt", b"written after")
        assert await before.download("later.txt") == b"written after"
    REAPER.drain()
    # The old server's base goes once its last session has ended, not before and not never.
    assert not os.path.exists(worker.workdir)
    assert not os.path.exists(old.base)


async def test_a_replaced_servers_base_with_no_session_left_is_removed_at_once() -> None:
    async with HostExecutor(isolation="process", pool=False, timeout=20) as first:
        assert (await first.run("print(1)")).ok
    REAPER.drain()
    old = await _kill_fork_server()
    async with HostExecutor(isolation="process", pool=False, timeout=20) as second:
        assert (await second.run("print(1)")).ok
    assert not os.path.exists(old.base)
