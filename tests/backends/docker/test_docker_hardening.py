"""The container boundary on its own: the Python-level guards are opened wide, so every effect seen
here is the container's doing (read-only root, no network, no capabilities, limits...).

The boundary must hold for the session processes in both modes of the backend: a container per
session (`sessions_per_container=1`), and warm containers hosting successive sessions
(`sessions_per_container=4`), where the container's main process is a session host with a few
capabilities and every session runs under its own uid with none (`MODES`)."""

from __future__ import annotations

import ipaddress
import json

import pytest
from support import backend_docker
from support.listener import Listener

from sandboxes import Limits, Policy

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

# No Python-level guard at all (python_guards=False), so only the container can say no.
OPEN = Policy(python_guards=False, limits=Limits(memory_mb=8192))
MODES = pytest.mark.parametrize("sessions_per_container", [1, 4], ids=["own-container", "shared"])
"""Both modes of the backend: a container per session, and successive sessions in a warm container."""


@pytest.fixture(autouse=True)
def _docker() -> None:
    backend_docker.require()


async def run_json(ex, code: str):
    result = await ex.run(code)
    assert result.error is None, result.error
    return json.loads(result.stdout)


@MODES
async def test_root_filesystem_is_read_only_and_nothing_lands_there(sessions_per_container):
    async with backend_docker.make_executor(
        policy=OPEN, timeout=20, pool=False, sessions_per_container=sessions_per_container
    ) as ex:
        result = await ex.run("open('/evil.txt', 'w').write('x')")
        assert result.error is not None and "Read-only file system" in result.error.message
        result = await ex.run("open('/opt/kodeagent/runtime/runner.py', 'a').write('x')")
        assert result.error is not None
        seen = await run_json(ex, "import os, json; print(json.dumps(os.path.exists('/evil.txt')))")
        assert seen is False
        # the two writable places still work
        ok = await run_json(
            ex,
            "import json\nopen('/tmp/t', 'w').write('t'); open('here.txt', 'w').write('w')\n"
            "print(json.dumps([open('/tmp/t').read(), open('here.txt').read()]))",
        )
        assert ok == ["t", "w"]


# What the kernel says of a process's identity and privileges: the session's runner itself, a child
# it starts, and a grandchild forked in its own session (the shapes code uses to get away).
IDENTITY = r"""
import json, os, subprocess, sys
KEYS = ('Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp')
def status(pid='self'):
    fields = dict(l.split(':\t', 1) for l in open(f'/proc/{pid}/status').read().splitlines() if ':\t' in l)
    return {key: fields[key].split() for key in KEYS}
SHOW = 'import json, os\n' + 'print(json.dumps(dict((l.split(":\\t", 1)[0], l.split(":\\t", 1)[1].split()) for l in open("/proc/self/status").read().splitlines() if l.split(":\\t", 1)[0] in %r)))' % (KEYS,)
child = json.loads(subprocess.run([sys.executable, '-c', SHOW], capture_output=True, text=True, check=True).stdout)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    os.setsid()
    if os.fork() == 0:
        os.write(write, json.dumps(status()).encode())
    os._exit(0)
os.close(write)
os.waitpid(pid, 0)
grandchild = json.loads(os.read(read, 65536))
def attempt(call):
    try:
        call()
        return 'done'
    except OSError as exc:
        return type(exc).__name__
attempts = {
    'setuid 0': attempt(lambda: os.setuid(0)),
    'setgid 0': attempt(lambda: os.setgid(0)),
    'setgroups': attempt(lambda: os.setgroups([0])),
    'chown': attempt(lambda: os.chown('.', 0, 0)),  # needs CAP_CHOWN, even on its own directory
}
print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'runner': status(), 'child': child,
                  'grandchild': grandchild, 'attempts': attempts, 'still': [os.getuid(), os.getgid()]}))
"""


@MODES
async def test_session_processes_run_unprivileged_without_capabilities_or_new_privileges(
    sessions_per_container,
):
    async with backend_docker.make_executor(
        policy=OPEN, timeout=20, pool=False, sessions_per_container=sessions_per_container
    ) as ex:
        seen = await run_json(ex, IDENTITY)
    uid, gid = seen["uid"], seen["gid"]
    if sessions_per_container == 1:
        assert (uid, gid) == (1000, 1000), seen  # the image's sandbox user
    else:
        assert uid >= 1_000_000 and gid == uid, f"a session's own uid, its gid the same: {seen}"
    for process in ("runner", "child", "grandchild"):
        status = seen[process]
        assert status["Uid"] == [str(uid)] * 4 and status["Gid"] == [str(gid)] * 4, (process, status)
        assert set(status["Groups"]) <= {str(gid)}, f"{process} kept supplementary groups: {status}"
        for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert status[capabilities] == ["0" * 16], (process, capabilities, status)
        assert status["NoNewPrivs"] == ["1"] and status["Seccomp"] == ["2"], (process, status)
    assert seen["attempts"] == dict.fromkeys(
        ("setuid 0", "setgid 0", "setgroups", "chown"), "PermissionError"
    )
    assert seen["still"] == [uid, gid]


def _gateway() -> str:
    from sandboxes.backends.docker import client

    config = client().networks.get("bridge").attrs["IPAM"]["Config"][0]
    # the daemon fills in Gateway only when it was configured; by default it is the subnet's first address
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


# `_socket` (an extension module) rather than `socket`: the test is about the container, and must not
# depend on which pure-Python modules the runner lets code import.
CONNECT = (
    "import _socket, json\n"
    "s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
    "s.settimeout(3)\n"
    "try:\n"
    "    s.connect(({host!r}, {port})); print(json.dumps('connected'))\n"
    "except OSError as e:\n"
    "    print(json.dumps(type(e).__name__))\n"
    "finally:\n"
    "    s.close()\n"
)


