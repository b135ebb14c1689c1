"""Fork on the Docker backend: a forked session lives in its parent's container (docs/fork.md).

Each test drives real containers on the daemon and checks what a fork promises there: state and files
copied, then independent both ways; one session's timeout, crash or close never reaches another of
its family; the container goes with the family's last session, and nothing is left behind.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from support import backend_docker

from sandboxes import Policy
from sandboxes.errors import ForkError

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

POLICY = Policy(allowed_imports=["os", "posixpath", "subprocess", "signal", "time"], subprocess=True)


@pytest.fixture(autouse=True)
def _docker() -> None:
    backend_docker.require()


def make(**options: Any) -> Any:
    options.setdefault("timeout", 20)
    options.setdefault("policy", POLICY)
    return backend_docker.make_executor(**options)


def state(container_id: str) -> dict | None:
    """The container's State, or None when it no longer exists."""
    import docker.errors

    from sandboxes.backends.docker import client

    try:
        return client().api.inspect_container(container_id)["State"]
    except docker.errors.NotFound:
        return None


def wait_for(predicate: Any, seconds: float = 45.0) -> bool:
    # Generous: removals and kills run in background threads, behind others on a loaded machine.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def in_container(container_id: str, code: str) -> str:
    """Run Python in the container as its sandbox user (outside every session) and return stdout."""
    from sandboxes.backends.docker import client

    api = client().api
    created = api.exec_create(container_id, ["python3", "-I", "-c", code], user="1000:1000")
    return api.exec_start(created["Id"]).decode()


def process_state(container_id: str, pid: int) -> str:
    """One letter from /proc/PID/stat in the container (R, S, T, Z...), or '-' for no such process."""
    code = (
        "import sys\ntry:\n"
        f"    print(open('/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0])\n"
        "except OSError:\n    print('-')"
    )
    return in_container(container_id, code).strip()


async def pid_of(ex: Any) -> int:
    result = await ex.run("import os\nprint(os.getpid())")
    assert result.error is None, result.error
    return int(result.stdout)


async def test_state_and_files_are_copied_then_independent_both_ways():
    async with make() as parent:
        await parent.run("x = 41\ndata = list(range(100_000))\nopen('a.txt', 'w').write('parent')")
        await parent.upload("sub/b.bin", b"\x00\x01" * 1000)
        child = await parent.fork()
        async with child:
            assert child.container_id == parent.container_id, "a fork lives in its parent's container"
            report = child.fork_report
            assert report is not None and report.files_copied == 2 and report.bytes_copied == 2006
            result = await child.run(
                "x += 1\nprint(x, len(data), open('a.txt').read(), open('sub/b.bin', 'rb').read()[:2])\n"
                "open('a.txt', 'w').write('child')\nimport os\nprint(os.getcwd())"
            )
            assert result.error is None, result.error
            lines = result.stdout.splitlines()
            assert lines[0] == "42 100000 parent b'\\x00\\x01'"
            assert lines[1].startswith("/forks/")
            # the parent saw none of it
            result = await parent.run("import os\nprint(x, open('a.txt').read(), os.getcwd())")
            assert result.stdout == "41 parent /workspace\n"
            # nor the child what the parent does now
            await parent.run("x = 'p'\nopen('c.txt', 'w').write('new')")
            result = await child.run("import os\nprint(x, os.path.exists('c.txt'))")
            assert result.stdout == "42 False\n"
            # the files API reaches each session's own directory
            assert await child.download("a.txt") == b"child"
            assert await parent.download("a.txt") == b"parent"
            await child.upload("only-child.txt", b"mine")
            result = await parent.run("print(os.path.exists('only-child.txt'))")
            assert result.stdout == "False\n"
            assert (await child.run("print(open('only-child.txt').read())")).stdout == "mine\n"


