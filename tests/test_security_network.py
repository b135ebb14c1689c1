"""Attack class: network egress.

The test starts a TCP listener on this machine's loopback and the code tries to reach it by every
route an allowed module offers (socket, a raw `_socket`, urllib, http.client, a DNS lookup). The
proof is on the listener's side: no connection ever arrived. (On the host backend's `namespaces`
level the sandbox has no network at all; at `process` level the audit hook refuses the socket.)
"""

from __future__ import annotations

import socket
import threading

import pytest
from support.listener import Listener
from support.security_helpers import ESCAPED, assert_usable

from sandboxes import Policy

pytestmark = pytest.mark.anyio

NET_MODULES = ["socket", "_socket", "urllib", "urllib.*", "http", "http.*", "ssl", "select", "os"]


ROUTES = {
    "socket.create_connection": "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=1)",
    "socket.connect": "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', PORT))",
    "raw _socket": "import _socket\ns = _socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', PORT))",
    "udp sendto": "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('127.0.0.1', PORT))",
    "urllib": "import urllib.request\nurllib.request.urlopen(f'http://127.0.0.1:{PORT}/', timeout=1)",
    "http.client": (
        "import http.client\nc = http.client.HTTPConnection('127.0.0.1', PORT, timeout=1)\nc.request('GET', '/')"
    ),
    "localhost by name": "import socket\nsocket.create_connection(('localhost', PORT), timeout=1)",
    "dns lookup": "import socket\nprint(socket.getaddrinfo('example.com', 80))",
    "socket from a file descriptor": (
        "import socket, os\nfor fd in range(3, 20):\n"
        "    try:\n        s = socket.socket(fileno=fd)\n        s.connect(('127.0.0.1', PORT))\n"
        f"        print('{ESCAPED}')\n"
        "    except Exception:\n        pass\n"
        "raise SystemError('no descriptor led anywhere')\n"
    ),
}


@pytest.mark.parametrize("name", sorted(ROUTES))
async def test_no_connection_reaches_a_loopback_listener(
    executor_factory, listener: Listener, name: str
) -> None:
    code = f"PORT = {listener.port}\n" + ROUTES[name] + f"\nprint('{ESCAPED}')"
    async with executor_factory(policy=Policy(allowed_imports=NET_MODULES), timeout=10) as ex:
        result = await ex.run(code)
        assert ESCAPED not in result.stdout, result
        await assert_usable(ex)
    # Give a late connection every chance to arrive before looking.
    probe = socket.create_connection(("127.0.0.1", listener.port), timeout=2)
    probe.close()
    for _ in range(50):
        if listener.connections:
            break
        threading.Event().wait(0.02)
    assert len(listener.connections) == 1, f"the sandbox connected: {listener.connections}"


async def test_a_connection_from_outside_the_sandbox_is_counted(listener: Listener) -> None:
    """Control: the listener does see connections, so the tests above prove something."""
    socket.create_connection(("127.0.0.1", listener.port), timeout=2).close()
    socket.create_connection(("127.0.0.1", listener.port), timeout=2).close()
    for _ in range(100):
        if len(listener.connections) == 2:
            break
        threading.Event().wait(0.02)
    assert len(listener.connections) == 2
