"""The unit tier's guard refuses what a unit test must not do (so the tier stays in one process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import anyio
import pytest
from support.unit_guard import expect_refusal

pytestmark = pytest.mark.anyio


def test_a_child_process_is_refused() -> None:
    with expect_refusal():
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    with expect_refusal():
        os.system("true")


def test_a_connection_and_a_datagram_are_refused() -> None:
    with socket.socket() as client, expect_refusal():
        client.connect(("127.0.0.1", 9))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, expect_refusal():
        udp.sendto(b"x", ("127.0.0.1", 9))


async def test_work_handed_to_a_thread_is_guarded_too() -> None:
    def spawn() -> None:
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    with expect_refusal():
        await anyio.to_thread.run_sync(spawn)
