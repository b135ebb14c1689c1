"""The guard of the unit tier: a unit test runs in this process only (no worker, container, cluster,
server or child process).

An audit hook enforces it: while a unit test runs (its fixtures, its body, and the threads and tasks
it starts through anyio, which copy its context), starting a process (`subprocess`, `fork`,
`posix_spawn`, `os.system`, `exec`) or connecting a socket or sending a datagram is refused, and the
test fails even if it caught the refusal. Binding alone is let through: libraries probe with it at
import (urllib3 binds `::1` to learn whether IPv6 works, and refusing that would change what it
caches for the whole process), and a server nothing can connect to serves nothing. The hook acts only
in contexts a unit test set up (a context variable), so threads of servers that other tiers started
in the same pytest process are untouched. `tests/unit/conftest.py` turns it on for every test there.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from typing import Any

FORBIDDEN = {
    "subprocess.Popen": "starts a process",
    "os.fork": "forks a process",
    "os.forkpty": "forks a process",
    "os.posix_spawn": "starts a process",
    "os.system": "starts a process",
    "os.exec": "replaces this process",
    "socket.connect": "connects a socket (to a server or a daemon)",
    "socket.sendto": "sends a datagram",
}


class UnitTierViolation(RuntimeError):
    """A unit test tried to leave its process."""


_guarded: contextvars.ContextVar[bool] = contextvars.ContextVar("unit_tier_guarded", default=False)
_attempts: list[str] | None = None  # what the running unit test tried; None between unit tests


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event not in FORBIDDEN or _attempts is None or not _guarded.get():
        return
    what = f"{event} ({FORBIDDEN[event]}): {args[:2]!r}"[:300]
    _attempts.append(what)
    raise UnitTierViolation(
        f"a unit test must stay in its process, but it tried {what}; move it out of tests/unit"
    )


_installed = False


@contextlib.contextmanager
def in_this_process_only() -> Iterator[list[str]]:
    """Guard the code run inside; yields the list of refused attempts (empty when the code behaved)."""
    global _attempts, _installed
    if not _installed:
        sys.addaudithook(_audit)  # audit hooks cannot be removed: installed once, idle outside guards
        _installed = True
    _attempts = attempts = []
    token = _guarded.set(True)
    try:
        yield attempts
    finally:
        _guarded.reset(token)
        _attempts = None


@contextlib.contextmanager
def expect_refusal() -> Iterator[None]:
    """For the guard's own test: the code inside must be refused, and the refusal is then forgiven."""
    assert _attempts is not None, "expect_refusal() works only inside a guarded unit test"
    before = len(_attempts)
    try:
        yield
    except UnitTierViolation:
        pass
    else:
        raise AssertionError("the guard let the code leave the process")
    assert len(_attempts) == before + 1, _attempts
    del _attempts[before:]