async def test_a_childs_timeout_or_crash_leaves_the_parent_and_its_container():
    async with make(timeout=2) as parent:
        await parent.run("x = 'kept'")
        container = parent.container_id
        for code, lost in (
            ("while True:\n    pass", "timed_out"),
            ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "crash"),
        ):
            child = await parent.fork()
            async with child:
                pid = await pid_of(child)
                result = await child.run(code)
                assert result.state_lost
                if lost == "timed_out":
                    assert result.timed_out
                else:
                    assert result.error is not None and result.error.type == "WorkerCrashed"
                assert wait_for(lambda pid=pid: process_state(container, pid) in ("-", "Z"))
                assert (st := state(container)) is not None and st["Running"], "the container stays"
                result = await parent.run("print(x)")
                assert result.stdout == "kept\n" and not result.state_lost
                # the child's next run starts afresh (the lost state was reported above), in a
                # container of its own
                result = await child.run("print('again')")
                assert result.stdout == "again\n" and result.error is None
                assert child.container_id != container


async def test_a_parents_timeout_leaves_its_fork_running():
    async with make(timeout=2) as parent:
        await parent.run("x = 'state'")
        container = parent.container_id
        root_pid = await pid_of(parent)
        child = await parent.fork()
        async with child:
            result = await parent.run("while True:\n    pass")
            assert result.timed_out and result.state_lost
            # the parent's runner is the container's main process: stopped, not killed
            assert process_state(container, root_pid) == "T"
            result = await child.run("print(x)")
            assert result.stdout == "state\n" and not result.state_lost
            assert parent.container_id != container, "the parent's next session has its own container"
        assert wait_for(lambda: state(container) is None), "the family's last close removes it"


async def test_closing_the_parent_leaves_the_child_and_the_last_close_removes_the_container():
    parent = make()
    await parent.open()
    await parent.run("x = 1\nimport subprocess\nsleeper = subprocess.Popen(['sleep', '300'])")
    container = parent.container_id
    sleeper = int((await parent.run("print(sleeper.pid)")).stdout)
    child = await parent.fork()
    try:
        await parent.close()
        assert wait_for(lambda: process_state(container, sleeper) in ("-", "Z")), (
            "the parent's own processes end with it"
        )
        assert (st := state(container)) is not None and st["Running"]
        result = await child.run("x += 1\nprint(x)")
        assert result.stdout == "2\n" and not result.state_lost
    finally:
        await child.close()
    assert wait_for(lambda: state(container) is None), "no container left after both close"


async def test_closing_the_child_ends_its_processes_and_directory_and_leaves_the_parent():
    async with make() as parent:
        await parent.run("x = 5")
        container = parent.container_id
        child = await parent.fork()
        result = await child.run(
            "import os, subprocess\nbusy = subprocess.Popen(['sleep', '300'])\nprint(busy.pid, os.getcwd())"
        )
        busy, workdir = result.stdout.split()
        child_pid = await pid_of(child)
        await child.close()

        def gone() -> bool:
            return all(process_state(container, pid) in ("-", "Z") for pid in (int(busy), child_pid))

        assert wait_for(gone), "the child's runner and what it started are killed"
        assert wait_for(
            lambda: in_container(container, f"import os; print(os.path.exists({workdir!r}))") == "False\n"
        )
        assert (await parent.run("print(x)")).stdout == "5\n"
        assert (st := state(container)) is not None and st["Running"]
    assert wait_for(lambda: state(container) is None)


async def test_a_fork_of_a_fork_and_nothing_left_after_all_close():
    parent = make()
    await parent.open()
    await parent.run("depth = 0")
    container = parent.container_id
    child = await parent.fork()
    await child.run("depth += 1")
    grandchild = await child.fork()
    assert grandchild.container_id == container
    assert (await grandchild.run("depth += 1\nprint(depth)")).stdout == "2\n"
    pids = [await pid_of(ex) for ex in (parent, child, grandchild)]
    assert len(set(pids)) == 3
    await child.close()  # the middle one first: the others go on
    assert (await grandchild.run("print(depth)")).stdout == "2\n"
    assert (await parent.run("print(depth)")).stdout == "0\n"
    await parent.close()
    assert (await grandchild.run("print(depth + 1)")).stdout == "3\n"
    assert state(container) is not None
    await grandchild.close()
    assert wait_for(lambda: state(container) is None), "the last of the family removes the container"


