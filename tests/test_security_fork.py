"""Forged fork replies: code without the Python guards controls its runner, so it answers a fork with
whatever it likes (another session's pid, the sandbox's init, counts that are not numbers).

The attack wraps the runner's `Channel.send` (found with `gc`) and rewrites the fork's reply (or the
child's greeting). Each test proves the effect did not happen: another session keeps its variables
(no `state_lost`), the forging session's own sandbox is intact, and a refused fork leaves no process
of the family's user and no held uid behind. Host: the ``namespaces`` level, and the ``process``
level with a runner made hostile by a preload module (sessions without the guards are refused
there). Docker (both modes) and the E2B stand-in: the fork's kill runs inside the family's own
boundary, as its user.

Not attack-corpus entries: each needs `fork()`, several sessions and a look at the family's
processes and uids from this machine.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from support.wire_helpers import pids_of

from sandboxes import ForkError, HostExecutor, Policy

pytestmark = pytest.mark.anyio

UNGUARDED = Policy(python_guards=False)


def forging(reply: dict[str, Any] | None = None, greeting: dict[str, Any] | None = None) -> str:
    """Code that makes its own runner answer the next fork with `reply`'s fields (and the child greet
    with `greeting`'s), by wrapping the runner's channel."""
    return (
        "import gc\n"
        "channel = next(o for o in gc.get_objects()"
        " if type(o).__name__ == 'Channel' and hasattr(o, 'write_fd') and hasattr(o, 'token'))\n"
        "real_send = channel.send\n"
        f"FORGED_REPLY, FORGED_GREETING = {reply or {}!r}, {greeting or {}!r}\n"
        "def send(message, limit=None):\n"
        "    if message.get('op') == 'reply' and 'threads' in message:\n"
        "        message = {**message, **FORGED_REPLY}\n"
        "    elif message.get('op') == 'reply' and 'uid' in message and 'files' in message:\n"
        "        message = {**message, **FORGED_GREETING}\n"
        "    return real_send(message, limit)\n"
        "channel.send = send\n"
    )


async def arm(ex: Any, reply: dict[str, Any] | None = None, greeting: dict[str, Any] | None = None) -> None:
    """Run `forging` in `ex` (and check it ran: a forgery that did not take would prove nothing)."""
    result = await ex.run(forging(reply, greeting))
    assert result.error is None, result.error


async def fork_or_refusal(ex: Any) -> str:
    """Fork `ex`: "refused" (ForkError), or "forked" once the fork was closed and its end awaited."""
    try:
        child = await ex.fork()
    except ForkError:
        return "refused"
    await child.close()
    await child.wait_closed()
    return "forked"


async def pid_of(ex: Any) -> int:
    result = await ex.run("import os\nprint(os.getpid())")
    assert result.error is None, result.error
    return int(result.stdout)


async def eventually(predicate: Any, seconds: float = 10.0) -> bool:
    with anyio.move_on_after(seconds):
        while not predicate():
            await anyio.sleep(0.05)
        return True
    return bool(predicate())


# ---------------------------------------------------------------------- host, namespaces


@pytest.fixture
def namespaces() -> None:
    from sandboxes.backends.host.process import namespaces_available

    if not namespaces_available():
        pytest.skip("bubblewrap cannot create namespaces here")


def host(**options: Any) -> HostExecutor:
    return HostExecutor(isolation="namespaces", timeout=20, policy=UNGUARDED, **options)


@pytest.mark.parametrize("target", ["victim", "init"])
async def test_a_fork_reply_naming_another_session_reaches_nothing_on_the_host(
    namespaces: None, target: str
) -> None:
    # Both sessions are children of one fork server, in one PID namespace: the victim's pid is real
    # there, and pid 1 is the namespace's init, whose death would end every session of the server.
    async with host() as victim, host() as attacker:
        await victim.run("x = 42")
        forged = await pid_of(victim) if target == "victim" else 1
        await arm(attacker, {"pid": forged})
        outcome = await fork_or_refusal(attacker)
        after = await victim.run("print(x)")
        own = await attacker.run("print('still here')")
    assert (after.stdout, after.state_lost, after.error) == ("42\n", False, None)
    assert outcome == "refused"  # the kernel named the real child, not the pid the runner claimed
    assert (own.stdout, own.state_lost) == ("still here\n", False)


async def test_a_greeting_from_another_process_is_refused(namespaces: None) -> None:
    # The parent's runner names its child truthfully, but the greeting's sender is what counts: a
    # child claiming to be someone else is the same lie, told from the other side.
    async with host() as victim, host() as attacker:
        await victim.run("x = 42")
        victim_pid = await pid_of(victim)
        await arm(attacker, {"pid": victim_pid}, {"pid": victim_pid})
        outcome = await fork_or_refusal(attacker)
        after = await victim.run("print(x)")
    assert (after.stdout, after.state_lost) == ("42\n", False)
    assert outcome == "refused"


@pytest.mark.parametrize(
    ("reply", "greeting"),
    [
        ({"threads": "many"}, None),
        ({"processes": True}, None),
        ({"sockets": -1}, None),
        ({"pid": "1"}, None),
        ({"pid": 1 << 40}, None),
        (None, {"files": "all"}),
        (None, {"bytes": -5}),
    ],
    ids=["threads-text", "processes-bool", "sockets-negative", "pid-text", "pid-huge", "files", "bytes"],
)
async def test_a_malformed_fork_reply_is_a_fork_error_and_leaves_nothing(
    namespaces: None, reply: dict[str, Any] | None, greeting: dict[str, Any] | None
) -> None:
    from sandboxes.backends.host.process import PRIVATE_USERS

    attacker = host()
    await attacker.open()
    await arm(attacker, reply, greeting)
    uid = attacker.session.worker.uid  # type: ignore[union-attr]
    assert uid is not None, "these checks need private users (run as root)"
    with pytest.raises(ForkError):
        await attacker.fork()
    await attacker.close()
    await attacker.wait_closed()
    assert await eventually(lambda: not pids_of(uid)), f"processes of uid {uid} left: {pids_of(uid)}"
    assert not PRIVATE_USERS.held(uid)


async def test_a_refused_fork_is_killed_at_once_while_its_parent_lives(namespaces: None) -> None:
    # The child existed (it greeted) but its greeting was malformed: it is killed now, not at the
    # family's end, and the parent's own runner is untouched.
    async with host() as parent:
        await arm(parent, None, {"files": "all"})
        await parent.run("x = 7")
        uid = parent.session.worker.uid  # type: ignore[union-attr]
        before = pids_of(uid)
        with pytest.raises(ForkError):
            await parent.fork()
        assert await eventually(lambda: pids_of(uid) <= before), pids_of(uid) - before
        kept = await parent.run("print(x)")
    assert (kept.stdout, kept.state_lost) == ("7\n", False)


# ---------------------------------------------------------------------- host, process level
# A session without the guards is refused at this level, so its code cannot take its runner over;
# the runner is made hostile here from outside instead: a trusted preload module (imported by the
# fork server before any session) makes every runner of that server forge its fork replies with the
# fields of `forge.json` in its working directory. Pids at this level are the machine's, and the
# parent is root: pid 1 is not tried (a regression would kill every process here), a canary
# process of ours stands in for it.

FORGER = """
import json, os, sys

