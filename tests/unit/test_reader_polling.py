"""A channel reader's short poll before it sleeps (`sandboxes/polling.py`): it lets the event loop's
other tasks run between its looks, steps aside once another reader waits, ends when its waiters are
woken for a close, polls once per message it sent (a peer that trickles its answer cannot keep it
polling), and leaves the process-wide count of waiting readers as it found it, however its wait
ends. Over real socketpairs, in this process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from sandboxes import polling
from sandboxes.worker import SocketLineReader

pytestmark = pytest.mark.anyio


@pytest.fixture
def pair() -> Iterator[tuple[SocketLineReader, socket.socket]]:
    ours, theirs = socket.socketpair()
    reader = SocketLineReader(ours)
    yield reader, theirs
    ours.close()
    theirs.close()


@pytest.fixture
def long_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll that would last far longer than any test: a reader that blocked the loop while it
    polled would hold up the task that answers it until the test's own deadline."""
    monkeypatch.setattr(polling, "POLL_SECONDS", 60.0)
    monkeypatch.setattr(polling, "SPARE_CPU", True)


async def test_the_loop_runs_other_tasks_while_a_reader_polls(
    pair: tuple[SocketLineReader, socket.socket], long_polls: None
) -> None:
    reader, theirs = pair
    ran: list[str] = []

    async def answer() -> None:
        await anyio.lowlevel.checkpoint()
        ran.append("answer")
        theirs.sendall(b"reply\n")

    await reader.send(b"request\n")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(answer)
            line = await reader.receive_line()
    assert line == b"reply\n"
    assert ran == ["answer"]
    assert reader.quick  # answered well within the poll


async def test_a_wake_for_a_close_ends_a_wait_that_polls(
    pair: tuple[SocketLineReader, socket.socket], long_polls: None
) -> None:
    reader, _theirs = pair
    got: list[bytes] = []
    await reader.send(b"request\n")

    async def wait() -> None:
        got.append(await reader.receive_some())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            for _ in range(5):
                await anyio.lowlevel.checkpoint()  # the reader is polling by now
            assert polling._waiting == 1
            reader.wake_waiters()
    assert got == [b""]  # as end-of-file, the way a sleeping waiter is woken
    assert polling._waiting == 0


async def test_a_second_waiting_reader_sends_the_first_to_sleep(
    pair: tuple[SocketLineReader, socket.socket], long_polls: None
) -> None:
    first, first_peer = pair
    second_ours, second_peer = socket.socketpair()
    second = SocketLineReader(second_ours)
    try:
        assert polling.begin_wait() is True  # alone: may poll
        assert polling.begin_wait() is False  # a second waiter: sleeps
        assert not polling.sole_waiter()
        polling.end_wait()
        polling.end_wait()
        lines: dict[str, bytes] = {}

        async def read(name: str, reader: SocketLineReader) -> None:
            lines[name] = await reader.receive_line()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(read, "first", first)
                group.start_soon(read, "second", second)
                for _ in range(5):
                    await anyio.lowlevel.checkpoint()
                assert polling._waiting == 2
                second_peer.sendall(b"two\n")
                first_peer.sendall(b"one\n")
        assert lines == {"first": b"one\n", "second": b"two\n"}
        assert polling._waiting == 0
    finally:
        second_ours.close()
        second_peer.close()


async def test_a_cancelled_wait_is_no_longer_counted(
    pair: tuple[SocketLineReader, socket.socket], long_polls: None
) -> None:
    reader, _theirs = pair
    for _ in range(2):  # polling, then (the poll given up) sleeping
        await reader.send(b"request\n")
        with anyio.move_on_after(0.05):
            await reader.receive_some()
        assert polling._waiting == 0
        reader.quick = False


async def test_a_slow_answer_stops_the_polling_and_a_quick_one_brings_it_back(
    pair: tuple[SocketLineReader, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, theirs = pair
    monkeypatch.setattr(polling, "SPARE_CPU", True)
    monkeypatch.setattr(polling, "POLL_SECONDS", 0.001)

    async def answer_after(seconds: float) -> None:
        await anyio.sleep(seconds)
        theirs.sendall(b"x\n")

    await reader.send(b"request\n")
    async with anyio.create_task_group() as group:
        group.start_soon(answer_after, 0.2)  # far past the poll
        assert await reader.receive_line() == b"x\n"
    assert reader.quick is False
    monkeypatch.setattr(polling, "POLL_SECONDS", 60.0)
    await reader.send(b"request\n")
    async with anyio.create_task_group() as group:
        group.start_soon(answer_after, 0.01)  # within it (the reader sleeps: its last wait was slow)
        assert await reader.receive_line() == b"x\n"
    assert reader.quick is True


async def test_a_peer_that_trickles_its_answer_does_not_keep_the_reader_polling(
    pair: tuple[SocketLineReader, socket.socket], long_polls: None
) -> None:
    # A byte every 10 ms for 0.4 s, each one within the (here endless) poll: a poll per wait would
    # look at the socket the whole time, one per message sent only until the first byte.
    reader, theirs = pair

    def trickle() -> None:
        for _ in range(40):
            time.sleep(0.01)
            theirs.sendall(b"x")
        theirs.sendall(b"\n")

    await reader.send(b"request\n")
    sender = threading.Thread(target=trickle)
    cpu = time.thread_time()
    sender.start()
    with anyio.fail_after(10):
        line = await reader.receive_line()
    spent = time.thread_time() - cpu
    sender.join()
    assert line == b"x" * 40 + b"\n"
    assert spent < 0.15, f"the reader spent {spent:.3f} s of CPU on a 0.4 s trickle"
