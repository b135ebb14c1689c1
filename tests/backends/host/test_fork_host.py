"""Fork on the host backend: what only the host has (docs/fork.md, Host). The fork contract itself
runs on host and hostprocess (both isolation levels) in `tests/conformance/test_fork.py`.

Here: a session with a sandbox of its own cannot be forked; a family shares one private user, swept
only when its last session closes; and an unrelated session, without the Python guards, still cannot
reach a fork's files or processes across the OS boundary.
"""

from __future__ import annotations

import os

import pytest
from support.backend_host import tmp_left_open
from support.needs import require
from support.wire_helpers import pids_of

from sandboxes import ForkError, HostExecutor, Policy

pytestmark = pytest.mark.anyio

POLICY = Policy(allowed_imports=["os", "signal", "threading", "time"], subprocess=True)


async def test_a_session_with_its_own_sandbox_refuses_with_the_reason(tmp_path: object) -> None:
    async with HostExecutor(isolation="namespaces", timeout=10, workdir=str(tmp_path)) as parent:
        with pytest.raises(ForkError, match="sandbox of its own"):
            await parent.fork()
        assert (await parent.run("print(1)")).stdout == "1\n"


async def test_nothing_is_left_after_both_close() -> None:
    parent = HostExecutor(timeout=10, policy=POLICY)
    await parent.open()
    await parent.run("import threading\nx = 1")
    child = await parent.fork()
    await child.run("x = 2")
    uid = parent.session.worker.uid  # type: ignore[union-attr]
    workdirs = [parent.session.worker.workdir, child.session.worker.workdir]  # type: ignore[union-attr]
    await child.close()
    if uid is not None:
        assert pids_of(uid), "the parent's runner must outlive its child's close"
    await parent.close()
    await parent.wait_closed()  # the last close of the family sweeps the user, off the caller's path
    if uid is not None:
        assert not pids_of(uid)
    assert not any(os.path.exists(path) for path in workdirs)


async def test_unrelated_sessions_stay_separated_from_a_fork_at_the_os_layer() -> None:
    # Without the Python guards only the OS boundary holds: a fork shares its parent's user, but an
    # unrelated session still cannot read, write or signal into the fork's files and processes.
    unguarded = Policy(python_guards=False)
    async with HostExecutor(isolation="namespaces", timeout=10, policy=unguarded) as parent:
        await parent.run("open('secret.txt', 'w').write('family')")
        async with (
            await parent.fork() as child,
            HostExecutor(isolation="namespaces", timeout=10, policy=unguarded) as stranger,
        ):
            where = (await child.run("import os\nprint(os.getcwd(), os.getpid())")).stdout.split()
            workdir, pid = where[0], int(where[1])
            probe = (
                "import os\n"
                "for attempt in ('read', 'write', 'signal'):\n"
                "    try:\n"
                f"        if attempt == 'read': open({workdir!r} + '/secret.txt').read()\n"
                f"        elif attempt == 'write': open({workdir!r} + '/planted.txt', 'w').write('x')\n"
                f"        else: os.kill({pid}, 0)\n"
                "        print(attempt, 'reached')\n"
                "    except OSError as e:\n"
                "        print(attempt, type(e).__name__)"
            )
            attempts = await stranger.run(probe)
            listing = await child.run("print(sorted(os.listdir('.')))")
            shared = await child.run(f"print(open({workdir!r} + '/secret.txt').read())")
    assert "reached" not in attempts.stdout, attempts.stdout
    assert attempts.stdout.count("PermissionError") + attempts.stdout.count("ProcessLookupError") == 3
    assert listing.stdout == "['secret.txt']\n"  # nothing was planted
    assert shared.stdout == "family\n"  # (the control: the fork itself reads its own copy)


async def test_a_forks_temporary_files_go_to_its_own_directory() -> None:
    require(tmp_left_open(), "a /tmp closed to sessions")
    policy = Policy(allowed_imports=["os", "os.path", "tempfile"])
    async with HostExecutor(isolation="namespaces", timeout=10, policy=policy) as parent:
        # A first temporary file: `tempfile` now holds the parent's directory, which a fork must not use.
        opened = await parent.run("import os, tempfile\nfd, first = tempfile.mkstemp()\nos.close(fd)")
        assert opened.ok, opened.error
        async with await parent.fork() as child:
            result = await child.run(
                "fd, made = tempfile.mkstemp()\n"
                "os.close(fd)\n"
                "here = os.getcwd()\n"
                "print(os.path.dirname(made) == here, os.environ['TMPDIR'] == here,"
                " os.path.dirname(first) != here)"
            )
            assert result.stdout == "True True True\n", result.error
        listed = await parent.run("print(len(os.listdir('.')))")
    assert listed.stdout == "1\n"  # only the parent's own file: the fork wrote nothing here


async def test_a_fork_counts_the_codes_threads_whether_or_not_a_run_streamed() -> None:
    # The runner's stream sender starts with its first streamed run: the census counts past it either way.
    for streamed in (False, True):
        async with HostExecutor(timeout=10, policy=POLICY) as parent:
            if streamed:
                seen: list[str] = []
                await parent.run(
                    "print('streamed')", on_stdout=lambda event, out=seen: out.append(event.text)
                )
                assert seen == ["streamed\n"]
            await parent.run(
                "import threading\nstop = threading.Event()\n"
                "worker = threading.Thread(target=stop.wait, daemon=True)\nworker.start()"
            )
            async with await parent.fork() as child:
                report = child.fork_report
            await parent.run("stop.set()")
        assert report is not None and report.threads_not_copied == 1, (streamed, report)
