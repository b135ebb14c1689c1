"""Awaiting what another thread finishes (`sandboxes.threadwait`): the setting thread wakes the loop,
a timed-out or cancelled wait leaves nothing behind, a loop that has closed is no error for the
thread, and a spawn's result is waited for whatever cancels the caller. Real threads throughout."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import anyio
import pytest

from sandboxes.threadwait import Done, result_of

pytestmark = pytest.mark.anyio


def later(seconds: float, fn: object) -> threading.Thread:
    def go() -> None:
        time.sleep(seconds)
        fn()  # type: ignore[operator]

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


async def test_a_flag_set_by_another_thread_wakes_the_loop_without_a_worker_thread() -> None:
    done = Done()
    threads = threading.active_count()
    later(0.05, done.set)
    assert await done.until_set(5)
    # The waiting took no anyio worker thread (the setter's own is the only extra one, now ended).
    assert threading.active_count() <= threads + 1
    assert done.is_set() and done.wait(0)
    assert await done.until_set(0)  # set already: at once


async def test_a_wait_that_times_out_says_so_and_is_forgotten() -> None:
    done = Done()
    assert not await done.until_set(0.02)
    assert done._waiters == []
    done.set()  # nobody to wake, and no error for the setting thread
    assert await done.until_set(0.02)


async def test_a_cancelled_wait_is_forgotten() -> None:
    done = Done()
    with anyio.move_on_after(0.02):
        await done.until_set()
    assert done._waiters == []


def test_setting_after_the_waiting_loop_closed_is_no_error() -> None:
    done = Done()

    async def wait_briefly() -> None:
        assert not await done.until_set(0.01)

    anyio.run(wait_briefly)
    done.set()  # the loop is gone: the setter must not raise
    assert done.wait(0)


def test_threads_waiting_on_the_flag_are_released_too() -> None:
    done = Done()
    later(0.02, done.set)
    assert done.wait(5)


async def test_result_of_gives_the_result_or_raises_its_exception() -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert await result_of(pool.submit(lambda: (time.sleep(0.02), 42)[1])) == 42
        with pytest.raises(ZeroDivisionError):
            await result_of(pool.submit(lambda: 1 / 0))
        finished = pool.submit(lambda: "ready")
        finished.result()
        assert await result_of(finished) == "ready"  # done before the wait began


async def test_result_of_is_not_cancelled_by_the_caller_so_the_result_is_never_lost() -> None:
    future: concurrent.futures.Future[str] = concurrent.futures.Future()
    later(0.1, lambda: future.set_result("worker"))
    got: list[str] = []
    with anyio.CancelScope() as scope:
        scope.cancel()  # already cancelled: the wait must still see the result through
        got.append(await result_of(future))
    assert got == ["worker"]
