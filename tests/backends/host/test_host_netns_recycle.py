"""Network namespaces handed from an ended session to a later one (`runtime/forkserver.py`'s
`Recycler`), and what an ended session tries to leave in its namespace for the next one.

A namespace goes to a later session only once every process of its session's user is gone and its
counters, sockets and flow labels read as they did when it was new. Each attack below leaves
something behind (a TIME_WAIT socket, moved counters, a flow label's lease, an abstract unix name
kept alive by a socket cycle, System V shared memory) and checks that its session did leave it; the
sessions opened after it must not get its namespace, and must not see what it left.
"""

from __future__ import annotations

import json
import os
import secrets

import pytest

from sandboxes import HostExecutor, Policy
from sandboxes.backends.host.process import namespaces_available

pytestmark = pytest.mark.anyio

LATER_SESSIONS = 6  # more than the namespaces a fork server holds released at concurrency 1

COOKIE = """
import json, os, socket
def cookie():  # SO_NETNS_COOKIE: a namespace's own number, never given to another
    with socket.socket(socket.AF_UNIX) as probe:
        return int.from_bytes(probe.getsockopt(socket.SOL_SOCKET, 71, 8), "little")
"""

LOOK = (
    COOKIE
    + """
def entries(path):
    with open(path) as listing:
        return len(listing.read().splitlines()) - 1
with open("/proc/net/dev") as dev:
    lo = next(line for line in dev if line.strip().startswith("lo:")).split()
server = socket.socket()
server.bind(("127.0.0.1", PORT))  # no SO_REUSEADDR: a TIME_WAIT left on this port would refuse it
server.listen(1)
client = socket.create_connection(("127.0.0.1", PORT), 5)
served = server.accept()[0]
client.sendall(b"ping")
looked = {
    "cookie": cookie(),
    "lo_packets_before": int(lo[2]) + int(lo[10]),
    "own_loopback": served.recv(4).decode(),
    "flow_labels": entries("/proc/net/ip6_flowlabel"),
    "unix": entries("/proc/net/unix"),
    "shm": entries("/proc/sysvipc/shm"),
}
try:
    left = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    left.sendto(b"?", NAME)
    looked["abstract_name"] = "reached"
except OSError as exc:
    looked["abstract_name"] = type(exc).__name__
print(json.dumps(looked))
"""
)