async def test_the_child_holds_nothing_of_the_parents_channel():
    """Every pipe and socket the parent's runner holds (its channel to us among them) is absent from
    the child runner's descriptors (read from outside both sessions, in /proc): the child can neither
    read nor write the parent's conversation."""

    def links(container: str, pid: int) -> set[str]:
        code = (
            "import os\nfound = set()\n"
            f"for fd in os.listdir('/proc/{pid}/fd'):\n"
            f"    found.add(os.readlink('/proc/{pid}/fd/' + fd))\n"
            "print('\\n'.join(sorted(l for l in found if l.startswith(('pipe:', 'socket:')))))"
        )
        return set(in_container(container, code).split())

    async with make() as parent:
        await parent.run("x = 1")
        container = parent.container_id
        child = await parent.fork()
        async with child:
            theirs = links(container, await pid_of(parent))
            ours = links(container, await pid_of(child))
            assert len(theirs) >= 3 and len(ours) >= 3  # channel, capture pipes
            assert not theirs & ours, f"shared descriptors: {theirs & ours}"
            # what the child writes to any descriptor (its own channel included, which spoils its own
            # session) never reaches the parent's conversation
            await child.run(
                "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{}\\n')\n"
                "    except Exception:\n        pass"
            )
            result = await parent.run("print(x)")
            assert result.stdout == "1\n" and not result.state_lost


async def test_fork_refusals():
    async with make() as parent:
        await parent.run("x = 1")
    with pytest.raises(Exception, match="closed"):
        await parent.fork()


async def test_a_fork_refused_by_the_runner_leaves_the_session_intact():
    """A working directory that already exists: the runner refuses, this session goes on."""
    async with make() as parent:
        await parent.run("x = 7")
        from sandboxes.backends.docker.container import DockerWorker
        from sandboxes.worker import ForkPlan

        worker = parent.session.worker
        assert isinstance(worker, DockerWorker)

        async def taken() -> ForkPlan:
            return ForkPlan("/forks", "listen")  # exists already

        worker.prepare_fork = taken  # type: ignore[method-assign]
        with pytest.raises(ForkError, match="working directory"):
            await parent.fork()
        result = await parent.run("print(x)")
        assert result.stdout == "7\n" and not result.state_lost


def relays(container_id: str) -> int:
    """How many `forkrelay.py relay` processes run in the container (live or spare, not zombies)."""
    code = (
        "import os\nn = 0\nfor p in os.listdir('/proc'):\n    try:\n"
        "        cmd = open('/proc/' + p + '/cmdline', 'rb').read().split(b'\\0')\n"
        "        state = open('/proc/' + p + '/stat').read().rsplit(')', 1)[1].split()[0]\n"
        "    except OSError:\n        continue\n"
        "    n += b'/opt/kodeagent/runtime/forkrelay.py' in cmd and b'relay' in cmd and state != 'Z'\n"
        "print(n)"
    )
    return int(in_container(container_id, code))


async def test_relays_end_with_their_sessions():
    """Each fork's relay, and the spare a forking session keeps for its next fork, end with it."""
    async with make() as parent:
        await parent.run("x = 1")
        container = parent.container_id
        assert relays(container) == 0, "no relay before the first fork"
        child = await parent.fork()
        assert wait_for(lambda: relays(container) == 2)  # the child's, and the parent's spare
        grandchild = await child.fork()
        assert wait_for(lambda: relays(container) == 4)
        again = await parent.fork()  # takes the parent's spare, starts the next one
        assert (await again.run("print(x)")).stdout == "1\n"
        assert wait_for(lambda: relays(container) == 5)
        await child.close()
        assert wait_for(lambda: relays(container) == 3), "the child's relay and spare end with it"
        assert (await grandchild.run("print(x)")).stdout == "1\n"
        await grandchild.close()
        await again.close()
        assert wait_for(lambda: relays(container) == 1)  # the parent's spare, for its next fork
    assert wait_for(lambda: state(container) is None)


async def test_the_parents_directory_by_its_absolute_path_stays_out_of_reach():
    async with make() as parent:
        await parent.run("import os\nhere = os.getcwd()\nopen('secret.txt', 'w').write('p')")
        async with await parent.fork() as child:
            result = await child.run("print(open(here + '/secret.txt').read())")
            assert result.error is not None and result.error.type == "PermissionError", result
            assert (await child.run("print(open('secret.txt').read())")).stdout == "p\n"


