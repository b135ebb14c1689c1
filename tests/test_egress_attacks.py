"""Attack class: the egress gateway itself, which parses whatever a sandbox sends it.

The client side is a network namespace the test makes, with the gateway's listener in it (as a
session's would be), and sockets the test opens there. The gateway connects from the fake
internet's ``host`` namespace (`fake_internet.py`). Each attack is followed by proof that its effect
did not happen (no request reached a server that must not be reached, the gateway still serves).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from support import egress_client as support_egress_client
from support.fake_internet import PRIVATE, PUBLIC, FakeInternet, fake_internet, gateway_through, unavailable
from support.needs import require

from sandboxes.egress import service
from sandboxes.egress.policy import NetworkPolicy
from sandboxes.egress.service import EgressLink

HEAD_SECONDS = 1.0


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    require(unavailable(), "the fake internet")
    with fake_internet() as net, gateway_through(net, head_seconds=HEAD_SECONDS):
        yield net


class Client(support_egress_client.Client):
    """`support.egress_client.Client`, with a whole request and answer in one call."""

    def exchange(self, data: bytes) -> bytes:
        with self.connect() as sock:
            sock.sendall(data)
            return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def status(reply: bytes) -> str:
    return reply.split(b"\r\n", 1)[0].decode(errors="replace")


@pytest.fixture
def client(internet: FakeInternet) -> Iterator[tuple[Client, EgressLink]]:
    ns = f"{internet.host_ns}-client"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
    subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=20)
    link = service.attach_blocking(f"/run/netns/{ns}", NetworkPolicy(max_connections=16))
    try:
        yield Client(ns), link
    finally:
        service._gateway().request({"op": "detach", "id": link.ident})
        subprocess.run(["ip", "netns", "del", ns], timeout=20)


def still_serves(client: Client) -> None:
    reply = client.exchange(b"GET http://public.test/ HTTP/1.1\r\nHost: public.test\r\n\r\n")
    assert reply.endswith(f"hello from {PUBLIC}".encode()), reply


def test_a_huge_head_is_refused_before_any_connection(
    client: tuple[Client, EgressLink], internet: FakeInternet
) -> None:
    conn, _ = client
    before = len(internet.hits_at(PUBLIC))
    head = b"GET http://public.test/ HTTP/1.1\r\n" + b"X-Filler: " + b"a" * 1_000_000 + b"\r\n\r\n"
    with conn.connect() as sock:
        try:
            sock.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway may close before it has read everything
        reply = read_all(sock)
    assert status(reply) in ("HTTP/1.1 431 Request Header Fields Too Large", ""), reply[:200]
    many = b"GET http://public.test/ HTTP/1.1\r\n" + b"X: y\r\n" * 150 + b"\r\n"
    assert status(conn.exchange(many)) == "HTTP/1.1 400 Bad Request"
    assert len(internet.hits_at(PUBLIC)) == before
    still_serves(conn)


def test_a_flood_of_connections_is_bounded_and_the_gateway_recovers(
    client: tuple[Client, EgressLink],
) -> None:
    conn, link = client
    idle = [conn.connect() for _ in range(16)]  # the session's bound, each holding a slot
    try:
        extra = [conn.connect() for _ in range(40)]
        answers = [status(read_all(sock)) for sock in extra]
        for sock in extra:
            sock.close()
        assert answers == ["HTTP/1.1 503 Service Unavailable"] * 40
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.2)  # the gateway sees the closes
    still_serves(conn)


def test_a_slow_head_is_cut_off(client: tuple[Client, EgressLink], internet: FakeInternet) -> None:
    conn, _ = client
    before = len(internet.hits_at(PUBLIC))
    with conn.connect() as sock:
        sock.sendall(b"GET http://public.test/ HTTP/1.1\r\n")
        started = time.monotonic()
        reply = b""
        for _ in range(40):  # a byte at a time, far slower than the bound allows
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.1)
            if time.monotonic() - started > HEAD_SECONDS * 3:
                break
        reply = read_all(sock)
    assert status(reply) == "HTTP/1.1 408 Request Timeout", reply
    assert len(internet.hits_at(PUBLIC)) == before
    still_serves(conn)


@pytest.mark.parametrize(
    "target",
    [
        f"{PRIVATE}:80",
        f"[::ffff:{PRIVATE}]:80",  # IPv4-mapped IPv6
        "[64:ff9b::a09:5]:80",  # NAT64 of 10.9.0.5
        "[::1]:80",
        "0.0.0.0:80",
        "localhost:80",
        "rebind.test:80",
        "169.254.169.254:80",
    ],
)
def test_connect_to_what_is_not_public_is_refused(
    client: tuple[Client, EgressLink], internet: FakeInternet, target: str
) -> None:
    conn, _ = client
    before = (len(internet.hits("net")), len(internet.hits("host")))
    reply = conn.exchange(f"CONNECT {target} HTTP/1.1\r\n\r\nGET / HTTP/1.0\r\n\r\n".encode())
    assert status(reply) == "HTTP/1.1 403 Forbidden", reply
    assert b"X-Kodeagent-Egress-Rule: " in reply
    assert (len(internet.hits("net")), len(internet.hits("host"))) == before


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 200 + b"\r\n\r\n",  # a TLS hello
        b"GET http://public.test/ HTTP/1.1 extra\r\n\r\n",
        b"GET http://public.test/ HTTP/2.0\r\n\r\n",
        b"GET http://public.test/ HTTP/1.1\r\nX-A: b\x00c\r\n\r\n",
        b"GET http://public.test/ HTTP/1.1\r\n folded: header\r\n\r\n",
        b"CONNECT public.test:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT public.test HTTP/1.1\r\n\r\n",
        b"GET http://user@10.9.0.5/ HTTP/1.1\r\n\r\n",
        b"GET https://public.test/ HTTP/1.1\r\n\r\n",
        b"GET /relative HTTP/1.1\r\nHost: public.test\r\n\r\n",
        b"GET http://pub\xc3\xa9lic.test/ HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_requests_are_refused_and_reach_nothing(
    client: tuple[Client, EgressLink], internet: FakeInternet, request_bytes: bytes
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    reply = conn.exchange(request_bytes)
    assert status(reply) == "HTTP/1.1 400 Bad Request", reply
    assert len(internet.hits("net")) == before
    still_serves(conn)


def test_the_host_header_cannot_redirect_a_request(
    client: tuple[Client, EgressLink], internet: FakeInternet
) -> None:
    conn, _ = client
    reply = conn.exchange(f"GET http://public.test/x HTTP/1.1\r\nHost: {PRIVATE}\r\n\r\n".encode())
    assert reply.endswith(f"hello from {PUBLIC}".encode())
    hit = internet.hits_at(PUBLIC)[-1]
    assert (hit["at"], hit["path"], hit["host"]) == (PUBLIC, "/x", "public.test")
    assert internet.hits_at(PRIVATE) == []


def test_socks5_refuses_other_commands_and_private_destinations(
    client: tuple[Client, EgressLink], internet: FakeInternet
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    with conn.connect() as sock:
        sock.sendall(b"\x05\x01\x00")
        assert sock.recv(2) == b"\x05\x00"
        sock.sendall(b"\x05\x02\x00\x01" + socket.inet_aton(PUBLIC) + b"\x00\x50")  # BIND
        assert sock.recv(10)[1] == 7
    with conn.connect() as sock:
        sock.sendall(b"\x05\x01\x00")
        sock.recv(2)
        sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(PRIVATE) + b"\x00\x50")
        assert sock.recv(10)[1] == 2
    with conn.connect() as sock:
        sock.sendall(b"\x05\x01\x02")  # only username/password offered
        assert sock.recv(2) == b"\x05\xff"
    assert len(internet.hits("net")) == before


def test_the_report_is_bounded_and_names_the_rules(client: tuple[Client, EgressLink]) -> None:
    conn, link = client
    for _ in range(300):
        with conn.connect() as sock:
            sock.sendall(f"CONNECT {PRIVATE}:80 HTTP/1.1\r\n\r\n".encode())
            read_all(sock)
    reply = service._gateway().request({"op": "report", "id": link.ident})
    assert len(reply["connections"]) == 256 and reply["omitted"] == 44
    assert {c["rule"] for c in reply["connections"]} == {"private"}
    assert json.dumps(reply).count(PRIVATE) >= 256
