"""Secrets at egress on the host backend: the gateway adds them, the session never holds them.

Real traffic on this machine only (the fake internet of `fake_internet.py`, whose HTTPS server logs
the headers it received), every session with ``python_guards=False``: the proof that the secret is
nowhere inside is a search by the code itself (`egress_probe.py`), with every means plain Python has.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from support.egress_probe import key_needles, parse, probe_code
from support.fake_internet import PUBLIC, FakeInternet, fake_internet, gateway_through, unavailable
from support.needs import require

from sandboxes import Policy
from sandboxes.backends.host import HostExecutor
from sandboxes.backends.host.process import namespaces_available
from sandboxes.egress.policy import NetworkPolicy
from sandboxes.egress.service import CA_VARIABLES

pytestmark = pytest.mark.anyio

SECRET = "Bearer host-s3cret-41d9"
KEY = "key-0c7e55"
RULES = NetworkPolicy(secrets={"secret.test": {"Authorization": SECRET, "X-Api-Key": KEY}})

FETCH = """
import json, urllib.request, urllib.error
def fetch(url, **headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as reply:
            return {"status": reply.status, "headers": dict(reply.headers), "body": reply.read().decode()}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "rule": exc.headers.get("X-Kodeagent-Egress-Rule"), "body": exc.read().decode()}
    except Exception as exc:
        return {"status": None, "error": repr(exc)}
