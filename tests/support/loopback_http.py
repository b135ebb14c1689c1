"""An HTTP server on this machine's loopback that records every request: a "service on this machine"
that network-on code must not reach unless a rule allows it, and the far side's proof that it did.

Reached from a sandbox only through the egress gateway (``GATEWAY_GET``): the sandbox's own
``127.0.0.1`` is its own loopback, and ``NO_PROXY`` keeps proxy-aware clients off the gateway for it.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GATEWAY_GET = """
import socket
def gateway_get(host, port, path="/"):
    s = socket.create_connection(("127.0.0.1", 3128), 10)
    s.sendall(f"GET http://{host}:{port}{path} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    head, _, body = data.partition(b"\\r\\n\\r\\n")
    return head.split(b"\\r\\n")[0].decode(), body.decode(errors="replace")
"""
"""Sandbox code: `gateway_get(host, port)` -> (status line, body), a plain-HTTP request through the gateway."""


class LoopbackHttp:
    """Answers ``GET /`` with `BODY` on ``127.0.0.1:port``; `paths` lists what arrived."""

    BODY = "hello from this machine"

    def __init__(self) -> None:
        self.paths: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.paths.append(self.path)
                body = owner.BODY.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LoopbackHttp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