runner = sys.modules["_kodeagent_runner"]
real_send = runner.Channel.send


def send(self, message, limit=None):
    if message.get("op") == "reply" and "threads" in message and os.path.exists("forge.json"):
        with open("forge.json") as handle:
            message = {**message, **json.load(handle)}
    return real_send(self, message, limit)


runner.Channel.send = send
"""


@pytest.mark.parametrize("target", ["victim", "canary"])
async def test_a_forging_runner_at_the_process_level_reaches_nothing(tmp_path: Any, target: str) -> None:
    import json
    import subprocess
    import sys

    forger = tmp_path / "fork_forger.py"
    forger.write_text(FORGER)
    policy = Policy(allowed_imports=["os"])
    # A group leader, as a runner is: the kill of a fork is its tree and its group.
    canary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        async with (
            HostExecutor(isolation="process", timeout=20, policy=policy) as victim,
            HostExecutor(isolation="process", timeout=20, policy=policy, preload=[forger]) as attacker,
        ):
            await victim.run("x = 42")
            forged = await pid_of(victim) if target == "victim" else canary.pid
            await attacker.upload("forge.json", json.dumps({"pid": forged}).encode())
            outcome = await fork_or_refusal(attacker)
            after = await victim.run("print(x)")
        alive = canary.poll() is None
    finally:
        canary.kill()
        canary.wait()
    assert (after.stdout, after.state_lost, after.error) == ("42\n", False, None)
    assert alive, "the canary was killed"
    assert outcome == "refused"


# ---------------------------------------------------------------------- docker (both modes), e2b
# A family lives in a boundary of its own (a container, a microVM; a shared container hosts one
# family at a time) and the fork's kill runs there as the family's user: a pid from a reply can
# name only what the code could signal itself. Both checks below hold that line: another session
# (in another boundary) keeps its state, and the sandbox's init (pid 1), whose descendants are the
# whole family, is never a fork's to end, so the forging session itself survives its fork's close.


def docker(mode: str) -> Any:
    from support import backend_docker, backend_dockershared

    backend_docker.require()
    make = backend_docker.make_executor if mode == "container" else backend_dockershared.make_executor
    return make(policy=UNGUARDED, timeout=30)


def e2b() -> Any:
    from support.backend_e2b import make_executor, unavailable

    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    return make_executor(policy=UNGUARDED, timeout=30)


async def forged_fork_of_a_boundary(make: Any, target: str) -> None:
    async with make() as victim, make() as attacker:
        await victim.run("x = 42")
        forged = await pid_of(victim) if target == "victim" else 1
        await arm(attacker, {"pid": forged})
        await attacker.run("y = 5")
        await fork_or_refusal(attacker)
        after = await victim.run("print(x)")
        own = await attacker.run("print(y)")
    assert (after.stdout, after.state_lost, after.error) == ("42\n", False, None)
    if target == "init":
        assert (own.stdout, own.state_lost) == ("5\n", False), own


@pytest.mark.docker
@pytest.mark.parametrize("target", ["victim", "init"])
@pytest.mark.parametrize("mode", ["container", "shared"])
async def test_a_fork_reply_naming_another_session_reaches_nothing_in_docker(mode: str, target: str) -> None:
    await forged_fork_of_a_boundary(lambda: docker(mode), target)


@pytest.mark.e2b
@pytest.mark.parametrize("target", ["victim", "init"])
async def test_a_fork_reply_naming_another_session_reaches_nothing_in_e2b(target: str) -> None:
    # The stand-in's sandboxes are local processes (as root, each in network and IPC namespaces of
    # its own): a victim's pid is real here, as pid 1 is this machine's init.
    await forged_fork_of_a_boundary(e2b, target)


def ray() -> Any:
    from support import backend_ray

    if backend_ray.unavailable() is not None:
        pytest.skip(str(backend_ray.unavailable()))
    return backend_ray.make_executor(policy=UNGUARDED, timeout=30)


@pytest.mark.ray
@pytest.mark.parametrize("target", ["victim", "init"])
async def test_a_fork_reply_naming_another_session_reaches_nothing_on_a_ray_node(target: str) -> None:
    # A node's agent forks with the node's host backend, whose fork server holds every session the
    # node runs in one PID namespace: the same forgery as on the host, through the cluster.
    await forged_fork_of_a_boundary(ray, target)


@pytest.mark.docker
@pytest.mark.parametrize("mode", ["container", "shared"])
async def test_a_malformed_fork_reply_in_docker_is_a_fork_error(mode: str) -> None:
    async with docker(mode) as attacker:
        await arm(attacker, {"threads": "many"})
        with pytest.raises(ForkError):
            await attacker.fork()
        again = await attacker.run("print('replaced')")
    assert again.state_lost and again.stdout == "replaced\n"


GONE = (
    "import os, time\n"
    "for _ in range(200):\n"
    "    try:\n"
    "        os.kill({pid}, 0)\n"
    "    except ProcessLookupError:\n"
    "        print('gone')\n"
    "        break\n"
    "    time.sleep(0.05)\n"
    "else:\n"
    "    print('still running')\n"
)
SLEEPER = (
    "import subprocess, sys\n"
    "sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(sleeper.pid)\n"
)


async def a_forks_close_ends_its_processes(make: Any) -> None:
    # The control of the checks above: the helper still ends what a real fork started, also after
    # that fork's runner crashed, and for one that made itself non-dumpable (its namespace link then
    # cannot be read).
    async with make() as parent:
        for how in ("idle", "non-dumpable", "crashed"):
            child = await parent.fork()
            if how == "non-dumpable":
                assert (await child.run("import ctypes\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)")).ok
            sleeper = int((await child.run(SLEEPER)).stdout)
            if how == "crashed":
                await child.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
            await child.close()
            await child.wait_closed()
            seen = await parent.run(GONE.format(pid=sleeper))
            assert seen.stdout == "gone\n", (how, seen)


@pytest.mark.docker
@pytest.mark.parametrize("mode", ["container", "shared"])
async def test_a_forks_close_still_ends_its_processes_in_docker(mode: str) -> None:
    await a_forks_close_ends_its_processes(lambda: docker(mode))


@pytest.mark.e2b
async def test_a_forks_close_still_ends_its_processes_in_e2b() -> None:
    await a_forks_close_ends_its_processes(e2b)