PROXIED = (
    "import _socket, json\n"
    "s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
    "s.settimeout(5)\n"
    "s.connect(('127.0.0.1', 3128))\n"
    "s.sendall(b'CONNECT {host}:{port} HTTP/1.1\\r\\n\\r\\n')\n"
    "print(json.dumps(s.recv(200).split(b'\\r')[0].decode()))\n"
)


async def test_no_network_unless_asked_for():
    listener = Listener("0.0.0.0")  # reachable from the bridge
    try:
        host = _gateway()
        async with backend_docker.make_executor(policy=OPEN, timeout=20, pool=False) as ex:
            outcome = await run_json(ex, CONNECT.format(host=host, port=listener.port))
            assert outcome != "connected"
            interfaces = await run_json(
                ex, "import os, json; print(json.dumps(sorted(os.listdir('/sys/class/net'))))"
            )
            assert interfaces == ["lo"]
        assert listener.connections == []
        # network=True is the public internet through the egress gateway: the host (at the bridge's
        # gateway address) is reached neither directly nor through the gateway, which names the rule
        networked = OPEN.model_copy(update={"network": True})
        async with backend_docker.make_executor(policy=networked, timeout=20, pool=False) as ex:
            assert await run_json(ex, CONNECT.format(host=host, port=listener.port)) == "OSError"
            assert await run_json(ex, CONNECT.format(host="127.0.0.1", port=3128)) == "connected"
            refused = await run_json(ex, PROXIED.format(host=host, port=listener.port))
            assert refused == "HTTP/1.1 403 Forbidden", refused
        assert listener.connections == []
    finally:
        listener.close()


THREAD_BOMB = (
    "import threading\nstop = threading.Event()\nstarted = 0\n"
    "try:\n"
    "    for _ in range(200):\n"
    "        threading.Thread(target=stop.wait, daemon=True).start(); started += 1\n"
    "except RuntimeError as e:\n"
    "    print('refused after', started)\n"
    "stop.set()"
)
"""Starts threads until the process limit refuses one and prints how many started."""


async def test_process_limit_stops_a_thread_bomb():
    async with backend_docker.make_executor(policy=OPEN, timeout=30, pool=False, pids_limit=24) as ex:
        result = await ex.run(THREAD_BOMB)
        assert "refused after" in result.stdout, result
        assert int(result.stdout.split()[-1]) < 24


async def test_memory_limit_kills_with_oom_and_session_recovers():
    policy = OPEN.model_copy(update={"limits": Limits(memory_mb=96)})
    async with backend_docker.make_executor(policy=policy, timeout=30, pool=False) as ex:
        await ex.run("x = 1")
        first = ex.container_id
        result = await ex.run("blob = b'a' * (400 << 20)")
        assert result.oom and result.state_lost, result
        after = await ex.run("print(1 + 1)")
        assert after.stdout == "2\n" and after.error is None
        assert ex.container_id != first


async def test_cgroup_limits_are_applied():
    policy = OPEN.model_copy(update={"limits": Limits(memory_mb=200)})
    async with backend_docker.make_executor(policy=policy, timeout=20, pool=False, cpus=0.5) as ex:
        limits = await run_json(
            ex,
            "import json\nread = lambda p: open(p).read().strip()\n"
            "print(json.dumps([read('/sys/fs/cgroup/memory/memory.limit_in_bytes'),\n"
            "  read('/sys/fs/cgroup/cpu/cpu.cfs_quota_us'), read('/sys/fs/cgroup/cpu/cpu.cfs_period_us')]))",
        )
        assert int(limits[0]) == 200 << 20
        assert int(limits[1]) / int(limits[2]) == pytest.approx(0.5)


@MODES
async def test_two_sessions_each_get_their_own_process_limit(sessions_per_container):
    """A container per session: sandboxes share uid 1000, and a per-uid limit (RLIMIT_NPROC) would let
    one session's threads starve another's, so each container has its own PID limit. Shared: every
    session has a uid of its own, so RLIMIT_NPROC is per session. Either way two concurrent sessions
    can each use most of theirs."""
    policy = Policy(allowed_imports=("*",), limits=Limits(max_processes=30))
    shared = {"sessions_per_container": sessions_per_container}
    code = (
        "import threading\nstop = threading.Event()\nthreads = [threading.Thread(target=stop.wait, daemon=True)\n"
        "    for _ in range(20)]\nfor t in threads:\n    t.start()\nprint('started', len(threads))"
    )
    async with backend_docker.make_executor(policy=policy, timeout=20, pool=False, **shared) as first:
        async with backend_docker.make_executor(policy=policy, timeout=20, pool=False, **shared) as second:
            assert (await first.run(code)).stdout == "started 20\n"
            assert (await second.run(code)).stdout == "started 20\n"
            assert (await first.run("stop.set()")).ok and (await second.run("stop.set()")).ok


async def test_shared_sessions_process_limit_is_their_uids_rlimit():
    """In the shared mode the policy's process limit is the session's RLIMIT_NPROC (per uid, and the uid
    is the session's own), so a thread bomb stops at it while the container keeps its own PID limit."""
    policy = OPEN.model_copy(update={"limits": Limits(memory_mb=8192, max_processes=24)})
    async with backend_docker.make_executor(
        policy=policy, timeout=30, pool=False, sessions_per_container=4
    ) as ex:
        limit = await run_json(
            ex, "import json, resource\nprint(json.dumps(resource.getrlimit(resource.RLIMIT_NPROC)))"
        )
        assert limit == [24, 24]
        result = await ex.run(THREAD_BOMB)
        assert "refused after" in result.stdout, result
        assert int(result.stdout.split()[-1]) < 24
