"""Fork bombs: what the attack corpus cannot say.

With subprocesses on, a fork bomb is contained by the process limit and the timeout: nothing it
started is alive afterwards (children would write markers after the timeout; the test waits past
it and looks in the working directory: none does), and the executor keeps working; a shell bomb
left running stays within the process limit while the session idles and is gone after `close()`
(the test counts this machine's processes). The host's bare `process` level refuses subprocesses
at open. That no process starts at all with subprocesses off, by any route, is
`benchmarks/corpus/processes.toml`'s.
"""

from __future__ import annotations

import os
import pathlib
import uuid

import anyio
import pytest
from support.security_helpers import HOST_BACKENDS, assert_usable, workdir_options

from sandboxes import Limits, Policy

pytestmark = pytest.mark.anyio

MODULES = ["os", "os.path", "time", "subprocess", "multiprocessing", "multiprocessing.*", "pty", "signal"]
WITH_SUBPROCESS = Policy(allowed_imports=MODULES, subprocess=True, limits=Limits(max_processes=48))

DELAY = 1.8
BOMBS = {
    "python fork bomb": (
        f"import os, time\nT = time.time() + {DELAY}\n"
        "while True:\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        continue\n"
        "    if pid == 0:\n"
        "        time.sleep(max(0, T - time.time()))\n"
        "        open(f'late-{os.getpid()}', 'w').write('x')\n"
        "        os._exit(0)\n"
    ),
    "subprocess bomb": (
        "import subprocess\n"
        "while True:\n"
        "    try:\n"
        f"        subprocess.Popen(['sh', '-c', 'sleep {DELAY}; echo x > late-$$'])\n"
        "    except OSError:\n        pass\n"
    ),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
async def test_fork_bomb_is_contained(
    executor_factory, backend: str, tmp_path: pathlib.Path, name: str
) -> None:
    options = workdir_options(backend, tmp_path)
    async with executor_factory(policy=WITH_SUBPROCESS, timeout=1.0, **options) as ex:
        result = await ex.run(BOMBS[name])
        assert not result.ok
        assert result.timed_out or result.error is not None, result
        await anyio.sleep(DELAY + 0.7)
        if backend not in HOST_BACKENDS:
            listing = await ex.run(
                "import os\nprint(sorted(n for n in os.listdir('.') if n.startswith('late')))"
            )
            assert listing.stdout == "[]\n", listing
        await assert_usable(ex)
    if backend in HOST_BACKENDS:
        assert not list(tmp_path.glob("late-*")), "processes of the bomb outlived the timeout"


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                    if token.encode() in handle.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


BOMB_LEFT_RUNNING = (
    "import subprocess, time\n"
    # Doubling every 0.1 s: a real bomb, but one that a shared test machine survives.
    "subprocess.Popen(['sh', '-c', 'b() {{ sleep 0.1; b & b & }}; b', {token!r}], start_new_session=True)\n"
    "time.sleep(0.5)\nprint('left it running')\n"
)


async def test_host_shell_bomb_left_running_is_bounded_and_dies_with_the_session() -> None:
    """Host fact: a shell fork bomb that the run leaves in the background (the run itself returns)
    stays within `max_processes` while the session idles, and is gone after close()."""
    from sandboxes import HostExecutor

    token = f"kodeagent-bomb-{uuid.uuid4().hex[:8]}"
    most = 0

    async def count() -> None:  # from the run's start (the bomb's first doublings) to 1.5 s idle
        nonlocal most
        for _ in range(25):  # unbounded, it would double 25 times
            most = max(most, len(_processes_with(token)))
            await anyio.sleep(0.1)

    async with HostExecutor(policy=WITH_SUBPROCESS, timeout=10) as ex:
        async with anyio.create_task_group() as counting:
            counting.start_soon(count)
            result = await ex.run(BOMB_LEFT_RUNNING.format(token=token))
            assert result.stdout == "left it running\n", result
            await assert_usable(ex)
    assert 2 <= most <= WITH_SUBPROCESS.limits.max_processes, most
    for _ in range(20):
        if not _processes_with(token):
            break
        await anyio.sleep(0.1)
    assert _processes_with(token) == [], "the bomb outlived close()"


@pytest.mark.parametrize("pooled", [True, False])
async def test_the_process_level_refuses_subprocesses_before_anything_runs(
    tmp_path: pathlib.Path, pooled: bool
) -> None:
    """Host fact: the bare `process` level has no wall but the Python-level guards, and a started
    program runs outside them (with this machine's network and files; as root with no private user,
    not even bounded by `max_processes`: a bomb filled the pid table). So `subprocess=True` is
    refused there at open, before the runner gets any code; without it the level still runs code."""
    from sandboxes import BackendUnavailable, HostExecutor

    token = f"kodeagent-bomb-{uuid.uuid4().hex[:8]}"
    options: dict[str, object] = {} if pooled else {"workdir": str(tmp_path)}
    code = "open('marker', 'w').write('ran')\n" + BOMB_LEFT_RUNNING.format(token=token)
    ex = HostExecutor(policy=WITH_SUBPROCESS, timeout=10, isolation="process", **options)
    with pytest.raises(BackendUnavailable, match=r"subprocess=True.*bubblewrap.*keep subprocess=False"):
        async with ex:
            await ex.run(code)
    assert ex.session is None
    await anyio.sleep(0.5)
    assert _processes_with(token) == [] and not (tmp_path / "marker").exists()
    guarded = Policy(allowed_imports=MODULES, limits=WITH_SUBPROCESS.limits)
    async with HostExecutor(policy=guarded, timeout=10, isolation="process", **options) as ex:
        started = await ex.run(code)
        assert ex.isolation == "process"
        assert not started.ok and "subprocess" in str(started.error), started
    assert _processes_with(token) == []
