"""A container's attach stream: Docker multiplexes its stdout and stderr on one socket in framed
chunks (`Demultiplexer`); the runner's lines are read off its stdout."""

from __future__ import annotations

import socket
import struct

from ...worker import SocketLineReader, WorkerExited, take_line

STDERR_KEPT = 4096
"""Bytes of the runner's own stderr kept to explain a crash (user output never goes there)."""


class Demultiplexer:
    """Splits Docker's multiplexed attach stream (8-byte header: stream, 0, 0, 0, big-endian size)."""

    def __init__(self) -> None:
        self._raw = bytearray()
        self.stdout = bytearray()
        self.stderr_tail = bytearray()

    def feed(self, data: bytes) -> None:
        self._raw += data
        while len(self._raw) >= 8:
            stream, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + size:
                return
            payload = bytes(self._raw[8 : 8 + size])
            del self._raw[: 8 + size]
            if stream == 1:
                self.stdout += payload
            else:
                self.stderr_tail += payload
                del self.stderr_tail[:-STDERR_KEPT]


def stream_open(sock: socket.socket) -> bool:
    """Whether a container's attach stream is still open. No daemon call: the daemon ends the stream
    when the container stops, is removed, or the daemon itself goes away, so this is cheap and
    sufficient."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


async def stream_line(channel: SocketLineReader, demux: Demultiplexer, limit: int) -> bytes:
    """The next line of a container's stdout on its attach stream (`WorkerExited` at its end)."""
    while True:
        line = take_line(demux.stdout, limit)
        if line is not None:
            return line
        chunk = await channel.receive_some()
        if not chunk:
            raise WorkerExited("the container's attach stream ended")
        demux.feed(chunk)
