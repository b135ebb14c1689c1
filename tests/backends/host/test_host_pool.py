"""The host backend's pools of pre-initialised workers (`sandboxes/backends/host/executor.py`).

A pooled worker whose `init` handshake was done ahead must give a session indistinguishable from
one initialised on open (environment, tools, limits, statelessness, output limit: each executor
sees its own options, never another's); the initialised workers of many option sets stay bounded;
and a pre-initialised worker that died while idle is never handed out.

Real worker processes throughout; the pools are read through the backend's own helpers
(`pooled_workers`, `refilling`) to know which sessions were pre-initialised.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandboxes import DEFAULT_ALLOWED_IMPORTS, HostExecutor, Limits, Policy
from sandboxes.backends.host import executor as host
from sandboxes.backends.host.process import PRIVATE_USERS, HostWorker
from sandboxes.backends.host.reap import REAPER
from sandboxes.session import RunnerSession

pytestmark = pytest.mark.anyio

PROBE = (
    "import os, resource\n"
    "print(os.environ.get('WHO'), os.environ.get('ONLY_A'), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    "kept = 1"
)


async def _settled() -> None:
    """Wait until the pools' background refill after the last open has finished."""
    with anyio.fail_after(60):
        while host.refilling():
            await anyio.sleep(0.01)


def _options(tag: str) -> dict[str, Any]:
    """Two option sets that differ in every part of the runner's `init`."""
    a = tag == "a"
    policy = Policy(
        allowed_imports=(*DEFAULT_ALLOWED_IMPORTS, "os", "resource"),
        limits=Limits(max_open_files=100 if a else 200),
    )
    return {
        "timeout": 20,
        "policy": policy,
        "env": {"WHO": tag, **({"ONLY_A": "yes"} if a else {})},
        "tools": {f"tool_{tag}": lambda: f"tool of {tag}"},
        "stateless": not a,
        "output_limit": 1_000 if a else 3_000,
    }


async def _check_session(ex: HostExecutor, tag: str) -> None:
    a = tag == "a"
    seen = await ex.run(PROBE)
    assert seen.ok, seen
    assert seen.stdout == ("a yes 100\n" if a else "b None 200\n"), seen
    kept = await ex.run("print(kept)")  # state kept, or a fresh namespace per snippet (stateless)
    if a:
        assert kept.ok and kept.stdout == "1\n", kept
    else:
        assert kept.error is not None and kept.error.type == "NameError", kept
    own = await ex.run(f"print(tool_{tag}())")
    assert own.ok and own.stdout == f"tool of {tag}\n", own
    other = "b" if a else "a"
    foreign = await ex.run(f"print(tool_{other}())")  # the other executor's tool is not defined here
    assert foreign.error is not None and foreign.error.type == "NameError", foreign
    flood = await ex.run("print('y' * 20_000)")
    assert flood.truncated and flood.stdout_omitted > 0, flood
    limit = 1_000 if a else 3_000  # what is kept (head and tail, beside the cut's marker) is this one's limit
    assert limit - 100 < flood.stdout.count("y") <= limit, flood


async def test_a_preinitialised_session_has_its_own_executors_options() -> None:
    """Two executors whose options differ in env, tools, limits, stateless and output limit, opened
    in turn: from the second round on, every session is pre-initialised and sees only its own."""
    preinitialised = {"a": 0, "b": 0}
    for _ in range(4):
        for tag in ("a", "b"):
            ready_before = set(host.pooled_workers())
            async with HostExecutor(**_options(tag)) as ex:
                assert isinstance(ex.session, RunnerSession)
                if ex.session.handshake_seconds == 0.0:
                    preinitialised[tag] += 1
                    assert ex.session.worker in ready_before  # it came from a pool, handshake done
                await _check_session(ex, tag)
            await _settled()
    # the first open of each option set did the handshake itself; later ones found a worker of theirs
    assert preinitialised == {"a": 3, "b": 3}


async def test_a_respawned_session_is_initialised_with_the_same_options() -> None:
    """A session lost to a crash is replaced by one from the pool: it still has the options."""
    options = _options("a")
    options["policy"] = options["policy"].model_copy(
        update={"allowed_imports": (*options["policy"].allowed_imports, "signal"), "subprocess": True}
    )
    for _ in range(2):  # the ready pool of these options fills after the first open
        async with HostExecutor(**options):
            pass
        await _settled()
    async with HostExecutor(**options) as ex:
        assert ex.session is not None and ex.session.handshake_seconds == 0.0
        crashed = await ex.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        assert crashed.state_lost and crashed.error is not None and crashed.error.type == "WorkerCrashed"
        await _check_session(ex, "a")
        respawned = ex.session
        assert isinstance(respawned, RunnerSession) and respawned.handshake_seconds == 0.0  # from the pool


