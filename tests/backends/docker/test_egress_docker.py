"""`network=True` on the docker backend: a container with no Docker network (``none``) whose only way
out is the egress gateway's listener in its namespace. Real traffic against the fake internet of
`fake_internet.py`, with ``python_guards=False``; proofs on the servers' side."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support import backend_docker
from support.egress_probe import key_needles, parse, probe_code
from support.fake_internet import (
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
from sandboxes.egress.policy import NetworkPolicy
from sandboxes.errors import BackendUnavailable

pytestmark = pytest.mark.anyio

FETCH = """
import json, urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as reply:
            return [reply.status, reply.read().decode()]
    except urllib.error.HTTPError as exc:
        return [exc.code, exc.headers.get("X-Kodeagent-Egress-Rule")]
    except Exception as exc:
        return [None, type(exc).__name__]
"""


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    require(unavailable(), "the fake internet")
    backend_docker.require()
    with fake_internet() as net, gateway_through(net):
        yield net


POLICY = Policy(network=True, python_guards=False)


async def test_a_container_reaches_the_public_internet_and_nothing_else(internet: FakeInternet) -> None:
    before = {address: len(internet.hits_at(address)) for address in (PRIVATE, METADATA, HOST_OWN)}
    async with backend_docker.make_executor(policy=POLICY, timeout=60, pool=False) as ex:
        await ex.run(FETCH)
        urls = [
            "http://public.test/",
            f"http://{PRIVATE}/",
            "http://metadata.test/",
            "http://rebind.test/",
            f"http://{HOST_OWN}/",
        ]
        result = await ex.run(f"print(json.dumps([fetch(u) for u in {urls!r}]))")
        assert json.loads(result.stdout) == [
            [200, f"hello from {PUBLIC}"],
            [403, "private"],
            [403, "link-local"],
            [403, "private"],
            [403, "this-machine"],
        ], result
        assert result.network is not None and len(result.network.connections) == 5
        direct = await ex.run(
            "import socket, errno\ntry:\n"
            f"    socket.create_connection(({PUBLIC!r}, 80), 5)\n    print('connected')\n"
            "except OSError as exc:\n    print(errno.errorcode[exc.errno])"
        )
        assert direct.stdout == "ENETUNREACH\n", direct
        await ex.set_network(NetworkPolicy(deny=["public.test"]))
        denied = await ex.run("print(json.dumps(fetch('http://public.test/')))")
        assert json.loads(denied.stdout) == [403, "deny 'public.test'"]
    assert {address: len(internet.hits_at(address)) for address in before} == before


async def test_shared_containers_refuse_network(internet: FakeInternet) -> None:
    with pytest.raises(BackendUnavailable, match="sessions_per_container"):
        async with backend_docker.make_executor(
            policy=POLICY, timeout=30, pool=False, sessions_per_container=4
        ):
            pass


SECRET = "Bearer docker-s3cret-93aa"
SECRET_RULES = NetworkPolicy(secrets={"secret.test": {"Authorization": SECRET}})


async def test_a_container_never_holds_its_egress_secret(internet: FakeInternet) -> None:
    """The secret arrives at the server; the container's environment, files, /proc (the runner's
    memory too) and the traffic its code sees hold none of it; the CA bundle is the container's."""
    policy = Policy(network=SECRET_RULES, python_guards=False)
    async with backend_docker.make_executor(policy=policy, timeout=120, pool=False) as ex:
        await ex.run(FETCH)
        fetched = await ex.run("print(json.dumps(fetch('https://secret.test/from-docker')))")
        assert json.loads(fetched.stdout) == [200, f"hello from {PUBLIC} over tls"], fetched
        hit = next(h for h in reversed(internet.hits_at(PUBLIC)) if h["path"] == "/from-docker")
        assert ["Authorization", SECRET] in hit["headers"]
        assert fetched.network is not None and [c.secret for c in fetched.network.connections] == [True]
        authority = ex.session.egress.authority  # type: ignore[attr-defined]
        found = parse((await ex.run(probe_code([SECRET, *key_needles(authority._key)]))).stdout)
        assert "error" not in found, found
        assert [found[k] for k in ("environ", "proc", "memory", "files")] == [[], [], [], []], found
        assert found["runner"] in found["memory_scanned"]  # type: ignore[operator]
        bundle = await ex.run(
            "import os, ssl; print(os.environ['SSL_CERT_FILE'] == ssl.get_default_verify_paths().cafile)"
        )
        assert bundle.stdout == "True\n", bundle
        for shown in (repr(fetched), fetched.model_dump_json(), repr(ex.policy)):
            assert SECRET not in shown
