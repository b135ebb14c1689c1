"""Awaiting, on an event loop, what another thread finishes, without a thread of ours to wait for it.

`anyio.to_thread.run_sync(event.wait)` parks a worker thread on the wait: the loop hands the call to
the thread, the thread wakes when the event is set and hands the answer back, two thread wake-ups
and a hop through anyio's limiter per wait. A batch of fresh sessions waits like this for every
session's spawn and every reap, hundreds of times a second. Here the thread that finishes the work
wakes the waiting loop itself (`call_soon_threadsafe`): one wake-up, and no thread held.

Asyncio only (the loop is asyncio's, as `anyio.run`'s default backend gives it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import TypeVar

import anyio

T = TypeVar("T")


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # its wait may have timed out or been cancelled since
        waiter.set_result(None)


def _wake(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]) -> None:
    try:
        loop.call_soon_threadsafe(_resolve, waiter)
    except RuntimeError:  # that loop has closed: nobody waits any more
        pass


class Done:
    """A flag set once, from any thread: threads wait for it with `wait`, event loops with `until_set`
    (the setting thread wakes them; none of ours waits in between)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def set(self) -> None:
        with self._lock:
            self._event.set()
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            _wake(loop, waiter)

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block this thread until set; False if `timeout` seconds passed first."""
        return self._event.wait(timeout)

    async def until_set(self, timeout: float | None = None) -> bool:
        """Until set, on this event loop; False if `timeout` seconds passed first."""
        if self._event.is_set():
            return True
        loop = asyncio.get_running_loop()
        entry = (loop, loop.create_future())
        with self._lock:
            if self._event.is_set():
                return True
            self._waiters.append(entry)
        try:
            with anyio.move_on_after(timeout):
                await entry[1]
                return True
            return False
        finally:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)


async def result_of(future: concurrent.futures.Future[T]) -> T:
    """The result of `future` (raising its exception), awaited on this event loop. Not cancellable,
    like `to_thread.run_sync(future.result)`: what the future makes (a worker process) is the
    caller's to keep or end, so the caller waits for it whatever else happens."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    future.add_done_callback(lambda _: _wake(loop, waiter))
    with anyio.CancelScope(shield=True):
        await waiter
    return future.result()