def _private_user_processes() -> int:
    """Live processes of this process's private users: one per pooled or open worker."""
    count = 0
    block = PRIVATE_USERS.block()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    state = handle.read().rsplit(b")", 1)[1].split()[0]
                uid = entry.stat().st_uid
            except (OSError, IndexError):
                continue
            if uid in block and state != b"Z":
                count += 1
    return count


async def test_many_option_sets_keep_the_idle_workers_bounded() -> None:
    sets = 3 * host.READY_KEYS
    seen: set[HostWorker] = set()
    for index in range(sets):
        for _ in range(2):  # twice: the second open is a hit, so its ready pool fills to POOL_SIZE
            async with HostExecutor(timeout=20, env={"SET": str(index)}) as ex:
                result = await ex.run("print(1)")
                assert result.ok and result.stdout == "1\n"
            await _settled()
            seen.update(host.pooled_workers())
    REAPER.drain()
    ready = host.POOLS.ready.by_key()
    assert len(ready) <= host.READY_KEYS
    assert sum(len(pool) for pool in ready.values()) <= host.READY_KEYS * host.POOL_SIZE
    pooled = set(host.pooled_workers())
    assert len(seen) > len(pooled) + host.POOL_SIZE  # the evicted option sets had pooled workers...
    for worker in seen - pooled:  # ... which were killed and reaped when their keys were evicted
        assert worker.reaped.is_set() and not worker.is_alive()
    if os.getuid() == 0:  # the workers run as private users: count their processes
        assert _private_user_processes() <= len(pooled)


