"""When a channel's reader polls its socket for a moment instead of sleeping on it at once.

An answer that comes within a fraction of a millisecond costs the waiting side more in its wake-up
than in its reading: the event loop sleeps in the kernel, whose CPU goes idle, and waking an idle
CPU takes tens of microseconds (in a VM a trip through the hypervisor: here about 80 of a warm
`print(1)`'s 330). So `SocketLineReader.receive_some` first looks at its socket again and again,
letting the loop's other tasks run between looks, for up to `POLL_SECONDS`, and sleeps only after
that. It polls only where the CPU it spends would otherwise idle:

- this process may run on at least two CPUs (one is left for the sandbox to answer on): its
  affinity mask, read once at import (a CPU quota, such as a container's ``cpu.max``, is not seen);
- it is the only reader waiting in this process (a batch of sessions, or a server's many, sleep as
  before: there the CPU has other work, and every wake-up is shared by many answers);
- the reader's last wait ended within `POLL_SECONDS` (a session whose runs take longer does not
  poll in vain run after run; one quick answer brings the polling back);
- it is the first wait since the reader last sent: it polls for the answer to a message, once. The
  other side may send its answer a byte at a time (a runner the code replaced), and a poll per wait
  would keep this process's loop polling as long as it trickles.

The CPU spent polling is the parent's, never the sandbox's: a run's `usage` does not count it.
"""

from __future__ import annotations

import os
import threading

POLL_SECONDS = 0.0005
"""How long a reader looks at its socket before it sleeps on it."""

_lock = threading.Lock()
_waiting = 0


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


SPARE_CPU = _usable_cpus() >= 2
"""Whether this process may run on a CPU beside the one the sandbox answers on (read once)."""


def begin_wait() -> bool:
    """Count a reader as waiting; True when it may poll (it is the only one, with a CPU to spare).
    Every call is paired with `end_wait`."""
    global _waiting
    with _lock:
        _waiting += 1
        return SPARE_CPU and _waiting == 1


def sole_waiter() -> bool:
    """Whether the calling reader is still the only one waiting (checked between looks)."""
    return _waiting == 1


def end_wait() -> None:
    global _waiting
    with _lock:
        _waiting -= 1
