"""What two sessions try on each other at the OS layer (`test_session_separation.py`, `test_host_netns.py`).

Session A listens on 127.0.0.1:PORT and on an abstract unix socket and counts what reaches them; session
B connects to both, then serves and connects on its own loopback on the same port and name.
"""

from __future__ import annotations

import json
import secrets
import socket
from typing import Any

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


def abstract_name() -> str:
    return f"\0kodeagent-separation-{secrets.token_hex(4)}"
