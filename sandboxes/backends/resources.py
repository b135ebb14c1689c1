"""What a backend holds for the whole process, and who closes it.

A backend keeps things beyond any one executor: warm pools of started workers or containers, the
long-lived threads that start and remove them, and the clean-ups that must run before the interpreter
ends. Each backend owns them through one `BackendResources` (``resources("host")``, ...): its threads
are made on first use, its clean-ups are registered with it, and `close()` runs them. One exit hook
(`close_all`) closes every backend's resources, the last opened first, so a reader finds in one place
what each backend keeps and what ends it.

`WarmPool` is the one shape of the backends' warm pools: idle items per key, taken live (a dead one
is discarded, off the caller's path), put back, counted, drained; optionally only the most recently
wanted keys kept (the host backend's initialised workers).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")


class BackendResources:
    """A backend's process-wide threads and clean-ups, made lazily and ended together by `close()`.

    Threads are named roles (``threads("spawn")``): one `ThreadPoolExecutor` each, started on first
    use and living until `close()`, because some work must stay on one long-lived thread (a child's
    "die with parent" signal fires when the *thread* that forked it exits). Clean-ups (`on_close`)
    run at `close()` in reverse order of registration, each on its own (one that fails does not stop
    the next). After `close()` the object can be used again: threads are made anew on first use.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._threads: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._sizes: dict[str, int] = {}
        self._closers: list[tuple[Callable[[], object], bool]] = []
        self._closing = False

    def __repr__(self) -> str:
        return f"<BackendResources {self.name} threads={sorted(self._threads)} closers={len(self._closers)}>"

    def declare(self, role: str, max_workers: int) -> None:
        """Say how many threads `role` gets (before its first use; the default is one)."""
        with self._lock:
            self._sizes[role] = max_workers

    def threads(self, role: str) -> concurrent.futures.ThreadPoolExecutor:
        """The thread pool of `role`, started on first use; `RuntimeError` while `close()` runs (as
        once the interpreter is exiting: callers then do the work themselves or drop it)."""
        with self._lock:
            if self._closing:
                raise RuntimeError(f"the {self.name} backend's resources are being closed")
            pool = self._threads.get(role)
            if pool is None:
                pool = self._threads[role] = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._sizes.get(role, 1), thread_name_prefix=f"kodeagent-{self.name}-{role}"
                )
            return pool

    def submit(self, role: str, fn: Callable[..., Any], /, *args: Any) -> concurrent.futures.Future[Any]:
        """`fn(*args)` on the threads of `role`; `RuntimeError` once the interpreter is shutting down."""
        return self.threads(role).submit(fn, *args)

    def on_close(self, closer: Callable[[], object]) -> Callable[[], object]:
        """Run `closer` at every `close()` (usable as a decorator); the last registered runs first."""
        with self._lock:
            self._closers.append((closer, False))
        return closer

    def once_on_close(self, closer: Callable[[], object]) -> None:
        """Run `closer` at the next `close()` only (what it ends is made again on its next use)."""
        with self._lock:
            self._closers.append((closer, True))

    def close(self) -> None:
        """Let queued background work finish, then run the clean-ups (blocking; never raises).

        At interpreter exit the threads have already been joined (`concurrent.futures` does that before
        `atexit` hooks run), so only the clean-ups are left to run."""
        with self._lock:
            self._closing = True
            pools, self._threads = list(self._threads.values()), {}
            closers = [closer for closer, _once in reversed(self._closers)]
            self._closers = [(closer, once) for closer, once in self._closers if not once]
        try:
            for pool in pools:
                pool.shutdown(wait=True)
            for closer in closers:
                try:
                    closer()
                except Exception:  # a clean-up that failed must not keep the others from running
                    pass
        finally:
            with self._lock:
                self._closing = False


_REGISTRY: dict[str, BackendResources] = {}
_REGISTRY_LOCK = threading.Lock()


def resources(backend: str) -> BackendResources:
    """The process-wide resources of `backend` (made on first call)."""
    with _REGISTRY_LOCK:
        found = _REGISTRY.get(backend)
        if found is None:
            found = _REGISTRY[backend] = BackendResources(backend)
        return found


@atexit.register
def close_all() -> None:
    """Close every backend's resources, the last made first (the one exit hook of the backends)."""
    with _REGISTRY_LOCK:
        every = list(reversed(_REGISTRY.values()))
    for owned in every:
        owned.close()


