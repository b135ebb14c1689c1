"""The `init` handshake done ahead of a session (`session.initialise_ahead`, the host pool's refill):
over a real socketpair and the one blocking line reader (`SocketLineReader.exchange_blocking`), the
answer is checked and the token learnt as `RunnerSession.start` does, and a session made from the
worker afterwards (`RunnerSession.initialised`) speaks on with that token, without a round trip."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from sandboxes.errors import ProtocolError, WorkerStartError
from sandboxes.runtime.bounds import line_limit
from sandboxes.runtime.protocol import InitRequest
from sandboxes.session import RunnerSession, initialise_ahead
from sandboxes.worker import SocketLineReader, Worker, WorkerExit, WorkerExited

pytestmark = pytest.mark.anyio

INIT: InitRequest = {
    "op": "init",
    "policy": {"python_guards": True},  # type: ignore[typeddict-item]
    "env": {"WHO": "me"},
    "tools": ["lookup"],
    "stateless": True,
    "output_limit": 1_234,
}


class SocketWorker(Worker):
    """A worker whose runner is the test, at the other end of a socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        self.channel = SocketLineReader(sock)

    async def send(self, data: bytes) -> None:
        await self.channel.send(data)

    async def receive_line(self) -> bytes:
        return await self.channel.receive_line(self.line_limit)

    def exchange_blocking(self, data: bytes, timeout: float) -> bytes:
        return self.channel.exchange_blocking(data, timeout, self.line_limit)

    async def kill(self) -> None:
        self.channel.sock.close()

    async def exit_info(self) -> WorkerExit:
        return WorkerExit(detail="test")

    async def write_file(self, path: str, data: bytes) -> None:
        raise OSError("no files here")

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        raise OSError("no files here")


@pytest.fixture
def pair() -> Iterator[tuple[SocketWorker, socket.socket]]:
    ours, runner = socket.socketpair()
    runner.settimeout(5)
    yield SocketWorker(ours), runner
    ours.close()
    runner.close()


TOK = "5ca1ab1e" * 4


def line(**message: Any) -> bytes:
    """One line as the runner writes it: its token (if any) first."""
    if "token" in message:
        message = {"token": message["token"], **message}
    return json.dumps(message).encode() + b"\n"


def test_the_answer_teaches_the_token_and_the_session_needs_no_round_trip(pair: Any) -> None:
    worker, runner = pair
    # the reply comes in two pieces, and the runner's next line right behind it
    runner.sendall(b'{"token": "%s", "op": "reply", ' % TOK.encode())
    runner.sendall(b'"pid": 7, "uid": 5}\n' + line(op="reply", token=TOK, stdout="later\n"))
    seconds = initialise_ahead(worker, INIT, worker.exchange_blocking)
    assert seconds >= 0 and worker.channel_token == TOK
    assert worker.line_limit == line_limit(INIT["output_limit"])
    sent = json.loads(runner.recv(1 << 16))
    assert sent == INIT  # exactly the request, once
    session = RunnerSession.initialised(worker, INIT["output_limit"])
    assert session.handshake_seconds == 0.0 and session.output_limit == 1_234

    async def next_message() -> dict[str, Any]:
        return await session._receive()

    # the line after the reply was kept in the reader's buffer, and its token is checked
    assert anyio.run(next_message) == {"op": "reply", "stdout": "later\n"}


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (line(op="fatal", token=TOK, message="bad policy"), WorkerStartError),
        (line(op="output", token=TOK, stream="stdout", text="x"), ProtocolError),
        (line(op="reply", token=TOK), ProtocolError),  # no pid and uid: not an answer to init
        (line(op="reply", token="tok", pid=7, uid=5), ProtocolError),  # not a token the runner makes
        (b"not json\n", ProtocolError),
        (line(op="reply"), ProtocolError),  # no token: not the runner's answer
        (b"", WorkerExited),  # the runner closed its channel
    ],
)
def test_a_wrong_answer_fails_the_handshake(pair: Any, answer: bytes, error: type[Exception]) -> None:
    worker, runner = pair
    if answer:
        runner.sendall(answer)
    else:
        runner.shutdown(socket.SHUT_WR)
    with pytest.raises(error):
        initialise_ahead(worker, INIT, worker.exchange_blocking)
    if b"token" not in answer:
        assert worker.channel_token is None  # nothing learnt from a line that is not the runner's


def test_a_line_past_the_limit_ends_the_worker(pair: Any) -> None:
    worker, runner = pair
    flood = threading.Thread(target=_send_quietly, args=(runner, b"x" * (line_limit(1_234) + 10)))
    flood.start()
    with pytest.raises(WorkerExited, match="longer than"):
        initialise_ahead(worker, INIT, worker.exchange_blocking)
    worker.channel.sock.close()  # what a kill does: the flood's writer ends
    flood.join(10)
    assert not flood.is_alive()


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def test_a_session_is_not_made_from_a_worker_that_never_answered_init(pair: Any) -> None:
    worker, _ = pair
    with pytest.raises(ProtocolError):
        RunnerSession.initialised(worker, 1_000)