async def test_a_preinitialised_worker_killed_while_idle_is_not_handed_out() -> None:
    options = {"timeout": 20, "env": {"KILLED": "idle"}}
    for _ in range(2):
        async with HostExecutor(**options):
            pass
        await _settled()
    ready = host.POOLS.ready.by_key()
    doomed = [w for key, pool in ready.items() if '"KILLED":"idle"' in key[1] for w in pool]
    assert len(doomed) == host.POOL_SIZE
    for worker in doomed:
        tree = worker.process_tree()
        assert tree is not None
        os.kill(tree.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(w.is_alive() for w in doomed) and time.monotonic() < deadline:
        await anyio.sleep(0.01)
    async with HostExecutor(**options) as ex:
        assert ex.session is not None and ex.session.worker not in doomed
        assert ex.session.handshake_seconds is not None and ex.session.handshake_seconds > 0  # its own
        result = await ex.run("print(2 + 2)")
        assert result.ok and result.stdout == "4\n" and not result.state_lost
    await _settled()
    REAPER.drain()
    assert all(w.reaped.is_set() for w in doomed)  # the dead ones were reaped, not left behind


CHILD = """
import anyio, json, sys
from sandboxes import HostExecutor
from sandboxes.backends.host import executor as host

async def main():
    for env in ({"SET": "1"}, {"SET": "2"}, {"SET": "1"}, {"SET": "2"}):
        async with HostExecutor(timeout=20, env=env) as ex:
            assert (await ex.run("print(1)")).stdout == "1\\n"
        while host.refilling():
            await anyio.sleep(0.01)
    ready = host.POOLS.ready.idle()
    print(json.dumps({"ready": len(ready), "uids": sorted({w.uid for w in host.pooled_workers()})}))

anyio.run(main)
"""


def test_idle_preinitialised_workers_end_with_the_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ready"] >= 2  # both option sets had initialised workers waiting at exit
    if os.getuid() == 0:
        uids = set(report["uids"])
        assert uids and None not in uids
        left = [e.name for e in os.scandir("/proc") if e.name.isdigit() and _uid(e) in uids]
        assert left == []  # the exit handlers killed them (and what the pool had started) before exit


def _uid(entry: os.DirEntry[str]) -> int | None:
    try:
        return entry.stat().st_uid
    except OSError:
        return None


async def _burst(count: int, options: dict[str, Any]) -> list[float | None]:
    """`count` sessions opened at once, each running once every one of them is open (so all `count`
    are in flight together), then closed: each session's handshake on its open's path."""
    opened = 0
    everyone = anyio.Event()
    handshakes: list[float | None] = []

    async def one() -> None:
        nonlocal opened
        async with HostExecutor(**options) as ex:
            assert isinstance(ex.session, RunnerSession)
            handshakes.append(ex.session.handshake_seconds)
            opened += 1
            if opened == count:
                everyone.set()
            await everyone.wait()
            result = await ex.run("print(3)")
            assert result.ok and result.stdout == "3\n", result

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for _ in range(count):
                group.start_soon(one)
    return handshakes


def _key() -> host.PoolKey:
    level = host._LEVELS["auto"]
    return (level, False, ())


def _ready_for(tag: str) -> int:
    return sum(len(pool) for key, pool in host.POOLS.ready.by_key().items() if f'"BURST":"{tag}"' in key[1])


async def test_a_burst_of_opens_leaves_the_ready_pool_sized_for_it_then_it_shrinks() -> None:
    options = {"timeout": 20, "env": {"BURST": "eight"}}
    for _ in range(2):  # opened in turn: the base pool of these options
        async with HostExecutor(**options):
            pass
        await _settled()
    assert _ready_for("eight") == host.POOL_SIZE
    expected = min(8, host.MAX_POOL)
    await _burst(8, options)
    await _settled()
    assert _ready_for("eight") == expected, host.POOLS.sizes()
    # The next burst of as many finds every session initialised ahead: no handshake on any open's path.
    handshakes = await _burst(expected, options)
    assert handshakes == [0.0] * expected, handshakes
    # Without that demand the pools size back down (SHRINK_AFTER, ~5 s: polled generously).
    with anyio.fail_after(120):
        while _ready_for("eight") > host.POOL_SIZE or host.POOLS.started.count(_key()) > host.POOL_SIZE:
            await anyio.sleep(0.2)
    sizes = host.POOLS.sizes()
    assert sizes["pool_size"] == host.POOL_SIZE and sizes["spawners"] == 1, sizes
    await _settled()
    REAPER.drain()
    if os.getuid() == 0:  # the trimmed workers are killed (in the trimming thread), not left running
        with anyio.fail_after(60):
            while _private_user_processes() > len(host.pooled_workers()):
                await anyio.sleep(0.2)


async def _refuse_tools(call: Any) -> Any:
    raise AssertionError(f"no tool is offered here, but the runner called {call!r}")


async def test_a_plain_warm_up_leaves_a_guarded_session_fully_guarded() -> None:
    """The warm-up for plain Python (`WarmupRequest.python_guards` False) only picks what it touches:
    the session's guards come from its `init` alone. A worker warmed up that way, then started with
    the default (guarded) policy, refuses at run time what the guards refuse; the code goes to the
    runner directly, past the parent's static check, so that only the runner's guards stand."""
    worker = host.make_worker("namespaces", None, False)
    try:
        assert await anyio.to_thread.run_sync(lambda: worker.warm_up(python_guards=False))
        init = HostExecutor(timeout=20)._runner_init()
        assert init["policy"]["python_guards"] is True
        session = await RunnerSession.start(worker, init)
        imported = await session.run("import os\nprint(os.getpid())", _refuse_tools)
        assert imported.error is not None and imported.error.type == "PolicyViolation", imported
        assert imported.stdout == ""
        escaped = await session.run("print(().__class__.__base__.__subclasses__())", _refuse_tools)
        assert escaped.error is not None and escaped.stdout == "", escaped
        ran = await session.run("print(sum(i * i for i in range(4)))", _refuse_tools)
        assert ran.ok and ran.stdout == "14\n", ran
    finally:
        await worker.kill()


async def test_workers_made_ahead_for_plain_python_serve_only_their_own_options() -> None:
    """Workers initialised ahead for sessions without the Python guards are warmed up for plain
    Python; they serve those sessions (the full language), and a guarded session opened beside
    them, with otherwise the same options, still gets a guarded worker."""
    plain = {"timeout": 20, "policy": Policy(python_guards=False), "env": {"WARMED": "plain"}}
    guarded = {"timeout": 20, "env": {"WARMED": "plain"}}
    for _ in range(2):  # the second open is a hit: the ready pool of these options fills
        async with HostExecutor(**plain):
            pass
        await _settled()
    async with HostExecutor(**plain) as ex:
        assert isinstance(ex.session, RunnerSession) and ex.session.handshake_seconds == 0.0
        result = await ex.run("import os\nprint(type(os.getpid).__name__, ().__class__.__base__.__name__)")
        assert result.ok and result.stdout == "builtin_function_or_method object\n", result
    async with HostExecutor(**guarded) as ex:
        refused = await ex.run("import os")
        assert refused.error is not None and refused.error.type == "PolicyViolation", refused
        escaped = await ex.run("print(().__class__.__base__)")
        assert escaped.error is not None and escaped.stdout == "", escaped
