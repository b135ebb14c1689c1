"""Attack class: timeouts escaped by threads, daemons, `atexit`, `__del__`, ignored signals, `setsid`.

Each snippet leaves something behind that would write a marker file at an absolute moment *after*
the timeout (or after `close()`), then spins. The test waits past that moment and proves the marker
was never written: everything the code started died with the worker. A control shows the marker
mechanism itself works when nothing is killed.

Not attack-corpus entries: each waits past the timeout (or past `close()`) and then looks in the
working directory, from this machine for the host backends.
"""

from __future__ import annotations

import pathlib
import time

import anyio
import pytest
from support.security_helpers import HOST_BACKENDS, assert_usable, workdir_options

from sandboxes import Policy

pytestmark = pytest.mark.anyio

TIMEOUT = 1.0
DELAY = 1.8  # the marker is due this long after the run starts: well past the timeout
POLICY = Policy(
    allowed_imports=["threading", "time", "os", "os.path", "signal", "atexit", "subprocess"], subprocess=True
)
PRELUDE = f"import time\nT = time.time() + {DELAY}\n"
WRITE = "open('marker', 'w').write('x')"
SPIN = "while True:\n    pass\n"
SHELL_SLEEP = f"sleep {DELAY}; echo x > marker"

ESCAPES = {
    "thread": (
        "import threading\n"
        f"def late():\n    time.sleep(max(0, T - time.time()))\n    {WRITE}\n"
        "threading.Thread(target=late).start()\n" + SPIN
    ),
    "daemon thread": (
        "import threading\n"
        f"def late():\n    time.sleep(max(0, T - time.time()))\n    {WRITE}\n"
        "threading.Thread(target=late, daemon=True).start()\n" + SPIN
    ),
    "atexit": (
        "import atexit\n"
        f"def late():\n    time.sleep(max(0, T - time.time()))\n    {WRITE}\n"
        "atexit.register(late)\n" + SPIN
    ),
    "__del__": (
        # `def __del__` is refused by the policy; a class built with type() can still carry one.
        f"def late(self):\n    time.sleep(max(0, T - time.time()))\n    {WRITE}\n"
        "Late = type('Late', (), {'_' + '_del_' + '_': late})\n"
        "keep = [Late() for _ in range(3)]\n" + SPIN
    ),
    "ignored signals": (
        "import signal, threading\n"
        "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        f"def late():\n    time.sleep(max(0, T - time.time()))\n    {WRITE}\n"
        "threading.Thread(target=late).start()\n"
        "while True:\n    try:\n        time.sleep(0.01)\n    except BaseException:\n        pass\n"
    ),
    "setsid child": (
        f"import subprocess\nsubprocess.Popen(['sh', '-c', {SHELL_SLEEP!r}], start_new_session=True)\n" + SPIN
    ),
    "nohup child ignoring signals": (
        "import subprocess\n"
        f"subprocess.Popen(['sh', '-c', 'trap \"\" TERM HUP INT; ' + {SHELL_SLEEP!r}], start_new_session=True)\n"
        + SPIN
    ),
    "double fork with setsid": (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        time.sleep(max(0, T - time.time()))\n        {WRITE}\n"
        "    os._exit(0)\n" + SPIN
    ),
    "forked child in its own process group": (
        "import os, signal\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setpgid(0, 0)\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"    time.sleep(max(0, T - time.time()))\n    {WRITE}\n    os._exit(0)\n" + SPIN
    ),
}


async def marker_written(ex, backend: str, workdir: pathlib.Path) -> bool:
    """Wait until every marker was due (and a little more), then look for it."""
    await anyio.sleep(DELAY + 0.7)
    if backend in HOST_BACKENDS:
        return (workdir / "marker").exists()
    probe = await ex.run("import os\nprint(os.path.exists('marker'))")
    return probe.stdout == "True\n"


@pytest.mark.parametrize("name", sorted(ESCAPES))
async def test_nothing_outlives_a_timeout(
    executor_factory, backend: str, tmp_path: pathlib.Path, name: str
) -> None:
    options = workdir_options(backend, tmp_path)
    async with executor_factory(policy=POLICY, timeout=TIMEOUT, **options) as ex:
        started = time.monotonic()
        result = await ex.run(PRELUDE + ESCAPES[name])
        returned = time.monotonic() - started
        assert result.timed_out and result.state_lost, result
        written = await marker_written(ex, backend, tmp_path)
        if written and returned >= DELAY:
            pytest.skip("this machine was too slow to tell: the kill ended after the marker was due")
        assert not written, f"{name} outlived the timeout"
        await assert_usable(ex)


@pytest.mark.parametrize("name", ["daemon thread", "setsid child", "double fork with setsid", "atexit"])
async def test_nothing_outlives_close(
    executor_factory, backend: str, tmp_path: pathlib.Path, name: str
) -> None:
    # The same escapes, but the run returns at once and the session is closed instead of timing out.
    code = PRELUDE + ESCAPES[name].replace(SPIN, "print('started')\n")
    options = workdir_options(backend, tmp_path)
    async with executor_factory(policy=POLICY, timeout=10, **options) as ex:
        result = await ex.run(code)
        assert result.stdout.endswith("started\n"), result
    if backend not in HOST_BACKENDS:
        pytest.skip("the working directory of a closed remote session cannot be inspected")
    await anyio.sleep(DELAY + 0.7)
    assert not (tmp_path / "marker").exists(), f"{name} outlived close()"


async def test_control_marker_is_written_when_nothing_is_killed(
    executor_factory, backend: str, tmp_path: pathlib.Path
) -> None:
    """Control: with a timeout long enough, the same thread does write its marker."""
    code = PRELUDE.replace(str(DELAY), "0.2") + ESCAPES["thread"].replace(SPIN, "time.sleep(0.6)\n")
    options = workdir_options(backend, tmp_path)
    async with executor_factory(policy=POLICY, timeout=10, **options) as ex:
        result = await ex.run(code)
        assert result.ok, result
        probe = await ex.run("import os\nprint(os.path.exists('marker'))")
        assert probe.stdout == "True\n", probe
    if backend in HOST_BACKENDS:
        assert (tmp_path / "marker").exists()
