"""Two sessions of one backend cannot reach each other at the OS layer: not over loopback, not over an
abstract unix socket.

The sessions run without the Python-level guards (`Policy(python_guards=False)`: the harness semantics'
mode, and what code that got past the guards has), so only the OS boundary separates them. Session A
listens on 127.0.0.1:PORT and on an abstract unix socket; a concurrent session B connects to both. The
proof is on both sides: B's connects fail, and A's listeners have nothing in their accept queues,
while A's own connections to them (the control) are accepted, and B serves and connects on its own
loopback on the very same port and name. Then A closes, and the same holds between B (listening now)
and a session C opened after A was gone.

At the host backend's bare `process` level there is no OS boundary between sessions to test: a
session without the guards is refused, and with them a session cannot open a socket at all.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Callable
from typing import Any

import pytest

from sandboxes import BackendUnavailable, Policy

pytestmark = pytest.mark.anyio

UNGUARDED = Policy(python_guards=False)

LISTEN = """
import select, socket
PORT, NAME = {port}, {name!r}
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", PORT))
tcp.listen(16)
uds = socket.socket(socket.AF_UNIX)
uds.bind(NAME)
uds.listen(16)
for listener in (tcp, uds):
    listener.setblocking(False)

def accepted(listener, wait):
    # Connections that reached the listener wait in its accept queue, accepted or not.
    count = 0
    select.select([listener], [], [], wait)
    while True:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1

for family, address in ((socket.AF_INET, ("127.0.0.1", PORT)), (socket.AF_UNIX, NAME)):
    own = socket.socket(family)
    own.connect(address)
    own.close()
print(accepted(tcp, 5), accepted(uds, 5))
"""

CONNECT = """
import errno, json, socket
PORT, NAME = {port}, {name!r}
outcome = {{}}
for kind, family, address in (("tcp", socket.AF_INET, ("127.0.0.1", PORT)), ("abstract", socket.AF_UNIX, NAME)):
    client = socket.socket(family)
    client.settimeout(3)
    try:
        client.connect(address)
        outcome[kind] = "connected"
    except OSError as exc:
        outcome[kind] = errno.errorcode.get(exc.errno or 0, str(exc))
    finally:
        client.close()
print(json.dumps(outcome))
"""

OWN_LOOPBACK = """
import socket
PORT, NAME = {port}, {name!r}
for family, address in ((socket.AF_INET, ("127.0.0.1", PORT)), (socket.AF_UNIX, NAME)):
    server = socket.socket(family)
    server.bind(address)  # the same port and name as the other session's: nothing of it is here
    server.listen(1)
    client = socket.socket(family)
    client.connect(address)
    connection, _ = server.accept()
    client.sendall(b"ping")
    assert connection.recv(4) == b"ping"
    for each in (connection, client, server):
        each.close()
print("own loopback works")
"""


def free_port() -> int:
    """A port free on this machine's loopback, so that a shared namespace would fail only by being shared."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def listen(ex: Any, port: int, name: str) -> None:
    result = await ex.run(LISTEN.format(port=port, name=name))
    assert result.ok, result
    assert result.stdout == "1 1\n", f"the listener did not see its own connections: {result!r}"


async def assert_unreachable(listener: Any, other: Any, port: int, name: str) -> None:
    """`other` cannot connect to what `listener` serves, and `listener` saw no connection."""
    result = await other.run(CONNECT.format(port=port, name=name))
    assert result.ok, result
    outcome = json.loads(result.stdout)
    assert outcome["tcp"] != "connected" and outcome["abstract"] != "connected", outcome
    seen = await listener.run("print(accepted(tcp, 0.5), accepted(uds, 0.5))")
    assert seen.ok, seen
    assert seen.stdout == "0 0\n", f"a connection from another session arrived: {seen.stdout!r}"
    own = await other.run(OWN_LOOPBACK.format(port=port, name=name))
    assert own.ok and own.stdout == "own loopback works\n", own


async def test_sessions_cannot_reach_each_others_loopback_or_abstract_sockets(
    executor_factory: Callable[..., Any], backend: str
) -> None:
    port, name = free_port(), f"\0kodeagent-separation-{secrets.token_hex(4)}"
    if backend == "hostprocess":
        with pytest.raises(BackendUnavailable, match="python_guards"):
            async with executor_factory(policy=UNGUARDED, timeout=20) as ex:
                await ex.run("pass")
        async with executor_factory(policy=Policy(allowed_imports=["socket"]), timeout=20) as ex:
            refused = await ex.run(f"import socket\nsocket.socket().bind(('127.0.0.1', {port}))\nprint('bound')")
        assert refused.error is not None and "bound" not in refused.stdout, refused
        return
    async with executor_factory(policy=UNGUARDED, timeout=30) as b:
        async with executor_factory(policy=UNGUARDED, timeout=30) as a:
            await listen(a, port, name)
            await assert_unreachable(a, b, port, name)
        # A is gone; B listens now, and C, opened after A closed (a pooled or reused worker, maybe), tries.
        second_port, second_name = free_port(), f"\0kodeagent-separation-{secrets.token_hex(4)}"
        await listen(b, second_port, second_name)
        c = executor_factory(policy=UNGUARDED, timeout=30)
        async with c:
            await assert_unreachable(b, c, second_port, second_name)
            left = await c.run(CONNECT.format(port=port, name=name))
            assert left.ok and "connected" not in json.loads(left.stdout).values(), left
