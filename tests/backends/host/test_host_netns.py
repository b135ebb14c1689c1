"""How the host backend gives forked sessions network namespaces of their own (`runtime/netns.py`).

- `separate()` itself, in a fresh process: as root (how the fork server's children run when we are
  root) and as an unprivileged user (how they run under a bubblewrap started by any other user: a user
  namespace of its own, every capability dropped). Either way the process has its own loopback, up
  and working, and reaches nothing on the host's.
- Where a process may not move itself into new namespaces (a seccomp filter refuses `unshare`, as
  some container profiles do), the fork server says so and sessions start in sandboxes of their own:
  still separated, never sharing one namespace.
- `Policy(network=True)` sessions get a namespace of their own too, whose only way out is the egress
  gateway (tests/backends/host/test_egress_host.py): the host's loopback is out of reach, directly or through it.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from support import seccomp_jail

from sandboxes import HostExecutor, Policy
from sandboxes.backends.host.process import namespaces_available

ROOT = pathlib.Path(__file__).resolve().parents[3]
TESTS = pathlib.Path(__file__).resolve().parents[2]
NOBODY = 65534

SEPARATE = """
import ctypes, json, os, socket, sys
from sandboxes.runtime import netns

port, as_user = int(sys.argv[1]), sys.argv[2] == "user"
before = os.readlink("/proc/self/ns/net")
if as_user and os.geteuid() == 0:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, which setuid cleared: /proc/self stays ours
netns.separate()
outcome = {"uid": os.getuid(), "own_namespace": os.readlink("/proc/self/ns/net") != before}
client = socket.socket()
client.settimeout(2)
try:
    client.connect(("127.0.0.1", port))
    outcome["host"] = "connected"
except OSError as exc:
    outcome["host"] = type(exc).__name__
server = socket.socket()
server.bind(("127.0.0.1", port))  # the host's listener holds this port: not in this namespace
server.listen(1)
own = socket.socket()  # not create_connection: its lookup imports a codec the user may not read
own.connect(("127.0.0.1", port))
own.sendall(b"ping")
outcome["own_loopback"] = server.accept()[0].recv(4).decode()
with open("/proc/self/status") as status:
    outcome["CapEff"] = next(line.split()[1] for line in status if line.startswith("CapEff"))
print(json.dumps(outcome))
""".replace("NOBODY", str(NOBODY))


@pytest.fixture
def host_listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.3)
    yield server
    server.close()


def nothing_arrived(server: socket.socket) -> bool:
    try:
        connection, _ = server.accept()
    except TimeoutError:
        return True
    connection.close()
    return False


def env(*paths: pathlib.Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k != "CI"},
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONPATH": os.pathsep.join(str(p) for p in paths),
    }


@pytest.mark.parametrize("who", ["root", "user"])
def test_separate_gives_the_process_its_own_working_loopback(who: str, host_listener: socket.socket) -> None:
    if who == "root" and os.geteuid() != 0:
        pytest.skip("the root path runs as root only")
    port = host_listener.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", SEPARATE, str(port), who],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(ROOT),
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert nothing_arrived(host_listener)
    assert outcome["own_namespace"] and outcome["host"] == "ConnectionRefusedError", outcome
    assert outcome["own_loopback"] == "ping", outcome
    if who == "user":  # a user namespace of its own, and no capability left in it
        assert outcome["uid"] == (NOBODY if os.geteuid() == 0 else os.geteuid()), outcome
        assert int(outcome["CapEff"], 16) == 0, outcome


FALLBACK = """
import anyio, json
from support.separation_helpers import abstract_name, assert_unreachable, free_port, listen
from sandboxes import HostExecutor, Policy
from sandboxes.backends.host import process as hostprocess

async def main():
    port, name = free_port(), abstract_name()
    async with HostExecutor(policy=Policy(python_guards=False), timeout=30) as b:
        async with HostExecutor(policy=Policy(python_guards=False), timeout=30) as a:
            await listen(a, port, name)
            await assert_unreachable(a, b, port, name)
            isolation = a.isolation
    server = hostprocess._FORK_SERVERS[("namespaces", False, ())]
    print(json.dumps({"isolation": isolation, "hello": server.hello}))

anyio.run(main)
"""


def test_where_a_session_cannot_take_namespaces_each_starts_a_sandbox_of_its_own() -> None:
    if not seccomp_jail.supported():
        pytest.skip("the seccomp filter of this test knows x86_64 and aarch64 only")
    if not namespaces_available():
        pytest.skip("bubblewrap cannot make namespaces here (test_host_bubblewrap.py says why)")
    command = seccomp_jail.command("unshare", [sys.executable, "-c", FALLBACK])
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=180, env=env(ROOT, TESTS), cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert outcome["isolation"] == "namespaces", outcome
    hello = outcome["hello"]
    assert hello["private_network"] is False and "Operation not permitted" in hello["error"], hello


@pytest.mark.anyio
async def test_a_session_with_network_does_not_reach_the_hosts_loopback(host_listener: socket.socket) -> None:
    if not namespaces_available():
        pytest.skip("bubblewrap cannot make namespaces here (test_host_bubblewrap.py says why)")
    port = host_listener.getsockname()[1]
    policy = Policy(network=True, python_guards=False)
    async with HostExecutor(policy=policy, timeout=20) as ex:
        result = await ex.run(
            "import socket, errno\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), 5).close()\n    print('connected')\n"
            "except OSError as exc:\n    print(errno.errorcode[exc.errno])\n"
            "s = socket.create_connection(('127.0.0.1', 3128), 5)\n"
            f"s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n')\n"
            "print(s.recv(100).split(b'\\r')[0].decode())"
        )
    assert result.stdout.splitlines() == ["ECONNREFUSED", "HTTP/1.1 403 Forbidden"], result
    assert nothing_arrived(host_listener)