LEAVE = {
    "a TIME_WAIT socket": """
server = socket.socket()
server.bind(("127.0.0.1", PORT))
server.listen(1)
client = socket.create_connection(("127.0.0.1", PORT), 5)
served = server.accept()[0]
served.close()  # the side that closes first holds TIME_WAIT
client.recv(1)
client.close()
server.close()
with open("/proc/net/tcp") as tcp:
    print("left" if any(line.split()[3] == "06" for line in tcp.readlines()[1:]) else "not left")
""",
    "moved counters": """
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.sendto(b"x", ("127.0.0.1", 9))  # nobody listens: a port-unreachable comes back over lo
print("left")
""",
    "a flow label's lease": """
import struct
request = struct.pack("16sIBBHHHI", socket.inet_pton(socket.AF_INET6, "::1"), socket.htonl(0x2f00d),
                      0, 1, 1 | 2, 0, 60, 0)  # get, exclusive, create: lingers 60 s after its socket
lease = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
lease.setsockopt(socket.IPPROTO_IPV6, 32, request)  # IPV6_FLOWLABEL_MGR
lease.close()
with open("/proc/net/ip6_flowlabel") as labels:
    print("left" if len(labels.readlines()) > 1 else "not left")
""",
    "an abstract name kept by a socket cycle": """
bound = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
bound.bind(NAME)
bound.connect(NAME)
socket.send_fds(bound, [b"self"], [bound.fileno()])  # its own queue holds it: a cycle
bound.close()
with open("/proc/net/unix") as unix:
    print("left" if any(NAME[1:] in line for line in unix) else "not left")
""",
    "System V shared memory": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
segment = libc.shmget(0x6b6f6465, 4096, 0o1000 | 0o666)  # IPC_CREAT, anyone's
with open("/proc/sysvipc/shm") as shm:
    print("left" if segment >= 0 and len(shm.readlines()) > 1 else "not left")
""",
}


LASTING = {"a TIME_WAIT socket", "moved counters", "a flow label's lease"}
"""What the kernel keeps in the namespace itself after the session (a socket cycle is collected, and
System V IPC lives in the IPC namespace, new for every session): its namespace must go to nobody."""


def needs_recycling() -> None:
    if not namespaces_available():
        pytest.skip("bubblewrap cannot make namespaces here (test_host_bubblewrap.py says why)")
    if os.geteuid() != 0:
        pytest.skip("only namespaces made as root are recycled (run by another user, none is)")


async def session_run(code: str) -> str:
    executor = HostExecutor(policy=Policy(python_guards=False), timeout=20)
    async with executor:
        result = await executor.run(code)
    await executor.wait_closed()  # its user's processes shown gone: its namespace released
    assert result.error is None, result
    return result.stdout


def names() -> tuple[int, str]:
    return 20000 + secrets.randbelow(20000), "\0kodeagent-left-" + secrets.token_hex(6)


def look(port: int, name: str) -> str:
    return f"PORT, NAME = {port}, {name!r}\n" + LOOK


async def test_an_unused_namespace_goes_to_a_later_session_and_works_there() -> None:
    needs_recycling()
    port, name = names()
    first = int(await session_run(COOKIE + "print(cookie())"))
    later = [json.loads(await session_run(look(port, name))) for _ in range(LATER_SESSIONS)]
    assert first in [seen["cookie"] for seen in later]
    for seen in later:
        assert seen["own_loopback"] == "ping"
        assert seen["abstract_name"] != "reached"


@pytest.mark.parametrize("what", sorted(LEAVE))
async def test_what_a_session_leaves_in_its_namespace_reaches_no_later_session(what: str) -> None:
    needs_recycling()
    port, name = names()
    code = f"PORT, NAME = {port}, {name!r}\n" + COOKIE + LEAVE[what] + "print(cookie())"
    left, cookie = (await session_run(code)).split()
    assert left == "left", f"the attack did not leave {what}: it proves nothing"
    for _ in range(LATER_SESSIONS):
        seen = json.loads(await session_run(look(port, name)))
        assert seen["lo_packets_before"] == 0
        assert (seen["flow_labels"], seen["unix"], seen["shm"]) == (0, 0, 0), seen
        assert seen["abstract_name"] != "reached" and seen["own_loopback"] == "ping", seen
        if what in LASTING:
            assert seen["cookie"] != int(cookie), f"a session got the namespace of one that left {what}"


async def test_a_live_sessions_namespace_goes_to_no_other_session() -> None:
    needs_recycling()
    async with HostExecutor(policy=Policy(python_guards=False), timeout=20) as live:
        cookie = int((await live.run(COOKIE + "print(cookie())")).stdout)
        others = [int(await session_run(COOKIE + "print(cookie())")) for _ in range(LATER_SESSIONS)]
        assert cookie not in others
        assert int((await live.run("print(cookie())")).stdout) == cookie


async def test_a_session_holds_no_namespace_or_socket_of_the_fork_servers() -> None:
    needs_recycling()
    for _ in range(3):  # once the server holds some
        held = json.loads(
            await session_run(
                "import json, os\nheld, sockets = [], set()\nfor fd in os.listdir('/proc/self/fd'):\n"
                "    try:\n        target = os.readlink(f'/proc/self/fd/{fd}')\n"
                "    except OSError:\n        continue\n"
                "    if target.startswith('net:') or '/net/' in target:\n        held.append(target)\n"
                "    if target.startswith('socket:'):\n        sockets.add(target)\n"
                "print(json.dumps({'held': held, 'sockets': len(sockets)}))"
            )
        )
        # No namespace, no /proc/net file, and no socket but its own channel (stdin and stdout): the
        # server's control socket, on which a release could be forged, and the spares' are closed.
        assert held == {"held": [], "sockets": 1}


async def test_a_fork_that_outlives_its_session_keeps_the_namespace_from_later_sessions() -> None:
    needs_recycling()
    parent = HostExecutor(policy=Policy(python_guards=False), timeout=20)
    await parent.open()
    await parent.run(COOKIE)
    child = await parent.fork()  # its runner lives in the parent's namespace, as its user
    try:
        cookie = int((await child.run("print(cookie())")).stdout)
        await parent.close()
        await parent.wait_closed()
        others = [int(await session_run(COOKIE + "print(cookie())")) for _ in range(LATER_SESSIONS)]
        assert cookie not in others
        assert int((await child.run("print(cookie())")).stdout) == cookie
    finally:
        await child.close()