async def test_snapshots_open_forks_in_the_container_and_close_with_their_executor():
    from sandboxes import open_executor

    parent = make()
    await parent.open()
    await parent.run("counter = 10")
    container = parent.container_id
    snapshot = await parent.snapshot()
    await parent.run("counter = 99")
    outputs = []
    for _ in range(2):
        async with open_executor("docker", from_snapshot=snapshot) as opened:
            assert opened.container_id == container
            outputs.append((await opened.run("counter += 1\nprint(counter)")).stdout)
    assert outputs == ["11\n", "11\n"]
    await parent.close()
    assert snapshot.closed
    assert wait_for(lambda: state(container) is None), "the snapshot's container goes with it"


def test_a_family_nobody_closed_is_removed_at_interpreter_exit():
    """The root closed (retired), its forks never closed: the container goes when the process exits."""
    import subprocess
    import sys
    import textwrap

    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    script = textwrap.dedent(
        f"""
        import anyio
        from sandboxes.backends.docker import DockerExecutor

        async def main():
            ex = DockerExecutor(image={backend_docker.IMAGE!r}, timeout=10)
            await ex.open()
            await ex.run("x = 1")
            child = await ex.fork()
            grandchild = await child.fork()
            print(child.container_id, flush=True)
            await ex.close()
            assert (await grandchild.run("print(x)")).stdout == "1\\n"

        anyio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert done.returncode == 0, done.stderr
    container = done.stdout.strip()
    assert len(container) == 64
    assert wait_for(lambda: state(container) is None), "removed at exit, forks and all"


# ---------------------------------------------------------------------- shared containers

SHARED = {"sessions_per_container": 8, "pool": False, "tmp_mb": 61}
"""Shared containers of settings no other test uses (`tmp_mb`), and none started ahead: sequential
sessions take turns in one container, so a test can tell the container was reused."""

UID_PROCESSES = (
    "import os\nuid = '{uid}'\nfound = []\n"
    "for name in os.listdir('/proc'):\n"
    "    try:\n"
    "        status = open(f'/proc/{{name}}/status').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    line = [l for l in status.splitlines() if l.startswith('Uid:')]\n"
    "    if line and uid in line[0].split()[1:]:\n"
    "        found.append(name)\n"
    "print(len(found))"
)


async def test_a_fork_in_a_shared_container_and_the_container_reused_clean_after_its_family():
    parent = make(**SHARED)
    await parent.open()
    await parent.run("x = 41\nopen('a.txt', 'w').write('parent')")
    container = parent.container_id
    assert container is not None
    child = await parent.fork()
    assert child.container_id == container, "a fork lives in its parent's shared container"
    result = await child.run("x += 1\nimport os\nprint(x, open('a.txt').read(), os.getuid(), os.getcwd())")
    assert result.error is None, result.error
    count, text, uid, cwd = result.stdout.split()
    assert (count, text) == ("42", "parent")
    parent_view = await parent.run("import os\nprint(x, os.getuid(), os.getcwd())")
    assert parent_view.stdout.split()[:2] == ["41", uid], "one family, one uid"
    assert parent_view.stdout.split()[2] != cwd and cwd.startswith("/sessions/")
    # a process of the family outlives the parent's close, and the fork keeps working
    started = await child.run(
        "import subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\nprint('ok')"
    )
    assert started.stdout == "ok\n"
    await parent.close()
    assert (await child.run("print(x)")).stdout == "42\n"
    assert int(in_container(container, UID_PROCESSES.format(uid=uid))) >= 2  # the fork and its sleep
    await child.close()
    # the last of the family gone: the host cleaned the uid, and the container serves the next session
    assert wait_for(lambda: in_container(container, UID_PROCESSES.format(uid=uid)).strip() == "0")
    async with make(**SHARED) as following:
        assert following.container_id == container, "a cleaned container is reused"
        result = await following.run("import os\nprint(os.getuid(), os.environ['TMPDIR'])")
        assert result.error is None, result.error
        new_uid, tmpdir = result.stdout.split()
        assert new_uid != uid
        left = in_container(container, "import os\nprint(sorted(os.listdir('/tmp')))")
        assert left.strip() == repr([os.path.basename(tmpdir)]), "nothing of the family is left in /tmp"
