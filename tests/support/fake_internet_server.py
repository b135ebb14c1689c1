"""The servers of the tests' fake internet, run inside a network namespace (`fake_internet.py`).

``python fake_internet_server.py LOG [--dns ADDRESS ZONE_JSON] [--tls CHAIN_PEM]``: an HTTP server
on port 80 of every address of the namespace, answering ``hello from ADDRESS`` (the address the
request arrived at) and appending one JSON line per request to LOG (the proof, for tests, of what
arrived where, with every header it received); with ``--dns``, a DNS server on ADDRESS:53 answering
A queries from ZONE_JSON (name: [addresses]); with ``--tls``, the same over HTTPS on port 443 with
the certificate chain and key in CHAIN_PEM (``/echo`` answers the request's headers: a server that
echoes them). Prints ``ready`` once all listen.
"""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import ssl
import struct
import sys
import threading


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        local = self.connection.getsockname()[0]
        tls = isinstance(self.connection, ssl.SSLSocket)
        headers = [[name, value] for name, value in self.headers.items()]
        with open(sys.argv[1], "a") as log:
            record = {"at": local, "path": self.path, "host": self.headers.get("Host"), "tls": tls}
            log.write(json.dumps({**record, "headers": headers}) + "\n")
        size = 0
        if self.path.startswith("/bytes/"):
            size = int(self.path.rsplit("/", 1)[1])
        body = f"hello from {local}{' over tls' if tls else ''}".encode() if not size else b"x" * size
        if self.path == "/echo":
            body = json.dumps(headers).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class TLSServer(Server):
    context: ssl.SSLContext

    def finish_request(self, request: socket.socket, client_address: object) -> None:
        """The TLS handshake in the request's own thread, so a slow client holds up nobody else."""
        request.settimeout(10)
        try:
            secure = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        self.RequestHandlerClass(secure, client_address, self)


def dns_server(address: str, zone: dict[str, list[str]]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))

    def serve() -> None:
        while True:
            data, peer = sock.recvfrom(4096)
            ident = data[:2]
            offset, labels = 12, []
            while data[offset]:
                labels.append(data[offset + 1 : offset + 1 + data[offset]].decode())
                offset += 1 + data[offset]
            question = data[12 : offset + 5]
            qtype = struct.unpack("!H", data[offset + 1 : offset + 3])[0]
            name = ".".join(labels).lower()
            answers = [a for a in zone.get(name, []) if qtype == 1 and ":" not in a]
            rcode = 0 if name in zone else 3
            header = ident + struct.pack("!HHHHH", 0x8180 | rcode, 1, len(answers), 0, 0)
            records = b"".join(
                b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton(a) for a in answers
            )
            sock.sendto(header + question + records, peer)

    threading.Thread(target=serve, daemon=True).start()


def main() -> None:
    server = Server(("0.0.0.0", 80), Handler)
    options = sys.argv[2:]
    if options[:1] == ["--dns"]:
        dns_server(options[1], json.loads(options[2]))
        options = options[3:]
    if options[:1] == ["--tls"]:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(options[1])
        secure = TLSServer(("0.0.0.0", 443), Handler)
        secure.context = context
        threading.Thread(target=secure.serve_forever, daemon=True).start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
