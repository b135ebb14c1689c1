"""The host backend's usage probe: what a run used, read from the runner's process tree in /proc
(`usage.ProcessTree`) by the parent, where the code cannot forge it."""

from __future__ import annotations

import time

from ...models import RunUsage
from ...usage import CpuReading, ProcessTree, UsageProbe, make_usage


class ProcessProbe(UsageProbe):
    """`UsageProbe` for a host worker: its runner's process tree, read from /proc.

    It `continues`: `stop` resets the peak right after its reading and keeps that reading, and the
    next `start` takes it as its 'before' instead of reading the tree again (two /proc readings a run
    instead of four; a warm run is a fraction of a millisecond)."""

    local = True
    continues = True

    def __init__(self, tree: ProcessTree | None) -> None:
        self.tree = tree
        self.before: CpuReading | None = None
        self.scope = "session"
        self.started = 0.0
        self._carried: tuple[CpuReading, str] | None = None

    async def start(self) -> None:
        carried, self._carried = self._carried, None
        if carried is not None:
            self.before, self.scope = carried
        elif self.tree is not None:
            self.before = self.tree.cpu()  # first: it checks that the pid is still the runner's
            cleared = self.before is not None and self.tree.clear_peak()
            self.scope = "run" if cleared else "session"
        self.started = time.perf_counter()

    async def stop(self) -> RunUsage | None:
        wall = time.perf_counter() - self.started
        if self.tree is None:
            return None
        after = self.tree.cpu()
        peak = self.tree.peak_rss() if after is not None else None
        user = system = None
        if after is not None and self.before is not None:
            user, system = after.since(self.before)
        if after is not None and peak is not None:  # the next run starts where this one ended
            self._carried = (after, "run" if self.tree.clear_peak() else "session")
        return make_usage(user, system, peak, wall, self.scope, "proc", cpu_exact=True, peak_exact=True)
