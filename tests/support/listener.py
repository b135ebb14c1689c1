"""A TCP listener that records every connection it accepts: the proof, on the far side, that code in a
sandbox did or did not reach the network (`tests/backends/docker/test_docker_hardening.py`)."""

from __future__ import annotations

import socket
import threading


class Listener:
    """A TCP server on `host` (loopback by default; "0.0.0.0" to be reachable from a container's
    bridge) that accepts and closes every connection, recording where each came from."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.connections: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError:  # the accept timeout (a TimeoutError), or the socket closed
                continue
            self.connections.append(addr)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
