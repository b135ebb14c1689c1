"""Pausing a sandbox: no CPU, memory kept, resumed as it was.

Host: every process of the session is stopped with SIGSTOP and continued with SIGCONT. Which
processes those are comes from the kernel (/proc), never from the sandbox: the runner (its host pid,
found when the worker started, before any code ran) is a subreaper, so everything the code started,
`setsid` and double forks included, is below it. The tree is walked until no new process appears (a
stopped process cannot fork, so a fork in flight is caught on the next pass).

Docker: the container's cgroup is frozen (`docker pause`), which covers every process in it.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

import anyio

from ...runtime.proctools import descendants, signal_group, signal_process
from .errors import ServeError

if TYPE_CHECKING:
    from ...executor import Executor


class PauseFailed(ServeError):
    status = 500


def _worker(executor: Executor) -> Any:
    session = executor.session
    return getattr(session, "worker", None) if session is not None else None


def _runner_pid(worker: Any) -> int | None:
    host_pid = getattr(worker, "host_pid", None)
    return host_pid() if callable(host_pid) else None


def _tree(root: int) -> dict[int, int]:
    """The runner and every process below it: pid -> process group."""
    try:
        group = os.getpgid(root)
    except ProcessLookupError:
        return {}
    return {root: group, **descendants(root)}


def _stop_tree(root: int) -> int:
    own_group = os.getpgrp()
    stopped: set[int] = set()
    for _ in range(200):
        found = _tree(root)
        fresh = set(found) - stopped
        if not fresh:
            break
        for group in {found[pid] for pid in fresh} - {own_group, 0, 1}:
            if group in found:  # a group led by one of the session's own processes
                signal_group(group, signal.SIGSTOP)
        for pid in fresh:
            signal_process(pid, signal.SIGSTOP)
        stopped |= fresh
    return len(stopped)


def _continue_tree(root: int) -> None:
    for pid in _tree(root):
        signal_process(pid, signal.SIGCONT)


async def freeze(executor: Executor) -> None:
    """Stop every process of the executor's session (no CPU from now on; memory kept)."""
    worker = _worker(executor)
    if worker is None:
        return  # no live session: nothing runs, and the next request starts one
    container = getattr(worker, "container_id", None)
    if container is not None:
        await anyio.to_thread.run_sync(_docker, "pause", container)
        return
    root = _runner_pid(worker)
    if root is None:
        raise PauseFailed(
            "this sandbox's processes cannot be found, so it cannot be paused; it keeps running"
        )
    await anyio.to_thread.run_sync(_stop_tree, root)


async def thaw(executor: Executor) -> None:
    """Continue every process `freeze` stopped."""
    worker = _worker(executor)
    if worker is None:
        return
    container = getattr(worker, "container_id", None)
    if container is not None:
        await anyio.to_thread.run_sync(_docker, "unpause", container)
        return
    root = _runner_pid(worker)
    if root is not None:
        await anyio.to_thread.run_sync(_continue_tree, root)


def _docker(action: str, container: str) -> None:
    from ...backends.docker.daemon import client

    api = client().api
    try:
        getattr(api, action)(container)
    except Exception as exc:  # the daemon's own error, e.g. already (un)paused or gone
        message = str(exc)
        if "is already paused" in message or "is not paused" in message:
            return
        raise PauseFailed(f"docker {action} of this sandbox's container failed: {message}") from None


def stopped_processes(executor: Executor) -> dict[int, bool]:
    """For tests and `doctor`: each process of the session (host) and whether it is stopped now."""
    root = _runner_pid(_worker(executor))
    result: dict[int, bool] = {}
    if root is None:
        return result
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        result[pid] = state in (b"T", b"t")
    return result