"""


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    require(unavailable(), "the fake internet")
    require(None if namespaces_available() else "bubblewrap cannot make namespaces here", "network=True")
    with fake_internet() as net, gateway_through(net):
        yield net


@pytest.fixture
async def session(internet: FakeInternet) -> AsyncIterator[HostExecutor]:
    async with HostExecutor(policy=Policy(network=RULES, python_guards=False), timeout=120) as ex:
        assert (await ex.run(FETCH)).ok
        yield ex


async def fetch(ex: HostExecutor, url: str, **headers: str) -> dict[str, Any]:
    result = await ex.run(f"print(json.dumps(fetch({url!r}, **{headers!r})))")
    assert result.ok, result
    return json.loads(result.stdout)


def received(internet: FakeInternet, path: str) -> list[list[str]]:
    return next(h["headers"] for h in reversed(internet.hits_at(PUBLIC)) if h["path"] == path)


async def test_the_secret_arrives_and_the_code_sees_none_of_it(
    session: HostExecutor, internet: FakeInternet
) -> None:
    answer = await fetch(session, "https://secret.test/api", Authorization="placeholder")
    assert answer["status"] == 200 and answer["body"] == f"hello from {PUBLIC} over tls", answer
    headers = received(internet, "/api")
    assert ["Authorization", SECRET] in headers and ["X-Api-Key", KEY] in headers
    assert [v for n, v in headers if n.lower() == "authorization"] == [SECRET]
    assert SECRET not in json.dumps(answer) and KEY not in json.dumps(answer)
    result = await session.run("print(json.dumps(fetch('https://secret.test/again')))")
    assert result.network is not None
    (connection,) = result.network.connections
    assert (connection.host, connection.port, connection.secret, connection.allowed) == (
        "secret.test",
        443,
        True,
        True,
    )
    for shown in (repr(result), result.model_dump_json(), repr(session), repr(session.policy)):
        assert SECRET not in shown and KEY not in shown


async def test_the_secret_is_nowhere_inside_the_session(session: HostExecutor) -> None:
    await fetch(session, "https://secret.test/before-the-search")
    authority = session.session.egress.authority  # type: ignore[attr-defined]
    found = parse((await session.run(probe_code([SECRET, KEY, *key_needles(authority._key)]))).stdout)
    assert "error" not in found, found
    assert {k: found[k] for k in ("environ", "proc", "memory", "files")} == {
        "environ": [],
        "proc": [],
        "memory": [],
        "files": [],
    }, found
    assert found["runner"] in found["memory_scanned"]  # type: ignore[operator]
    assert int(found["files_scanned"]) > 0  # type: ignore[call-overload]
    assert "/tmp" in found["roots"]  # type: ignore[operator]


async def test_the_session_trusts_its_own_ca_through_the_usual_variables(session: HostExecutor) -> None:
    result = await session.run(
        "import os, ssl\n"
        f"paths = {{os.environ[name] for name in {list(CA_VARIABLES)!r}}}\n"
        "(path,) = paths\n"
        "data = open(path).read()\n"
        "try:\n    open(path, 'a')\n    writable = True\nexcept OSError:\n    writable = False\n"
        "print(json.dumps({'path': path, 'certificates': data.count('BEGIN CERTIFICATE'), 'writable': writable,"
        " 'default': ssl.get_default_verify_paths().cafile == path}))"
    )
    info = json.loads(result.stdout)
    assert info["path"].startswith("/tmp/kodeagent-egress-ca-") and not info["writable"], info
    assert info["certificates"] >= 1 and info["default"] is True, info


async def test_an_echoing_server_reveals_the_secret(session: HostExecutor) -> None:
    """The documented limit: what the server sends back, the code reads."""
    answer = await fetch(session, "https://secret.test/echo")
    assert answer["status"] == 200 and SECRET in answer["body"]


async def test_plain_http_and_the_address_literal_carry_no_secret(
    session: HostExecutor, internet: FakeInternet
) -> None:
    plain = await fetch(session, "http://secret.test/plain")
    assert plain["status"] == 403 and plain["rule"] == "secret-needs-https", plain
    literal = await fetch(session, f"https://{PUBLIC}/literal")  # tunnelled: the real server's certificate
    assert literal["status"] is None and "CERTIFICATE_VERIFY_FAILED" in literal["error"], literal
    assert not any(
        SECRET in json.dumps(hit)
        for hit in internet.hits("net")
        if hit["path"] != "/echo" and hit["path"] not in ("/api", "/again", "/before-the-search")
    )


async def test_changed_secrets_apply_to_the_next_connection(
    session: HostExecutor, internet: FakeInternet
) -> None:
    await session.set_network(NetworkPolicy(secrets={"secret.test": {"Authorization": "Bearer renewed-8a"}}))
    assert (await fetch(session, "https://secret.test/renewed"))["status"] == 200
    assert ["Authorization", "Bearer renewed-8a"] in received(internet, "/renewed")
    await session.set_network(True)  # no secrets: a plain tunnel, which the session cannot verify
    gone = await fetch(session, "https://secret.test/gone")
    assert gone["status"] is None and "CERTIFICATE_VERIFY_FAILED" in gone["error"], gone
    await session.set_network(RULES)
    assert (await fetch(session, "https://secret.test/back"))["status"] == 200
    assert ["Authorization", SECRET] in received(internet, "/back")


async def test_secrets_need_a_session_opened_with_them(internet: FakeInternet) -> None:
    async with HostExecutor(policy=Policy(network=True, python_guards=False), timeout=60) as ex:
        env = (await ex.run("import os; print(sorted(k for k in os.environ if 'CA' in k))")).stdout
        assert "SSL_CERT_FILE" not in env  # no secrets, no CA: nothing is intercepted
        with pytest.raises(ValueError, match="opened without secrets"):
            await ex.set_network(RULES)


async def test_the_bundle_goes_with_the_session(internet: FakeInternet) -> None:
    async with HostExecutor(policy=Policy(network=RULES, python_guards=False), timeout=60) as ex:
        path = (await ex.run("import os; print(os.environ['SSL_CERT_FILE'])")).stdout.strip()
        link = ex.session.egress  # type: ignore[attr-defined]
        folder, name = link._bundle
        assert name == os.path.basename(path) and os.stat(name, dir_fd=folder).st_uid == 0
        kept = os.dup(folder)
    try:
        with pytest.raises(FileNotFoundError):
            os.stat(name, dir_fd=kept)
    finally:
        os.close(kept)


async def test_the_probe_finds_what_is_there(internet: FakeInternet) -> None:
    """The search above can fail: a value planted in the environment, a file and the runner's memory
    is found in each."""
    planted = "planted-5e0b71"
    policy = Policy(network=RULES, python_guards=False)
    async with HostExecutor(policy=policy, timeout=120, env={"PLANTED": planted}) as ex:
        hidden = bytes(b ^ 0x33 for b in planted.encode()).hex()
        planting = await ex.run(
            f"held = bytes(b ^ 0x33 for b in bytes.fromhex({hidden!r}))\n"
            "import os\nopen('planted.txt', 'wb').write(held)\nprint(os.path.realpath('planted.txt'))"
        )
        assert planting.ok, planting
        found = parse((await ex.run(probe_code([planted]))).stdout)
    assert found["environ"] == ["own"] and found["files"] == [planting.stdout.strip()], found
    assert any(entry.endswith("/environ") for entry in found["proc"]), found  # type: ignore[union-attr]
    assert any(entry.startswith(f"{found['runner']}:") for entry in found["memory"]), found  # type: ignore[union-attr]


async def test_requests_and_curl_trust_the_session_ca_and_carry_the_secret(
    session: HostExecutor, internet: FakeInternet
) -> None:
    require(None if shutil.which("curl") else "curl is not installed (apt-get install curl)", "curl")
    result = await session.run(
        "import subprocess, requests\n"
        "print(requests.get('https://secret.test/by-requests', timeout=20).text)\n"
        "print(subprocess.run(['curl', '-sS', 'https://secret.test/by-curl'], capture_output=True, text=True).stdout)"
    )
    assert result.stdout.splitlines() == [f"hello from {PUBLIC} over tls"] * 2, result
    for path in ("/by-requests", "/by-curl"):
        assert ["Authorization", SECRET] in received(internet, path)


async def test_a_session_with_secrets_leaves_no_ready_worker_behind(internet: FakeInternet) -> None:
    """Its init names its own CA bundle, so no other open could take a worker initialised with it."""
    from sandboxes.backends.host.executor import POOLS

    async with HostExecutor(policy=Policy(network=RULES, python_guards=False), timeout=60) as ex:
        assert (await ex.run("print(1)")).stdout == "1\n"
    for _ in range(600):
        if not POOLS.refilling():
            break
        await anyio.sleep(0.05)
    assert not POOLS.refilling()
    with POOLS.ready.lock:
        keys = [key for key in POOLS.ready._items]
    assert not any("kodeagent-egress-ca-" in ready_key[1] for ready_key in keys), keys
