"""`network=True` on the host backend: the public internet through the egress gateway, nothing else.

Real traffic on this machine only: the gateway connects from, and resolves names in, the fake
internet of `fake_internet.py`. Every session runs with ``python_guards=False`` (the gateway and the
namespace hold on their own); each proof is on the server's side: what arrived (its log) or not.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from support.fake_internet import (
    DENIED,
    DNS,
    HOST_OWN,
    METADATA,
    PRIVATE,
    PUBLIC,
    FakeInternet,
    fake_internet,
    gateway_through,
    unavailable,
)
from support.needs import require

from sandboxes import Policy
from sandboxes.backends.host import HostExecutor
from sandboxes.backends.host.process import namespaces_available
from sandboxes.egress import service
from sandboxes.egress.policy import NetworkPolicy

pytestmark = pytest.mark.anyio

FETCH = """
import json, urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as reply:
            return {"status": reply.status, "body": reply.read().decode()}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "rule": exc.headers.get("X-Kodeagent-Egress-Rule"), "body": exc.read().decode()}
    except Exception as exc:
        return {"status": None, "error": repr(exc)}
"""

RAW = """
import socket
def raw(request, address=("127.0.0.1", 3128)):
    s = socket.create_connection(address, 10)
    s.sendall(request)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data.decode(errors="replace")
