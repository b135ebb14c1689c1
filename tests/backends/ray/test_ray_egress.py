"""`network=True` and `NetworkPolicy` on the ray backend: each node's own executor builds the egress
gateway for the sessions it runs (the node is a host), the connection report comes back with the
result, and `set_network` on a live session reaches the node's gateway, and the sessions that
replace it.

The real local cluster of `backend_ray`; the "service on this machine" is an HTTP server on the
host's loopback (every node of the test cluster is this machine), reached only through a node's
gateway, and its log is the proof of what arrived.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from support import backend_ray
from support.loopback_http import GATEWAY_GET, LoopbackHttp
from support.needs import require

from sandboxes import NetworkPolicy, Policy

pytestmark = [pytest.mark.anyio, pytest.mark.ray]


@pytest.fixture(scope="module")
def cluster() -> Any:
    require(backend_ray.unavailable(), "the ray backend")
    from sandboxes.backends.host.process import namespaces_available
    from sandboxes.egress.service import unavailable

    require(unavailable() or (None if namespaces_available() else "no namespaces here"), "the egress gateway")
    return backend_ray.cluster()


@pytest.fixture
def service(cluster: Any) -> Iterator[LoopbackHttp]:
    with LoopbackHttp() as server:
        yield server


def policy(network: bool | NetworkPolicy) -> Policy:
    return Policy(network=network, allowed_imports=["socket", "time"], python_guards=False)


def fetch(port: int) -> str:
    return f"print(gateway_get('127.0.0.1', {port})[0])"


async def test_the_nodes_gateway_applies_the_rules_and_reports_back(service: LoopbackHttp) -> None:
    from sandboxes.egress import service as gateway

    other = LoopbackHttp()
    rules = NetworkPolicy(allow=[f"127.0.0.1:{service.port}"])
    driver_gateway = gateway._PROCESS  # another test in this process may have started one
    try:
        async with backend_ray.make_executor(policy=policy(rules), timeout=30) as ex:
            assert (await ex.run(GATEWAY_GET)).ok
            result = await ex.run(fetch(service.port) + "\n" + fetch(other.port))
    finally:
        other.close()
    assert result.ok, result.error
    assert result.stdout.splitlines() == ["HTTP/1.0 200 OK", "HTTP/1.1 403 Forbidden"]
    assert result.network is not None
    assert [(c.port, c.allowed, c.rule) for c in result.network.connections] == [
        (service.port, True, f"allow '127.0.0.1:{service.port}'"),
        (other.port, False, "loopback"),
    ]
    assert service.paths == ["/"] and other.paths == []
    # the driver built no gateway for this session (nor replaced its own): the node's executor did
    assert gateway._PROCESS is driver_gateway


async def test_set_network_on_a_live_session_reaches_the_nodes_gateway(service: LoopbackHttp) -> None:
    allowed = NetworkPolicy(allow=["127.0.0.0/8"])
    async with backend_ray.make_executor(policy=policy(allowed), timeout=30) as ex:
        await ex.run(GATEWAY_GET)
        before = await ex.run(fetch(service.port))
        await ex.set_network(NetworkPolicy(allow=["127.0.0.0/8"], deny=[f"127.0.0.1:{service.port}"]))
        denied = await ex.run(fetch(service.port))
        await ex.set_network(False)
        off = await ex.run(fetch(service.port))
        await ex.set_network(True)
        public_only = await ex.run(fetch(service.port))
    assert before.stdout == "HTTP/1.0 200 OK\n"
    for result, rule in (
        (denied, f"deny '127.0.0.1:{service.port}'"),
        (off, "network-off"),
        (public_only, "loopback"),
    ):
        assert result.stdout == "HTTP/1.1 403 Forbidden\n", result
        assert result.network is not None and [c.rule for c in result.network.refused] == [rule]
    assert service.paths == ["/"]  # only the first run's request arrived


async def test_a_replaced_session_keeps_the_rules_set_on_its_predecessor(service: LoopbackHttp) -> None:
    async with backend_ray.make_executor(
        policy=policy(NetworkPolicy(allow=["127.0.0.0/8"])), timeout=30
    ) as ex:
        await ex.set_network(NetworkPolicy(allow=["127.0.0.0/8"], deny=[f"127.0.0.1:{service.port}"]))
        with anyio.move_on_after(1):
            await ex.run("import time\ntime.sleep(30)")  # cancelled: the session is replaced
        result = await ex.run(GATEWAY_GET + fetch(service.port))
    assert result.state_lost  # a new session, opened with the rules as they are now
    assert result.stdout == "HTTP/1.1 403 Forbidden\n"
    assert result.network is not None and [c.rule for c in result.network.refused] == [
        f"deny '127.0.0.1:{service.port}'"
    ]
    assert service.paths == []


async def test_a_network_off_session_cannot_be_turned_on(cluster: Any) -> None:
    async with backend_ray.make_executor(timeout=30) as ex:
        with pytest.raises(ValueError, match="opened without network"):
            await ex.set_network(True)
        assert (await ex.run("print(1)")).network is None
