"""A host session's close: one ``kill(-1)`` as its private user (`sweep.signal_user`) instead of a
walk of its processes, then the reap's wait. Real processes throughout; the walks of the fork
server's namespace are counted by wrapping the real function (nothing is replaced)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from typing import Any

import pytest

from sandboxes import HostExecutor, Policy
from sandboxes.backends.host import reap, sweep
from sandboxes.backends.host.process import PRIVATE_USERS, HostWorker, namespaces_available
from sandboxes.backends.host.reap import REAPER

pytestmark = pytest.mark.anyio

ROOT = os.geteuid() == 0
SPAWNER = Policy(allowed_imports=["os", "subprocess", "time"], subprocess=True)


def _living(uid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        text = sweep.read_text(f"/proc/{entry.name}/status")
        if text and uid in map(int, sweep.process_uids(text)) and "\nState:\tZ" not in text:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not ROOT, reason="private users need root")
def test_signal_user_kills_every_process_of_that_user_only_and_gives_root_back() -> None:
    doomed, spared = 299_901, 299_902
    bomb = subprocess.Popen(["sh", "-c", "while :; do sleep 60 & done"], user=doomed, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], user=spared)
    try:
        deadline = time.monotonic() + 30
        while len(_living(doomed)) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_living(doomed)) >= 20  # a shell forking sleepers as fast as it can
        assert sweep.signal_user(doomed)
        # One call, no walk: not a process of the user lives on (once the killed ones have died:
        # a kill takes effect as each leaves the kernel), however fast it forked.
        deadline = time.monotonic() + 30
        while _living(doomed) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _living(doomed) == []
        assert other.poll() is None and _living(spared) == [other.pid]  # another user's: untouched
        assert os.getresuid() == (0, 0, 0)  # this thread is root again
        assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 1  # PR_GET_DUMPABLE: restored
        assert sweep.signal_user(doomed)  # nothing left to signal is no failure
    finally:
        for process in (bomb, other):
            if process.poll() is None:
                process.kill()
            process.wait()


@pytest.mark.skipif(
    not (ROOT and namespaces_available()), reason="a pooled namespaced session as a private user"
)
async def test_a_closed_session_is_killed_without_a_walk_then_confirmed_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kill walks nothing (it walked its user's processes twice before); the reaper's settling
    walks until two listings agree that nothing is left (twice at the least, more while processes
    die), and only then hands the uid out again."""
    walks = {"kill": 0, "wait": 0}
    phase = "kill"
    mine: int | None = None  # this session's uid: other sessions' kills (a pool trimmed) don't count
    real_walk, real_settle = sweep._namespace_walk, reap.settle

    def walk(wanted: set[str], within: int) -> Any:
        if str(mine) in wanted:
            walks[phase] += 1
        return real_walk(wanted, within)

    def settle(pending: list[reap.Unconfirmed]) -> list[reap.Unconfirmed]:
        nonlocal phase
        if any(p.uid == mine for p in pending):
            phase = "wait"
        return real_settle(pending)

    code = (
        "import subprocess\n"
        "subprocess.Popen(['sh', '-c', 'sleep 60 & sleep 60 & (setsid sleep 60 &) ; wait'])\n"
        "import time\ntime.sleep(0.3)\nprint('started')"
    )
    async with HostExecutor(isolation="namespaces", timeout=20, policy=SPAWNER) as ex:
        assert (await ex.run(code)).stdout == "started\n"
        worker = ex.session.worker  # type: ignore[union-attr]
        assert isinstance(worker, HostWorker) and worker.uid is not None and worker.process is None
        assert len(_living(worker.uid)) >= 4  # the runner, the shell and its sleepers, one setsid
        REAPER.drain()
        mine = worker.uid
        monkeypatch.setattr(sweep, "_namespace_walk", walk)
        monkeypatch.setattr(reap, "settle", settle)
    assert REAPER.drain()
    assert worker.reaped.is_set()
    assert _living(worker.uid) == []  # the setsid sleeper too
    assert walks["kill"] == 0 and walks["wait"] >= 2, walks
    assert not PRIVATE_USERS.held(worker.uid)  # shown gone: the uid may be handed out again


def _calls() -> tuple[list[bool], Any]:
    seen: list[bool] = []
    return seen, seen.append


@pytest.mark.skipif(not ROOT, reason="processes of another user need root")
def test_a_user_with_a_process_left_is_not_confirmed_until_it_is_gone() -> None:
    """`reap.settle` keeps an entry whose user still has a process (zombies count) and confirms it
    once the process is gone; past its deadline it gives up, saying so (the uid is then never freed)."""
    uid = 299_911
    straggler = subprocess.Popen(["sleep", "60"], user=uid)
    try:
        pending = reap.Unconfirmed(None, None, uid, None, frees=uid)
        seen, pending.confirmed = _calls()
        assert reap.settle([pending]) == [pending] and seen == []  # still there: not confirmed
        straggler.kill()
        straggler.wait()
        assert reap.settle([pending]) == [] and seen == [True]
        survivor = subprocess.Popen(["sleep", "60"], user=uid)
        late = reap.Unconfirmed(None, None, uid, None, frees=uid)
        late.deadline = time.monotonic() - 1
        seen, late.confirmed = _calls()
        assert reap.settle([late]) == [] and seen == [False]  # given up on, never shown gone
        survivor.kill()
        survivor.wait()
    finally:
        if straggler.poll() is None:
            straggler.kill()
            straggler.wait()


@pytest.mark.skipif(
    not (ROOT and namespaces_available()), reason="pooled namespaced sessions as private users"
)
async def test_sessions_killed_together_are_shown_gone_by_one_pair_of_listings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the batching is for: three killed sessions are confirmed by two walks of the fork
    server's processes (two listings that agree), not two each; their uids are free afterwards, and
    a live session of the same server is left alone."""
    executors = [HostExecutor(isolation="namespaces", timeout=20) for _ in range(4)]
    for ex in executors:  # each run at once: an open counts as starting until its first run, and
        await ex.open()  # four starting together would size the pools up for the tests after this
        assert (await ex.run("pass")).ok
    try:
        workers = [ex.session.worker for ex in executors]  # type: ignore[union-attr]
        assert all(isinstance(w, HostWorker) and w.uid is not None for w in workers)
        killed = [w.kill_then_confirm() for w in workers[:3]]  # type: ignore[union-attr]
        assert all(k is not None for k in killed)
        pending = [k for k in killed if k is not None]
        deadline = time.monotonic() + 10
        while (
            any(k.pid is not None and sweep.start_time(k.pid) == k.start for k in pending)
            and time.monotonic() < deadline
        ):
            time.sleep(0.005)
        walks = 0
        real_walk = sweep._namespace_walk

        def walk(wanted: set[str], within: int) -> Any:
            nonlocal walks
            walks += 1
            return real_walk(wanted, within)

        monkeypatch.setattr(sweep, "_namespace_walk", walk)
        while pending and time.monotonic() < deadline:  # the kernel may still be tearing one down
            walks = 0
            pending = reap.settle(pending)
        assert pending == [] and walks == 2
        for worker in workers[:3]:
            assert worker.reaped.is_set()  # type: ignore[union-attr]
            assert not PRIVATE_USERS.held(worker.uid)  # type: ignore[union-attr, arg-type]
        assert (await executors[3].run("print(6 * 7)")).stdout == "42\n"
    finally:
        for ex in executors:
            await ex.close()