"""


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    require(unavailable(), "the fake internet")
    require(None if namespaces_available() else "bubblewrap cannot make namespaces here", "network=True")
    with fake_internet() as net, gateway_through(net):
        yield net


def policy(network: bool | NetworkPolicy = True) -> Policy:
    return Policy(network=network, python_guards=False)


@pytest.fixture
async def session(internet: FakeInternet) -> AsyncIterator[HostExecutor]:
    async with HostExecutor(policy=policy(), timeout=60) as ex:
        assert (await ex.run(FETCH + RAW)).ok
        yield ex


async def fetch(ex: HostExecutor, url: str) -> dict[str, Any]:
    result = await ex.run(f"print(json.dumps(fetch({url!r})))")
    assert result.ok, result
    return json.loads(result.stdout)


async def test_a_public_host_is_reached_by_name_and_reported(
    session: HostExecutor, internet: FakeInternet
) -> None:
    result = await session.run("print(json.dumps(fetch('http://public.test/')))")
    assert json.loads(result.stdout) == {"status": 200, "body": f"hello from {PUBLIC}"}
    assert result.network is not None
    (connection,) = result.network.connections
    assert (connection.host, connection.port, connection.address) == ("public.test", 80, PUBLIC)
    assert connection.allowed and connection.rule == "public" and connection.bytes_received > 0
    assert connection.bytes_sent >= len("GET / HTTP/1.1\r\n\r\n")  # the forwarded head counts
    assert internet.hits_at(PUBLIC)[-1]["host"] == "public.test"


@pytest.mark.parametrize(
    ("url", "rule", "target"),
    [
        (f"http://{PRIVATE}/", "private", PRIVATE),
        (f"http://{METADATA}/latest/meta-data/", "link-local", METADATA),
        ("http://metadata.test/latest/meta-data/", "link-local", METADATA),
        ("http://rebind.test/", "private", PRIVATE),  # a name that resolves to a private address
        (f"http://{HOST_OWN}/", "this-machine", HOST_OWN),  # public, but this machine's own
    ],
)
async def test_what_is_not_the_public_internet_is_refused_naming_the_rule(
    session: HostExecutor, internet: FakeInternet, url: str, rule: str, target: str
) -> None:
    before = len(internet.hits_at(target))
    result = await session.run(f"print(json.dumps(fetch({url!r})))")
    answer = json.loads(result.stdout)
    assert answer["status"] == 403 and answer["rule"] == rule, answer
    assert json.loads(answer["body"])["refused_by"] == rule
    assert result.network is not None and [c.rule for c in result.network.connections] == [rule]
    assert not result.network.connections[0].allowed
    assert len(internet.hits_at(target)) == before


async def test_the_gateway_host_loopback_is_refused_even_past_no_proxy(
    session: HostExecutor, internet: FakeInternet
) -> None:
    before = len(internet.hits("host"))
    answer = await session.run(
        "print(raw(b'GET http://127.0.0.1/ HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n').split(chr(13))[0])\n"
        "print(raw(b'CONNECT localhost:80 HTTP/1.1\\r\\n\\r\\n').split(chr(13))[0])\n"
        "print(raw(b'CONNECT 127.0.0.1:3128 HTTP/1.1\\r\\n\\r\\n').split(chr(13))[0])\n"
    )
    assert answer.stdout.splitlines() == ["HTTP/1.1 403 Forbidden"] * 3, answer
    assert len(internet.hits("host")) == before


async def test_a_name_resolving_to_private_and_public_addresses_gets_the_public_one(
    session: HostExecutor, internet: FakeInternet
) -> None:
    before = len(internet.hits_at(PRIVATE))
    assert await fetch(session, "http://mixed.test/") == {"status": 200, "body": f"hello from {PUBLIC}"}
    assert len(internet.hits_at(PRIVATE)) == before


async def test_code_that_ignores_the_proxy_has_no_network(
    session: HostExecutor, internet: FakeInternet
) -> None:
    before = len(internet.hits("net"))
    result = await session.run(
        "import socket, errno\n"
        "out = []\n"
        f"for target in [({PUBLIC!r}, 80), ({METADATA!r}, 80), ('198.18.0.2', 80)]:\n"
        "    try:\n"
        "        socket.create_connection(target, 5)\n"
        "        out.append('connected')\n"
        "    except OSError as exc:\n"
        "        out.append(errno.errorcode[exc.errno])\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n"
        f"    u.sendto(b'x', ({DNS!r}, 53))\n"
        "    out.append('sent')\n"
        "except OSError as exc:\n"
        "    out.append(errno.errorcode[exc.errno])\n"
        "print(out)"
    )
    assert result.stdout.strip() == str(["ENETUNREACH"] * 4), result
    assert len(internet.hits("net")) == before


async def test_a_deny_rule_refuses_at_once_and_allow_rules_narrow(internet: FakeInternet) -> None:
    rules = NetworkPolicy(allow=["*.test:80"], deny=["denied.test"])
    async with HostExecutor(policy=policy(rules), timeout=60) as ex:
        await ex.run(FETCH)
        denied = await fetch(ex, "http://denied.test/")
        assert denied["status"] == 403 and denied["rule"] == "deny 'denied.test'", denied
        literal = await fetch(ex, f"http://{DENIED}/")  # no allow rule names the bare address
        assert literal["status"] == 403 and literal["rule"] == "not-allowed", literal
        assert (await fetch(ex, "http://public.test/"))["status"] == 200
    assert internet.hits_at(DENIED) == []


async def test_a_private_address_is_reached_only_when_allowed_by_its_range(internet: FakeInternet) -> None:
    async with HostExecutor(policy=policy(NetworkPolicy(allow=[f"{PRIVATE}/32:80"])), timeout=60) as ex:
        await ex.run(FETCH)
        assert await fetch(ex, f"http://{PRIVATE}/") == {"status": 200, "body": f"hello from {PRIVATE}"}
        refused = await fetch(ex, "http://public.test/")
        assert refused["status"] == 403 and refused["rule"] == "not-allowed"


async def test_a_live_policy_change_applies_to_the_next_connection(session: HostExecutor) -> None:
    assert (await fetch(session, "http://public.test/"))["status"] == 200
    await session.set_network(NetworkPolicy(deny=["public.test"]))
    refused = await fetch(session, "http://public.test/")
    assert refused["status"] == 403 and refused["rule"] == "deny 'public.test'"
    await session.set_network(False)
    off = await fetch(session, f"http://{PUBLIC}/")
    assert off["status"] == 403 and off["rule"] == "network-off"
    await session.set_network(True)
    assert (await fetch(session, "http://public.test/"))["status"] == 200


async def test_connect_and_socks5_tunnels_follow_the_same_rules(
    session: HostExecutor, internet: FakeInternet
) -> None:
    result = await session.run(
        "print(raw(b'CONNECT public.test:80 HTTP/1.1\\r\\n\\r\\nGET / HTTP/1.0\\r\\nHost: public.test\\r\\n\\r\\n')"
        ".splitlines()[-1])\n"
        "def socks(host):\n"
        "    s = socket.create_connection(('127.0.0.1', 3128), 10)\n"
        "    s.sendall(b'\\x05\\x01\\x00')\n"
        "    assert s.recv(2) == b'\\x05\\x00'\n"
        "    s.sendall(b'\\x05\\x01\\x00\\x03' + bytes([len(host)]) + host + b'\\x00\\x50')\n"
        "    reply = s.recv(10)\n"
        "    if reply[1] != 0:\n"
        "        return f'refused {reply[1]}'\n"
        "    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
        "    data = b''\n"
        "    while chunk := s.recv(4096):  # HTTP/1.0: the server closes after its answer\n"
        "        data += chunk\n"
        "    return data.decode().splitlines()[-1]\n"
        "print(socks(b'public.test'))\n"
        "print(socks(b'rebind.test'))\n"
    )
    assert result.stdout.splitlines() == [f"hello from {PUBLIC}", f"hello from {PUBLIC}", "refused 2"], result
    assert result.network is not None
    assert [(c.protocol, c.allowed, c.rule) for c in result.network.connections] == [
        ("connect", True, "public"),
        ("socks5", True, "public"),
        ("socks5", False, "private"),
    ]


async def test_a_concurrent_session_is_out_of_reach(internet: FakeInternet) -> None:
    async with (
        HostExecutor(policy=policy(), timeout=60) as first,
        HostExecutor(policy=policy(), timeout=60) as second,
    ):
        served = await first.run(
            "import socket\nserver = socket.socket()\nserver.bind(('127.0.0.1', 8765))\nserver.listen()\n"
            "server.setblocking(False)\nprint('listening')"
        )
        assert served.stdout == "listening\n", served
        await second.run(RAW)
        tried = await second.run(
            "import errno\n"
            "try:\n    socket.create_connection(('127.0.0.1', 8765), 5)\n    print('connected')\n"
            "except OSError as exc:\n    print(errno.errorcode[exc.errno])\n"
            "print(raw(b'CONNECT 127.0.0.1:8765 HTTP/1.1\\r\\n\\r\\n').split(chr(13))[0])"
        )
        assert tried.stdout.splitlines() == ["ECONNREFUSED", "HTTP/1.1 403 Forbidden"], tried
        arrived = await first.run(
            "try:\n    server.accept()\n    print('a connection arrived')\nexcept BlockingIOError:\n    print('none')"
        )
        assert arrived.stdout == "none\n", arrived


async def test_a_network_off_session_gets_no_report_and_cannot_be_turned_on(internet: FakeInternet) -> None:
    async with HostExecutor(policy=Policy(python_guards=False), timeout=30) as ex:
        result = await ex.run("print(1)")
        assert result.network is None
        with pytest.raises(ValueError, match="without network"):
            await ex.set_network(True)


async def test_the_gateway_runs_unprivileged(session: HostExecutor) -> None:
    process = service._PROCESS
    assert process is not None and process.alive()
    status = await anyio.Path(f"/proc/{process.process.pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert set(uids) == {"65534"}
    caps = next(line for line in status.splitlines() if line.startswith("CapEff:")).split()[1]
    assert int(caps, 16) == 0
