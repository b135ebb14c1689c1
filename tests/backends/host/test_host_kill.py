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
from sandboxes.backends.host import process, sweep
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
    """The kill walks nothing (it walked its user's processes twice before); the reap's wait walks
    until two listings agree that nothing is left (twice at the least, more while processes die)."""
    walks = {"kill": 0, "wait": 0}
    phase = "kill"
    real_walk, real_wait = sweep._namespace_processes, process.wait_until_reaped

    def walk(uid: int, within: int) -> Any:
        walks[phase] += 1
        return real_walk(uid, within)

    def wait(*args: Any, **kwargs: Any) -> bool:
        nonlocal phase
        phase = "wait"
        return real_wait(*args, **kwargs)

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
        monkeypatch.setattr(sweep, "_namespace_processes", walk)
        monkeypatch.setattr(process, "wait_until_reaped", wait)
    assert REAPER.drain()
    assert worker.reaped.is_set()
    assert _living(worker.uid) == []  # the setsid sleeper too
    assert walks["kill"] == 0 and walks["wait"] >= 2, walks
    assert not PRIVATE_USERS.held(worker.uid)  # shown gone: the uid may be handed out again
