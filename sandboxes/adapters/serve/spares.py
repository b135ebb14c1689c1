"""Sandboxes started ahead: with `durable_home` every sandbox needs a worker (or container) of its own,
opened on its own home, so the backend's warm pool cannot serve it and a create waited for a cold
start (0.1-0.3 s on the host, a container's start on Docker). `Spares` keeps `warm_sandboxes` of them
opened ahead, each on a fresh empty home, for creates that ask what the last one asked (the same
environment and network: what the executor is made from), and starts the next one after each take.

A spare is never handed out twice and never holds anything of a client's: it is an opened session
no code has run in, on a home nothing has written. Spares are not sandboxes: they count against no
cap, and end with the server (or when creates start asking for something else).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio

if TYPE_CHECKING:
    from ...executor import Executor


class Spec(Protocol):
    """What of a create's spec (`registry.Spec`) decides how its executor is made."""

    @property
    def envs(self) -> Mapping[str, str]: ...

    @property
    def network(self) -> Any: ...


logger = logging.getLogger("sandboxes.adapters.serve")

Started = tuple["str | None", "Executor"]
"""A spare: its home (None without durable homes) and its opened executor."""


def spec_key(spec: Spec) -> str:
    """What decides how a sandbox's executor is made from its spec (its environment and network)."""
    return repr((sorted(spec.envs.items()), spec.network))


class Spares:
    """Up to `count` opened sandboxes for the spec last asked for. `start` opens one (home and
    executor), `discard` ends one; `start_soon` runs a task in the server's task group."""

    def __init__(
        self,
        count: int,
        start: Callable[[Any], Awaitable[Started]],
        discard: Callable[[Started], Awaitable[None]],
        start_soon: Callable[..., Any],
    ) -> None:
        self.count = count
        self._start = start
        self._discard = discard
        self._start_soon = start_soon
        self._key: str | None = None
        self._ready: list[Started] = []
        self._filling = False
        self.closed = False

    def __len__(self) -> int:
        return len(self._ready)

    def take(self, spec: Spec) -> Started | None:
        """A spare made for a spec like `spec`, or None."""
        if self._ready and spec_key(spec) == self._key:
            return self._ready.pop(0)
        return None

    def refill(self, spec: Spec) -> None:
        """Start spares for `spec` (in the background) up to `count`; spares for another spec end."""
        if self.closed or not self.count:
            return
        key = spec_key(spec)
        if key != self._key:
            self._key = key
            stale, self._ready = self._ready, []
            for spare in stale:
                self._start_soon(self._discard, spare)
        if not self._filling and len(self._ready) < self.count:
            self._filling = True
            self._start_soon(self._fill, spec, key)

    async def _fill(self, spec: Spec, key: str) -> None:
        try:
            while not self.closed and self._key == key and len(self._ready) < self.count:
                # Shielded: a spare half-opened when the server stops is finished, then ended below.
                with anyio.CancelScope(shield=True):
                    try:
                        spare = await self._start(spec)
                    except Exception as exc:  # the next create starts its own and says why
                        logger.warning("could not start a spare sandbox: %s", exc)
                        return
                if self.closed or self._key != key:
                    with anyio.CancelScope(shield=True):
                        await self._discard(spare)
                    return
                self._ready.append(spare)
        finally:
            self._filling = False

    async def close(self) -> None:
        """End every spare; none is started after this."""
        self.closed = True
        spares, self._ready = self._ready, []
        with anyio.CancelScope(shield=True):
            for spare in spares:
                await self._discard(spare)


__all__ = ["Spares", "Started", "spec_key"]