class WarmPool(Generic[Key, Item]):
    """Idle items (started workers, containers) per key, shared by every executor of the process.

    `alive` says whether an idle item may still be handed out; `discard` ends one that may not (it is
    called outside the lock: hand it to a background thread if it blocks). With `max_keys`, only that
    many keys are kept, the most recently wanted (`want`); the idle items of a key it evicts are
    returned to the caller to end. `oldest_first` takes the longest-waiting item (else the newest).
    `lock` is a reentrant condition: a caller may hold it around several calls and wait on it for
    items being returned.
    """

    def __init__(
        self,
        alive: Callable[[Item], bool],
        discard: Callable[[Item], object],
        *,
        max_keys: int | None = None,
        oldest_first: bool = False,
        on_put: Callable[[Item], object] | None = None,
    ) -> None:
        self.lock = threading.Condition(threading.RLock())
        self._items: OrderedDict[Key, list[Item]] = OrderedDict()
        self._alive = alive
        self._discard = discard
        self._max_keys = max_keys
        self._oldest_first = oldest_first
        self._on_put = on_put

    def take(self, key: Key) -> Item | None:
        """A live idle item of `key` (dead ones on the way are discarded), or None."""
        while True:
            with self.lock:
                pool = self._items.get(key)
                if pool is not None and self._max_keys is not None:
                    self._items.move_to_end(key)  # taken from: recently wanted
                if not pool:
                    return None
                item = pool.pop(0 if self._oldest_first else -1)
            if self._alive(item):
                return item
            self._discard(item)

    def want(self, key: Key) -> list[Item]:
        """Keep items for `key` (the most recently wanted now); the idle items of the keys this evicts
        (past `max_keys`), for the caller to end."""
        evicted: list[Item] = []
        with self.lock:
            self._items.setdefault(key, [])
            self._items.move_to_end(key)
            while self._max_keys is not None and len(self._items) > self._max_keys:
                evicted += self._items.popitem(last=False)[1]
        return evicted

    def wanted(self, key: Key) -> bool:
        """Whether `key` is kept (with `max_keys`: not evicted since it was last wanted)."""
        with self.lock:
            return key in self._items

    def put(self, key: Key, item: Item, *, limit: int | None = None, only_wanted: bool = False) -> bool:
        """Pool an idle item; False (the caller ends it) when the key holds `limit` already, or, with
        `only_wanted`, when the key is not kept (evicted meanwhile)."""
        with self.lock:
            pool = self._items.get(key) if only_wanted else self._items.setdefault(key, [])
            if pool is None or (limit is not None and len(pool) >= limit):
                return False
            if self._on_put is not None:
                self._on_put(item)
            pool.append(item)
            self.lock.notify_all()
            return True

    def count(self, key: Key) -> int:
        """Idle items of `key`."""
        with self.lock:
            return len(self._items.get(key, ()))

    def idle(self) -> list[Item]:
        """Every idle item, of every key."""
        with self.lock:
            return [item for pool in self._items.values() for item in pool]

    def by_key(self) -> dict[Key, list[Item]]:
        """The idle items per key (a copy)."""
        with self.lock:
            return {key: list(pool) for key, pool in self._items.items()}

    def trim(self, size: int) -> list[Item]:
        """Keep at most `size` idle items per key (the newest: the longest-waiting go first); the
        others, for the caller to end. Keys and their order of recent use stay as they are."""
        removed: list[Item] = []
        with self.lock:
            for pool in self._items.values():
                if len(pool) > size:
                    removed += pool[: len(pool) - size]
                    del pool[: len(pool) - size]
        return removed

    def drain(self) -> list[Item]:
        """Empty the pool (and forget its keys); the items, for the caller to end."""
        with self.lock:
            items = [item for pool in self._items.values() for item in pool]
            self._items.clear()
            self.lock.notify_all()
        return items


def fill(
    pool: WarmPool[Key, Item],
    key: Key,
    size: int,
    make: Callable[[], Item | None],
    returning: Callable[[], int] | None = None,
) -> None:
    """Top `pool`'s `key` up to `size` items made by `make` (blocking: run it in a background thread);
    stops at the first item `make` could not make (None), leaving the problem to the next cold start.
    `returning` counts items on their way back to the pool, which count as there."""
    while pool.count(key) + (returning() if returning is not None else 0) < size:
        item = make()
        if item is None:
            return
        pool.put(key, item)
