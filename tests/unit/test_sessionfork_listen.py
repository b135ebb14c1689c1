"""The runner's side of a ``listen`` fork channel (`runtime/sessionfork.py`), in this process: only a
connection that carries the secret becomes the new channel, and the socket never outlives the handover.
The Docker and E2B fork tests drive the whole exchange through real sandboxes."""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sandboxes.runtime import RUNTIME_DIR


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sessionfork_under_test", RUNTIME_DIR / "sessionfork.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Runner:
    """What `listen_channel` uses of the runner: its channel's `send`."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.channel = self

    def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


def connect_when_asked(runner: Runner, payload: Any, received: list[bytes]) -> threading.Thread:
    def run() -> None:
        while not runner.sent:
            time.sleep(0.01)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(runner.sent[0]["path"])
            data = payload(runner.sent[0]["secret"])
            if data is not None:
                sock.sendall(data)
            else:
                sock.shutdown(socket.SHUT_WR)  # end-of-file before any secret
            sock.settimeout(5)
            try:
                received.append(sock.recv(10))
            except OSError:
                received.append(b"")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    "payload",
    [
        lambda secret: b"0" * len(secret) + b"\n",  # a wrong secret of the right length
        lambda secret: secret[:-1].encode() + b"\n",  # a prefix
        lambda secret: None,  # closed without a word
    ],
    ids=["wrong", "prefix", "silent"],
)
def test_a_connection_without_the_secret_is_refused(payload: Any, tmpdir_env: Path) -> None:
    module, runner, received = load(), Runner(), []
    thread = connect_when_asked(runner, payload, received)
    with pytest.raises(OSError, match="secret"):
        module.listen_channel(runner, "unused")
    thread.join()
    assert received == [b""], "the refused connection is closed, nothing sent on it"
    assert runner.sent[0]["op"] == "fork_channel" and len(runner.sent[0]["secret"]) == 64
    assert runner.sent[0]["pid"] == os.getpid()
    assert list(tmpdir_env.iterdir()) == [], "the socket and its directory are removed"


def test_the_secret_opens_the_channel_and_nothing_past_it_is_eaten(tmpdir_env: Path) -> None:
    module, runner, received = load(), Runner(), []
    thread = connect_when_asked(runner, lambda secret: secret.encode() + b"\nhello", received)
    fd = module.listen_channel(runner, "unused")
    try:
        assert os.get_blocking(fd), "the channel is a blocking descriptor, as the runner reads it"
        assert os.read(fd, 5) == b"hello"
        os.write(fd, b"ok")
    finally:
        os.close(fd)
    thread.join()
    assert received == [b"ok"]
    assert list(tmpdir_env.iterdir()) == []
    directory = os.path.dirname(runner.sent[0]["path"])
    assert not os.path.exists(directory)


def test_the_listening_directory_is_private(tmpdir_env: Path) -> None:
    module, runner, received = load(), Runner(), []
    modes: list[int] = []

    def payload(secret: str) -> bytes:
        modes.append(os.stat(os.path.dirname(runner.sent[0]["path"])).st_mode & 0o777)
        return secret.encode() + b"\n"

    thread = connect_when_asked(runner, payload, received)
    os.close(module.listen_channel(runner, "unused"))
    thread.join()
    assert modes == [0o700]


def test_no_relay_in_time_is_refused_and_leaves_nothing(tmpdir_env: Path) -> None:
    module, runner = load(), Runner()
    module.LISTEN_TIMEOUT = 0.2  # instead of 30 s
    with pytest.raises(OSError, match="no relay connected"):
        module.listen_channel(runner, "unused")
    assert list(tmpdir_env.iterdir()) == []
