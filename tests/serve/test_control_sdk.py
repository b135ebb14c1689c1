"""The control plane through the unmodified `e2b` SDK, pointed at a real `kodeagent serve` on
loopback: create, get_info, list, set_timeout, connect, kill, lifetimes, and the exceptions the SDK
raises for what the server refuses (wrong key, unknown sandbox, another tenant's sandbox, caps)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from support.served import Served, serving

e2b = pytest.importorskip("e2b")
from e2b import Sandbox  # noqa: E402
from e2b.exceptions import (  # noqa: E402
    AuthenticationException,
    NotFoundException,
    RateLimitException,
    SandboxException,
)

from sandboxes.executor import Executor, ExecutorState  # noqa: E402

pytestmark = pytest.mark.e2b


def closed(executor: Executor) -> bool:
    return executor.state is ExecutorState.CLOSED


def wait_until(predicate: Any, limit: float = 20.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def test_create_get_list_kill(served: Served) -> None:
    sandbox = Sandbox.create(timeout=120, metadata={"job": "7"}, envs={"A": "1"}, **served.sdk_options())
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.metadata == {"job": "7"}
    assert info.allow_internet_access is False  # this server's internet is off, and so the default
    assert 115 <= (info.end_at - info.started_at).total_seconds() <= 121
    listed = Sandbox.list(**served.sdk_options()).next_items()
    assert [s.sandbox_id for s in listed] == [sandbox.sandbox_id]
    assert Sandbox.list(**served.sdk_options("bob")).next_items() == []
    held = served.app.registry.get("alice", sandbox.sandbox_id)
    assert held.sandbox.envs == {"A": "1"}
    assert sandbox.kill() is True
    assert closed(held.sandbox.executor)  # its session is gone, not just forgotten
    assert Sandbox.kill(sandbox.sandbox_id, **served.sdk_options()) is False
    assert Sandbox.list(**served.sdk_options()).next_items() == []


def test_list_filters_by_metadata_and_pages(served: Served) -> None:
    made = [Sandbox.create(metadata={"n": str(i % 2)}, **served.sdk_options()) for i in range(3)]
    from e2b import SandboxQuery

    odd = Sandbox.list(query=SandboxQuery(metadata={"n": "1"}), **served.sdk_options()).next_items()
    assert [s.sandbox_id for s in odd] == [made[1].sandbox_id]
    pages = Sandbox.list(limit=2, **served.sdk_options())
    seen = pages.next_items()
    assert len(seen) == 2 and pages.has_next
    seen += pages.next_items()
    assert not pages.has_next
    assert sorted(s.sandbox_id for s in seen) == sorted(s.sandbox_id for s in made)


def test_set_timeout_and_connect_move_the_end(served: Served) -> None:
    sandbox = Sandbox.create(timeout=60, **served.sdk_options())
    sandbox.set_timeout(600)
    later = sandbox.get_info().end_at
    assert (later - sandbox.get_info().started_at).total_seconds() > 590
    sandbox.set_timeout(30)  # E2B: set_timeout may shorten too
    shorter = sandbox.get_info().end_at
    assert shorter < later
    again = Sandbox.connect(sandbox.sandbox_id, timeout=10, **served.sdk_options())  # never shortens
    assert again.sandbox_id == sandbox.sandbox_id
    assert sandbox.get_info().end_at == shorter
    Sandbox.connect(sandbox.sandbox_id, timeout=900, **served.sdk_options())
    assert sandbox.get_info().end_at > later
    with pytest.raises(SandboxException, match="max_timeout"):
        sandbox.set_timeout(10**9)


def test_a_sandbox_is_killed_at_its_timeout(served: Served) -> None:
    sandbox = Sandbox.create(timeout=1, **served.sdk_options())
    executor = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.executor
    assert wait_until(lambda: not Sandbox.list(**served.sdk_options()).next_items())
    assert closed(executor)
    with pytest.raises(NotFoundException):
        sandbox.get_info()
    assert served.app.registry.killed_on_timeout == 1


def test_set_timeout_zero_ends_it_now(served: Served) -> None:
    sandbox = Sandbox.create(timeout=300, **served.sdk_options())
    sandbox.set_timeout(0)
    assert wait_until(lambda: served.app.registry.count() == 0)


def test_the_sdk_raises_its_own_exceptions(serve_with: Any) -> None:
    served = serve_with(max_sandboxes_per_key=1)
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_url=served.url, sandbox_url=served.url, api_key="e2b_" + "0" * 40)
    mine = Sandbox.create(**served.sdk_options())
    with pytest.raises(RateLimitException):
        Sandbox.create(**served.sdk_options())
    for tenant, sandbox_id in (("bob", mine.sandbox_id), ("alice", "0" * 20)):
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sandbox_id, **served.sdk_options(tenant))
        with pytest.raises(NotFoundException):
            Sandbox.connect(sandbox_id, **served.sdk_options(tenant))
        with pytest.raises(NotFoundException):
            Sandbox.set_timeout(sandbox_id, 10, **served.sdk_options(tenant))
        assert Sandbox.kill(sandbox_id, **served.sdk_options(tenant)) is False
    assert mine.get_info().sandbox_id == mine.sandbox_id  # bob's attempts left it alone
    with pytest.raises(SandboxException, match="max_timeout"):
        Sandbox.create(timeout=10**9, **served.sdk_options("bob"))
    with pytest.raises(SandboxException, match="internet"):
        Sandbox.create(allow_internet_access=True, **served.sdk_options("bob"))


def test_connect_hands_out_the_same_token(served: Served) -> None:
    sandbox = Sandbox.create(**served.sdk_options())
    again = Sandbox.connect(sandbox.sandbox_id, **served.sdk_options())
    assert again._envd_access_token == sandbox._envd_access_token


def test_every_sandbox_is_closed_at_shutdown(serve_with: Any) -> None:
    from support.served import serving

    with serving() as served:
        made = [Sandbox.create(**served.sdk_options(t)) for t in ("alice", "bob")]
        executors = [
            served.app.registry.get(t, s.sandbox_id).sandbox.executor
            for t, s in zip(("alice", "bob"), made, strict=True)
        ]
        assert not any(closed(e) for e in executors)
    assert all(closed(e) for e in executors)
    with pytest.raises(httpx.ConnectError):
        httpx.get(served.url + "/v2/sandboxes", headers={"X-API-KEY": served.key})


def _forged(served: Served, sandbox_id: str, token: str, tenant: str) -> Sandbox:
    """An SDK sandbox object for `sandbox_id` carrying `token`: what a client forging headers builds."""
    from e2b.connection_config import ConnectionConfig
    from packaging.version import Version

    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
    config = ConnectionConfig(extra_sandbox_headers=headers, **served.sdk_options(tenant))
    return Sandbox(
        sandbox_id=sandbox_id,
        sandbox_domain=None,
        envd_version=Version("0.5.7"),
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=config,
    )


def test_another_tenants_id_with_its_own_token_is_not_running_to_the_sdk(served: Served) -> None:
    from e2b.exceptions import SandboxNotRunningException

    alice = Sandbox.create(**served.sdk_options("alice"))
    bob = Sandbox.create(**served.sdk_options("bob"))
    forged = _forged(served, alice.sandbox_id, bob._envd_access_token or "", "bob")
    with pytest.raises(SandboxNotRunningException, match="was not found"):
        forged.files.read("/home/user/secret")
    with pytest.raises(SandboxException, match="was not found"):
        forged.commands.run("id")
    alice.kill()
    dead = _forged(served, alice.sandbox_id, alice._envd_access_token or "", "alice")
    with pytest.raises(SandboxNotRunningException):
        dead.files.write("/home/user/x", "y")  # the killed sandbox's own token opens nothing
    assert served.app.registry.count("bob") == 1


def test_an_oversized_upload_is_refused_before_it_is_read(serve_with: Any) -> None:
    served = serve_with(max_request_bytes=64 * 1024)
    sandbox = Sandbox.create(**served.sdk_options())
    with pytest.raises(SandboxException, match="at most 65,536 bytes"):
        sandbox.files.write("/home/user/big", b"x" * (1024 * 1024))


def test_files_outlive_a_replaced_session_and_go_with_the_sandbox(served: Served) -> None:
    import os

    sandbox = Sandbox.create(**served.sdk_options())
    held = served.app.registry.get("alice", sandbox.sandbox_id)
    executor = held.sandbox.executor
    assert held.home is not None and os.path.isdir(held.home)

    async def lose_the_session() -> Any:
        await executor.run("open('notes.txt', 'w').write('kept'); x = 1")
        executor.timeout = 0.5
        lost = await executor.run("while True: pass")
        executor.timeout = 60
        after = await executor.run(
            "import os; print(open('notes.txt').read(), 'x' in globals(), os.getcwd())"
        )
        return lost, after

    lost, after = served.call(lose_the_session)
    assert lost.timed_out
    assert after.stdout.split()[:2] == ["kept", "False"]  # a new session (variables gone), the same files
    assert after.stdout.split()[2] == "/home/user"  # the sandbox's directory, bound at E2B's home
    assert open(os.path.join(held.home, "notes.txt")).read() == "kept"
    sandbox.kill()
    assert not os.path.exists(held.home)


def _wait_for_spares(served: Served, count: int = 1) -> Any:
    spares = served.app.registry._spares
    assert spares is not None
    deadline = time.monotonic() + 60
    while len(spares) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(spares) == count
    return spares


def test_a_create_takes_a_sandbox_started_ahead_on_a_fresh_home(served: Served) -> None:
    import os

    first = Sandbox.create(**served.sdk_options())
    first.files.write("/home/user/mine.txt", "first's")
    spares = _wait_for_spares(served)
    (home, executor) = spares._ready[0]
    second = Sandbox.create(**served.sdk_options("bob"))
    held = served.app.registry.get("bob", second.sandbox_id)
    assert held.sandbox.executor is executor and held.home == home  # the spare, taken
    assert held.home != served.app.registry.get("alice", first.sandbox_id).home
    assert os.listdir(home) == []  # nothing of another sandbox's
    assert second.commands.run("ls -A; pwd").stdout == "/home/user\n"
    assert not second.files.exists("/home/user/mine.txt")
    _wait_for_spares(served)  # the next one started after the take
    (_, waiting) = spares._ready[0]
    worker = waiting.session.worker
    # Another environment is another executor: started cold; the spare for the old spec is ended.
    third = Sandbox.create(envs={"STAGE": "3"}, **served.sdk_options())
    assert served.app.registry.get("alice", third.sandbox_id).sandbox.executor is not waiting
    assert third.commands.run("echo $STAGE").stdout == "3\n"
    assert worker.reaped.wait(30)  # ended, not left idle
    for sandbox in (first, second, third):
        sandbox.kill()


def test_spares_end_with_the_server() -> None:
    import os

    with serving(warm_sandboxes=2) as served:
        Sandbox.create(**served.sdk_options()).kill()
        spares = _wait_for_spares(served, 2)
        homes = [home for home, _ in spares._ready]
        workers = [executor.session.worker for _, executor in spares._ready]
        assert all(os.path.isdir(h) for h in homes)
    assert not any(os.path.exists(h) for h in homes)
    for worker in workers:
        assert worker.reaped.wait(30)  # killed and reaped, not left running


def test_network_options_reach_the_egress_policy(serve_with: Any) -> None:
    from e2b import ALL_TRAFFIC

    from sandboxes.egress.policy import NetworkPolicy

    served = serve_with(internet=True)
    sandbox = Sandbox.create(
        network={"deny_out": [ALL_TRAFFIC], "allow_out": ["pypi.org"]}, **served.sdk_options()
    )
    executor = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.executor
    assert executor.policy.network == NetworkPolicy(allow=("pypi.org",))
    sandbox.update_network({"deny_out": ["evil.example"]})
    assert executor.policy.network == NetworkPolicy(deny=("evil.example",))
    sandbox.update_network({"allow_internet_access": False})
    assert executor.policy.network is False
    assert sandbox.get_info().allow_internet_access is False
    with pytest.raises(SandboxException, match="dnsServers"):
        sandbox.update_network({"dns_servers": ["192.0.2.1"]})
    assert executor.policy.network is False  # a refused update changes nothing
    offline = Sandbox.create(allow_internet_access=False, **served.sdk_options())
    with pytest.raises(SandboxException, match="internet on"):
        offline.update_network({"deny_out": ["evil.example"]})  # no gateway to change
