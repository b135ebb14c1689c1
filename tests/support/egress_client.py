"""A session's side of the egress gateway without a sandbox: a network namespace the test makes, the
gateway's listener in it (as a session's would be), and sockets opened there."""

from __future__ import annotations

import ctypes
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sandboxes.egress import PROXY_PORT, service
from sandboxes.egress.policy import NetworkPolicy
from sandboxes.egress.service import CLONE_NEWNET, EgressLink

from .fake_internet import FakeInternet


class Client:
    """Sockets opened inside a namespace of the test's, as a session's code would open them."""

    def __init__(self, ns: str) -> None:
        self.path = f"/run/netns/{ns}"

    def connect(self, port: int = PROXY_PORT) -> socket.socket:
        made: list[socket.socket] = []

        def inside() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(self.path, os.O_RDONLY)
            try:
                assert libc.setns(fd, CLONE_NEWNET) == 0
            finally:
                os.close(fd)
            made.append(socket.socket())  # this thread ends in the namespace: nothing else runs here

        thread = threading.Thread(target=inside)
        thread.start()
        thread.join()
        sock = made[0]
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        return sock

    def tunnel(self, target: str) -> tuple[socket.socket, bytes]:
        """A ``CONNECT`` to `target` and the gateway's answer head."""
        sock = self.connect()
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(1)
            if not chunk:
                break
            answer += chunk
        return sock, answer


def read_all(sock: socket.socket | ssl.SSLSocket) -> bytes:
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError, ssl.SSLError):
        pass
    return out


def status(reply: bytes) -> str:
    return reply.split(b"\r\n", 1)[0].decode(errors="replace")


@contextmanager
def client_namespace(
    internet: FakeInternet, policy: NetworkPolicy, authority: object | None = None
) -> Iterator[tuple[Client, EgressLink]]:
    """A namespace with the gateway's listener for `policy` (and the session CA `authority`)."""
    ns = f"{internet.host_ns}-client"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
    subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=20)
    link = service.attach_blocking(f"/run/netns/{ns}", policy, authority)  # type: ignore[arg-type]
    try:
        yield Client(ns), link
    finally:
        service._gateway().request({"op": "detach", "id": link.ident})
        subprocess.run(["ip", "netns", "del", ns], timeout=20)
