"""Attack class: secrets at egress. The gateway adds a host's secret headers only to requests it
sends itself to that host (its own DNS answer, a certificate it verified), never because of an SNI,
a ``Host`` or an address the code wrote; it parses the code's TLS and request head as hostile.

The client is a network namespace of the test's with the gateway's listener in it; the session's
CA is made here, and the client trusts it as a session would. The proof is on the server's side:
the fake internet's HTTPS server logs every header it received.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
from pydantic import ValidationError
from support.egress_client import Client, client_namespace, read_all, status
from support.fake_internet import PUBLIC, FakeInternet, fake_internet, gateway_through, unavailable
from support.needs import require

from sandboxes import Policy
from sandboxes.egress import service
from sandboxes.egress.ca import SessionAuthority
from sandboxes.egress.policy import NetworkPolicy, Secret
from sandboxes.egress.service import EgressLink

HEAD_SECONDS = 1.0
SECRET = "Bearer s3cret-7f1c0a"
RULES = NetworkPolicy(
    secrets={
        "secret.test": {"Authorization": SECRET, "X-Api-Key": "k3y-99ab"},
        "unverified.test": {"Authorization": SECRET},
    }
)


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    require(unavailable(), "the fake internet")
    with fake_internet() as net, gateway_through(net, head_seconds=HEAD_SECONDS):
        yield net


@pytest.fixture(scope="module")
def authority() -> SessionAuthority:
    return SessionAuthority()


@pytest.fixture
def client(internet: FakeInternet, authority: SessionAuthority) -> Iterator[tuple[Client, EgressLink]]:
    with client_namespace(internet, RULES, authority) as made:
        yield made


def trusting(authority: SessionAuthority) -> ssl.SSLContext:
    """What the session verifies with: its own CA (the system's authorities play no part here)."""
    return ssl.create_default_context(cadata=authority.certificate_pem.decode())


def secret_hits(internet: FakeInternet) -> list[dict[str, object]]:
    return [h for h in internet.hits("net") if SECRET in json.dumps(h)]


def request(sock: ssl.SSLSocket, head: str) -> bytes:
    sock.sendall(head.encode())
    return read_all(sock)


def test_the_secret_arrives_replacing_the_codes_own_header(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority
) -> None:
    conn, link = client
    raw, answer = conn.tunnel("secret.test:443")
    assert status(answer) == "HTTP/1.1 200 Connection established"
    with trusting(authority).wrap_socket(raw, server_hostname="secret.test") as tls:
        reply = request(
            tls,
            "GET /first HTTP/1.1\r\nHost: secret.test\r\nAuthorization: mine\r\nauthorization: again\r\n"
            "X-Code: kept\r\n\r\n",
        )
    assert status(reply).endswith(" 200 OK") and reply.endswith(f"hello from {PUBLIC} over tls".encode())
    assert SECRET.encode() not in reply and b"k3y-99ab" not in reply
    hit = internet.hits_at(PUBLIC)[-1]
    assert hit["path"] == "/first" and hit["tls"] is True
    headers = [(name.lower(), value) for name, value in hit["headers"]]
    assert [v for n, v in headers if n == "authorization"] == [SECRET]  # replaced, never duplicated
    assert [v for n, v in headers if n == "x-api-key"] == ["k3y-99ab"]
    assert ("x-code", "kept") in headers and ("host", "secret.test") in headers
    report = service._gateway().request({"op": "report", "id": link.ident})
    assert [(c["host"], c["secret"], c["allowed"]) for c in report["connections"]] == [
        ("secret.test", True, True)
    ]
    assert SECRET not in json.dumps(report)


def test_socks5_to_a_secret_host_gets_the_same_treatment(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority
) -> None:
    conn, _ = client
    before = len(secret_hits(internet))
    with conn.connect() as raw:
        raw.sendall(b"\x05\x01\x00")
        assert raw.recv(2) == b"\x05\x00"
        raw.sendall(b"\x05\x01\x00\x03\x0bsecret.test\x01\xbb")
        assert raw.recv(10)[1] == 0
        with trusting(authority).wrap_socket(raw, server_hostname="secret.test") as tls:
            reply = request(tls, "GET /socks HTTP/1.1\r\nHost: secret.test\r\n\r\n")
    assert status(reply).endswith(" 200 OK")
    assert len(secret_hits(internet)) == before + 1


def test_an_sni_naming_another_host_fails_the_handshake(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    raw, answer = conn.tunnel("secret.test:443")
    context = trusting(authority)
    context.check_hostname = False  # the code may verify nothing; the gateway still refuses
    with raw, pytest.raises(ssl.SSLError):
        context.wrap_socket(raw, server_hostname="other.test")
    assert len(internet.hits("net")) == before
    report = service._gateway().request({"op": "report", "id": client[1].ident})
    assert [(c["rule"], c["secret"]) for c in report["connections"]] == [("tls-handshake", False)]


@pytest.mark.parametrize("host", ["other.test", PUBLIC, "secret.test:8443", "secret.test.evil"])
def test_a_host_header_naming_another_host_is_answered_421(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority, host: str
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    raw, _ = conn.tunnel("secret.test:443")
    with trusting(authority).wrap_socket(raw, server_hostname="secret.test") as tls:
        reply = request(tls, f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n")
    assert status(reply) == "HTTP/1.1 421 Misdirected Request", reply
    assert b"X-Kodeagent-Egress-Rule: host-mismatch" in reply
    assert len(internet.hits("net")) == before


def test_two_host_headers_or_an_absolute_target_are_refused(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    for head, expected in [
        ("GET / HTTP/1.1\r\nHost: secret.test\r\nHost: other.test\r\n\r\n", "421 Misdirected Request"),
        ("GET https://other.test/ HTTP/1.1\r\nHost: secret.test\r\n\r\n", "400 Bad Request"),
        ("CONNECT other.test:443 HTTP/1.1\r\n\r\n", "400 Bad Request"),
    ]:
        raw, _ = conn.tunnel("secret.test:443")
        with trusting(authority).wrap_socket(raw, server_hostname="secret.test") as tls:
            assert status(request(tls, head)) == f"HTTP/1.1 {expected}"
    assert len(internet.hits("net")) == before


@pytest.mark.parametrize("target", [f"{PUBLIC}:443", "other.test:443", "secret.test:80"])
def test_another_destination_is_a_plain_tunnel_without_the_secret(
    client: tuple[Client, EgressLink], internet: FakeInternet, target: str
) -> None:
    """The secret host's address, another name for it, another port: what the code writes in its SNI
    and Host does not matter; the secret is added for the host and port the gateway connected to."""
    conn, _ = client
    before = len(internet.hits("net"))
    raw, answer = conn.tunnel(target)
    assert status(answer) == "HTTP/1.1 200 Connection established"
    if target.endswith(":80"):
        with raw:
            reply = request(raw, "GET /plain HTTP/1.1\r\nHost: secret.test\r\nConnection: close\r\n\r\n")  # type: ignore[arg-type]
    else:
        context = ssl.create_default_context(cafile=internet.ca_file)  # the real server's own certificate
        with context.wrap_socket(raw, server_hostname="secret.test") as tls:
            reply = request(tls, "GET /tunnel HTTP/1.1\r\nHost: secret.test\r\nConnection: close\r\n\r\n")
    assert status(reply).endswith(" 200 OK"), reply
    assert len(internet.hits("net")) == before + 1
    assert SECRET not in json.dumps(internet.hits("net")[-1])


def test_plain_http_to_a_secret_host_is_refused(
    client: tuple[Client, EgressLink], internet: FakeInternet
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    with conn.connect() as sock:
        reply = request(sock, "GET http://secret.test/ HTTP/1.1\r\nHost: secret.test\r\n\r\n")  # type: ignore[arg-type]
    assert status(reply) == "HTTP/1.1 403 Forbidden"
    assert b"X-Kodeagent-Egress-Rule: secret-needs-https" in reply
    assert len(internet.hits("net")) == before


def test_an_upstream_whose_certificate_does_not_verify_gets_no_request(
    client: tuple[Client, EgressLink], internet: FakeInternet
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    raw, answer = conn.tunnel("unverified.test:443")
    with raw:
        answer += read_all(raw)
    assert status(answer) == "HTTP/1.1 502 Bad Gateway", answer
    assert b"X-Kodeagent-Egress-Rule: upstream-unverified" in answer
    assert len(internet.hits("net")) == before


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: secret.test\r\n\r\n",  # plain HTTP where TLS must come
        b"\x16\x03\x01\xff\xff" + b"\x00" * 300,  # a record far larger than it is
        b"\x16\x03\x01\x00\x30" + bytes(range(48)),  # a handshake record of noise
    ],
)
def test_a_hostile_tls_client_is_dropped_and_the_gateway_serves_on(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority, garbage: bytes
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    raw, _ = conn.tunnel("secret.test:443")
    with raw:
        raw.sendall(garbage)
        reply = read_all(raw)
    assert b"HTTP/1.1" not in reply  # no request went on: nothing to answer
    assert len(internet.hits("net")) == before
    still_intercepts(conn, internet, authority)


def test_a_slow_handshake_is_cut_off(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority
) -> None:
    conn, _ = client
    raw, _ = conn.tunnel("secret.test:443")
    hello = _client_hello(authority)
    with raw:
        started = time.monotonic()
        for byte in hello:  # a byte at a time, far slower than the bound allows
            try:
                raw.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.1)
            if time.monotonic() - started > HEAD_SECONDS * 3:
                break
        assert read_all(raw) == b""  # closed without a ServerHello
    still_intercepts(conn, internet, authority)


def test_a_huge_intercepted_head_is_refused_before_anything_is_sent(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    raw, _ = conn.tunnel("secret.test:443")
    with trusting(authority).wrap_socket(raw, server_hostname="secret.test") as tls:
        try:
            tls.sendall(b"GET / HTTP/1.1\r\nHost: secret.test\r\nX-Filler: " + b"a" * 200_000 + b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass  # the gateway may close before it has read everything
        reply = read_all(tls)
    assert status(reply) in ("HTTP/1.1 431 Request Header Fields Too Large", ""), reply[:200]
    raw, _ = conn.tunnel("secret.test:443")
    with trusting(authority).wrap_socket(raw, server_hostname="secret.test") as tls:
        many = request(tls, "GET / HTTP/1.1\r\nHost: secret.test\r\n" + "X: y\r\n" * 150 + "\r\n")
    assert status(many) == "HTTP/1.1 400 Bad Request"
    assert len(internet.hits("net")) == before
    still_intercepts(conn, internet, authority)


def test_changed_secrets_apply_to_the_next_connection(
    internet: FakeInternet, authority: SessionAuthority
) -> None:
    with client_namespace(internet, RULES, authority) as (conn, link):
        renewed = NetworkPolicy(secrets={"secret.test": {"Authorization": "Bearer renewed-22"}})
        message = {"op": "policy", "id": link.ident, **service._policy_message(renewed, authority)}
        assert service._gateway().request(message)["ok"] is True
        still_intercepts(conn, internet, authority, expect="Bearer renewed-22")
        message = {"op": "policy", "id": link.ident, **service._policy_message(NetworkPolicy(), authority)}
        assert service._gateway().request(message)["ok"] is True
        raw, _ = conn.tunnel("secret.test:443")
        with raw, pytest.raises(ssl.SSLCertVerificationError):  # a plain tunnel now: the real server
            trusting(authority).wrap_socket(raw, server_hostname="secret.test")


def test_a_bad_secret_in_a_control_message_is_refused_without_its_value(
    client: tuple[Client, EgressLink],
) -> None:
    _, link = client
    for secret in (
        {
            "host": "secret.test",
            "port": 443,
            "headers": [["Authorization", "a\r\nb" + SECRET]],
            "certificate": "",
        },
        {"host": "secret.test", "port": 443, "headers": [["Authorization", SECRET]], "certificate": "junk"},
    ):
        reply = service._gateway().request({"op": "policy", "id": link.ident, "secrets": [secret]})
        assert reply["ok"] is False and SECRET not in json.dumps(reply)


def still_intercepts(
    conn: Client, internet: FakeInternet, authority: SessionAuthority, expect: str = SECRET
) -> None:
    raw, _ = conn.tunnel("secret.test:443")
    with trusting(authority).wrap_socket(raw, server_hostname="secret.test") as tls:
        reply = request(tls, "GET /again HTTP/1.1\r\nHost: secret.test\r\n\r\n")
    assert status(reply).endswith(" 200 OK"), reply
    hit = internet.hits_at(PUBLIC)[-1]
    assert hit["path"] == "/again" and ["Authorization", expect] in hit["headers"]


def _client_hello(authority: SessionAuthority) -> bytes:
    """The bytes of a real ClientHello (from an in-memory handshake)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = trusting(authority).wrap_bio(incoming, outgoing, server_hostname="secret.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


# ---------------------------------------------------------------------- the values stay hidden


def test_secret_values_appear_in_no_repr_dump_or_error() -> None:
    rules = NetworkPolicy(secrets={"api.example.com": {"Authorization": SECRET}})
    policy = Policy(network=rules)
    for shown in (
        repr(rules),
        str(rules),
        repr(policy),
        rules.model_dump_json(),
        json.dumps(rules.model_dump(mode="json")),
    ):
        assert SECRET not in shown
    assert "api.example.com" in repr(rules)
    assert rules.secrets[0].headers[0][1].get_secret_value() == SECRET
    bad = [
        {"allow": ["pypi.org"], "secrets": {"api.example.com": {"Authorization": SECRET}}},  # not allowed
        {"deny": ["api.example.com"], "secrets": {"api.example.com": {"Authorization": SECRET}}},
        {"secrets": {"api.example.com": {"Authorization": SECRET + "\r\nX: y"}}},
        {"secrets": {"api.example.com": {"Host": SECRET}}},
        {"secrets": {"10.0.0.1": {"Authorization": SECRET}}},
        {"secrets": {"*.example.com": {"Authorization": SECRET}}},
        {"secrets": {"api.example.com": {"Authorization": SECRET}}, "max_connections": 0},
    ]
    for fields in bad:
        for make, argument in (
            (NetworkPolicy.model_validate, fields),
            (Policy.model_validate, {"network": fields}),
        ):
            with pytest.raises(ValidationError) as caught:
                make(argument)
            shown = (str(caught.value), repr(caught.value.errors(include_input=False)))
            assert not any(SECRET in text for text in shown), shown


def test_a_secret_takes_a_port_and_refuses_a_second_entry_for_it() -> None:
    (secret,) = NetworkPolicy(secrets={"API.example.com:8443": {"A": "b"}}).secrets
    assert (secret.host, secret.port) == ("api.example.com", 8443)
    assert Secret(host="api.example.com", headers={"A": "b"}).port == 443
    for host in ("a.example:8443", "*.example", "10.0.0.1", "a b"):
        with pytest.raises(ValidationError):
            Secret(host=host, port=443, headers={"A": "b"})
    with pytest.raises(ValidationError, match="two secrets"):
        NetworkPolicy(
            secrets=[
                Secret(host="a.example", headers={"A": "b"}),
                {"host": "a.example", "headers": {"C": "d"}},
            ]
        )
    with pytest.raises(ValueError, match="opened without secrets"):
        service._policy_message(NetworkPolicy(secrets={"a.example": {"A": "b"}}), None)


def test_the_session_ca_signs_leaves_for_its_hosts_only(authority: SessionAuthority) -> None:
    """A leaf verifies for its host under the session's CA, and nowhere else."""
    chain = authority.leaf("secret.test")
    assert "PRIVATE KEY" in chain and "PRIVATE KEY" not in authority.bundle().decode(errors="replace")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    fd = os.memfd_create("leaf")
    os.write(fd, chain.encode())
    server.load_cert_chain(f"/proc/self/fd/{fd}")
    os.close(fd)
    for name, context, ok in [
        ("secret.test", trusting(authority), True),
        ("other.test", trusting(authority), False),
        ("secret.test", trusting(SessionAuthority()), False),  # another session's CA
    ]:
        left, right = socket.socketpair()
        with left, right:
            threading.Thread(target=_serve_once, args=(server, right), daemon=True).start()
            if ok:
                context.wrap_socket(left, server_hostname=name).close()
            else:
                with pytest.raises(ssl.SSLCertVerificationError):
                    context.wrap_socket(left, server_hostname=name)


def _serve_once(server: ssl.SSLContext, sock: socket.socket) -> None:
    try:
        server.wrap_socket(sock, server_side=True).close()
    except (OSError, ssl.SSLError):
        pass


def test_a_slow_intercepted_head_is_cut_off(
    client: tuple[Client, EgressLink], internet: FakeInternet, authority: SessionAuthority
) -> None:
    conn, _ = client
    before = len(internet.hits("net"))
    raw, _ = conn.tunnel("secret.test:443")
    with trusting(authority).wrap_socket(raw, server_hostname="secret.test") as tls:
        tls.sendall(b"GET / HTTP/1.1\r\nHost: secret.test\r\n")  # and never the blank line
        reply = read_all(tls)
    assert status(reply) == "HTTP/1.1 408 Request Timeout", reply
    assert len(internet.hits("net")) == before
