"""How many idle workers the host pools keep, and how many threads make them: sized to the load.

A fixed pool of two served one caller opening sessions one after another, but a grader opening eight
at once found two ready and waited for six to be made one by one (a burst's p50 open 23-33 ms,
against under 1 ms from the pool). `Demand` watches the opens in flight (an open counts from its
start until its session's first run ended, or it closed, for at most `HOLD` seconds: a grader's
whole use of a session, an agent's first step): the pools keep as many idle workers as the recent
peak of opens at once (at least `BASE_POOL`, at most `POOL_PER_CORE` per core), made by as many
spawner threads as opens came at once (at most `SPAWNERS_PER_CORE` per core); a peak is forgotten
`SHRINK_AFTER` seconds after it was last reached, and the pools shrink back. Both caps follow the
cores: more idle workers or spawners than the machine can run at once only wait for a core.

Plain bookkeeping (no processes, no threads): `executor.py`'s `HostPools` asks it.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pydantic import BaseModel

BASE_POOL = 2
"""Idle workers kept per key without any burst: the fixed size before `Demand` (one sequential
caller's next open, and the one after it)."""
POOL_PER_CORE = 4
SPAWNERS_PER_CORE = 1
SHRINK_AFTER = 5.0
"""Seconds after a peak of opens in flight was last reached before the pools size down from it."""
HOLD = 30.0
"""Seconds an open counts as in flight at most: a session opened and left without a run (a served
sandbox created ahead) is not starting any more, and holds no idle workers for its peak."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, as a container's CPU set gives it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


class PoolSizes(BaseModel):
    """What the pools are sized to now (`Demand.sizes`; the Ray node agent reports it)."""

    cores: int
    """The cores the sizing follows."""
    fixed: bool
    """The fixed sizing of before (`FIXED_ENV`), not the load's."""
    max_pool: int
    """The most idle workers kept per key (`POOL_PER_CORE` per core, or a smaller `capacity`)."""
    max_spawners: int
    """The most threads making workers at once (one per core)."""
    in_flight: int
    """Opens in progress now."""
    peak: int
    """The most opens in flight at once within the last `SHRINK_AFTER` seconds."""
    pool_size: int
    """Idle workers kept per key now."""
    spawners: int
    """Threads that may make workers at once now."""


class Demand:
    """Opens in flight and their recent peak, thread-safe (event loops in any thread open sessions).

    Args:
        cores: the cores to size by (default: those this process may run on).
        capacity: at most this many sessions can be open here at once (a Ray node's sandbox units):
            no more idle workers than that are useful.
        shrink_after: seconds a peak is remembered.
        hold: seconds an open counts as in flight at most.
        base: idle workers kept per key without a burst.
        fixed: keep the sizing of before (see `configure`).
        clock: monotonic seconds (tests give their own).
    """

    def __init__(
        self,
        cores: int | None = None,
        capacity: int | None = None,
        *,
        shrink_after: float = SHRINK_AFTER,
        hold: float = HOLD,
        base: int = BASE_POOL,
        fixed: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.shrink_after = shrink_after
        self.hold = hold
        self.base = base
        self._opens: dict[int, float] = {}  # the opens in flight: token -> when it began
        self._tokens = itertools.count(1)
        # _seen[n - 1]: when opens in flight last were n or more (levels past the cap are not kept)
        self._seen: list[float] = []
        self.configure(cores, capacity, fixed=fixed)

    def configure(
        self, cores: int | None = None, capacity: int | None = None, *, fixed: bool = False
    ) -> None:
        """Size by `cores` (default: this process's) and at most `capacity` sessions (None: no cap);
        `fixed`: the sizing of before, whatever the load (`base` per key, one spawner)."""
        with self._lock:
            self.cores = cores if cores is not None and cores >= 1 else usable_cores()
            self.fixed = fixed
            pool = self.base if fixed else POOL_PER_CORE * self.cores
            if capacity is not None and capacity >= 1:
                pool = min(pool, capacity)
            self.max_pool = pool
            self.max_spawners = 1 if fixed else SPAWNERS_PER_CORE * self.cores
            del self._seen[self.max_pool :]

    @contextmanager
    def opening(self) -> Iterator[None]:
        """Count one open in flight for the duration of the block."""
        token = self.begin()
        try:
            yield
        finally:
            self.end(token)

    def begin(self) -> int:
        """An open started; the token to `end` it with."""
        with self._lock:
            now = self._clock()
            token = next(self._tokens)
            self._opens[token] = now
            level = min(self._in_flight(now), self.max_pool)
            while len(self._seen) < level:
                self._seen.append(now)
            for index in range(level):
                self._seen[index] = now
            return token

    def end(self, token: int) -> None:
        """An open finished (its session's first run ended, it closed, or it failed)."""
        with self._lock:
            now = self._clock()
            began = self._opens.pop(token, None)
            if began is None:  # ended already, or no longer counted (older than `hold`)
                return
            # The levels it held were reached until now: they are remembered from now on.
            for index in range(min(self._in_flight(now) + 1, len(self._seen))):
                self._seen[index] = now

    def _in_flight(self, now: float) -> int:
        """Opens in flight, less those begun `hold` seconds ago or more (a session opened and left
        without a run is not starting any more)."""
        stale = sorted((began, token) for token, began in self._opens.items() if now - began >= self.hold)
        for began, token in stale:
            # The levels it held were reached until it stopped counting: remembered from then on.
            stopped = began + self.hold
            for index in range(min(len(self._opens), len(self._seen))):
                self._seen[index] = max(self._seen[index], stopped)
            del self._opens[token]
        return len(self._opens)

    def _peak(self, now: float) -> int:
        peak = self._in_flight(now)
        for index in range(len(self._seen) - 1, peak - 1, -1):
            if now - self._seen[index] < self.shrink_after:
                return index + 1
        return peak

    def peak(self) -> int:
        """The most opens in flight at once within the last `shrink_after` seconds."""
        with self._lock:
            return self._peak(self._clock())

    def pool_size(self) -> int:
        """Idle workers to keep per key now: the recent peak, at least `base`, at most `max_pool`."""
        with self._lock:
            return self._pool_size(self._peak(self._clock()))

    def _pool_size(self, peak: int) -> int:
        return max(1, min(self.max_pool, max(self.base, peak)))

    def spawners(self) -> int:
        """Threads that may make workers at once now: one per recent open at once, up to `max_spawners`."""
        with self._lock:
            return max(1, min(self.max_spawners, self._peak(self._clock())))

    def expires_in(self) -> float | None:
        """Seconds until the pool size may drop (when the peak above `base` is forgotten; while opens
        in flight hold it, `shrink_after`: look again then), or None if it is at `base`."""
        with self._lock:
            now = self._clock()
            peak = self._peak(now)
            if self._pool_size(peak) <= self._pool_size(0):
                return None
            if peak <= self._in_flight(now):
                return self.shrink_after
            return max(0.0, self._seen[peak - 1] + self.shrink_after - now)

    def sizes(self) -> PoolSizes:
        with self._lock:
            now = self._clock()
            peak = self._peak(now)
            return PoolSizes(
                cores=self.cores,
                fixed=self.fixed,
                max_pool=self.max_pool,
                max_spawners=self.max_spawners,
                in_flight=self._in_flight(now),
                peak=peak,
                pool_size=self._pool_size(peak),
                spawners=max(1, min(self.max_spawners, peak)),
            )


FIXED_ENV = "KODEAGENT_HOST_FIXED_POOLS"
"""Set to 1: the pools keep the fixed sizing of before (`BASE_POOL` per key, one spawner) whatever
the load; `bench pools` measures it against the sized pools this way."""


def fixed_sizing() -> bool:
    return os.environ.get(FIXED_ENV, "") not in ("", "0")
