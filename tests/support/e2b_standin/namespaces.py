"""Network and IPC namespaces for the stand-in's sandboxes: a real E2B sandbox is a microVM of its own.

Without them the stand-in's sandboxes, being local processes, would share this machine's loopback,
abstract unix sockets and System V IPC, which two real E2B sandboxes never do; a test of what
separates two sandboxes would then test the stand-in, not E2B. Each sandbox gets a network namespace
(loopback up, no other interface: the stand-in has no internet to give) and an IPC namespace, made
once at create and held by descriptors; every command of the sandbox enters them (`enter.py`) before
it executes, so it keeps the pid envd reports.

Making a namespace needs CAP_SYS_ADMIN: as root (how CI runs) every sandbox gets its own; otherwise
`make()` returns None and the sandboxes share this machine's network, as `available()` says.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from pathlib import Path

from sandboxes.runtime import netns

ENTER = Path(__file__).with_name("enter.py")


def make() -> tuple[int, int] | None:
    """Descriptors of a new network namespace (loopback up) and a new IPC namespace, or None if not allowed.

    Made in a thread of its own that then ends: unshare() moves only the calling thread, and this
    one must not go back to serving the stand-in from inside a sandbox's namespace.
    """
    made: list[tuple[int, int] | None] = [None]

    def run() -> None:
        if ctypes.CDLL(None, use_errno=True).unshare(netns.CLONE_NEWNET | netns.CLONE_NEWIPC) != 0:
            return
        netns.loopback_up()
        made[0] = (
            os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC),
            os.open("/proc/thread-self/ns/ipc", os.O_RDONLY | os.O_CLOEXEC),
        )

    thread = threading.Thread(target=run, name="e2b-standin-namespaces")
    thread.start()
    thread.join()
    return made[0]


def command(fds: tuple[int, int] | None, argv: list[str]) -> list[str]:
    """`argv` run inside the namespaces held by `fds` (pass them to the process with ``pass_fds``)."""
    if fds is None:
        return argv
    return [sys.executable, "-I", "-S", str(ENTER), str(fds[0]), str(fds[1]), *argv]


def close(fds: tuple[int, int] | None) -> None:
    for fd in fds or ():
        try:
            os.close(fd)
        except OSError:
            pass


@functools.cache
def available() -> bool:
    """Whether the stand-in's sandboxes get namespaces of their own here (checked once)."""
    fds = make()
    close(fds)
    return fds is not None
