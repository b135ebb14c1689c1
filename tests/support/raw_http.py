"""HTTP/1.1 spoken by hand over one socket, for tests that need what clients will not do: a head sent
without its body, a body sent late or never, a second request on the connection a refusal left."""

from __future__ import annotations

import socket


class RawConnection:
    """One keep-alive connection to ``url`` (``http://host:port``)."""

    def __init__(self, url: str, timeout: float = 30) -> None:
        host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.timeout = timeout
        self.pending = b""

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def send_head(self, method: str, path: str, headers: dict[str, str]) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def nothing_within(self, seconds: float) -> bool:
        """Whether no byte of an answer arrives in `seconds` (a byte that does is kept for `answer`)."""
        self.sock.settimeout(seconds)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(self.timeout)
        self.pending += chunk
        return False

    def answer(self) -> tuple[int, bytes]:
        """The next whole answer: its status and body (as long as its Content-Length says, or none)."""
        while b"\r\n\r\n" not in self.pending:
            self._more()
        head, _, rest = self.pending.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(fields.get("content-length", "0"))
        while len(rest) < length:
            rest += self._more_bytes()
        self.pending = rest[length:]
        return int(lines[0].split(" ")[1]), rest[:length]

    def _more(self) -> None:
        self.pending += self._more_bytes()

    def _more_bytes(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection before the answer was whole")
        return chunk
