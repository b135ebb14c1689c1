"""Fork on the Docker backend: a forked session lives in its parent's container (docs/fork.md).

The fork contract itself (state and files copied then independent, timeouts, crashes and closes that
reach no other session of the family, refusals, snapshots, tools) runs on docker and dockershared in
`tests/conformance/test_fork.py`. Here, what only Docker has, seen from the daemon: the family's
container (kept while any of its sessions lives, removed with the last, at interpreter exit too), the
fork relays that carry a fork's channel over the attach stream, the descriptors the runners hold, and
forks in shared containers.
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


async def test_a_fork_lives_in_its_parents_container_in_a_directory_of_its_own():
    async with make() as parent:
        await parent.run("x = 41")
        async with await parent.fork() as child:
            assert child.container_id == parent.container_id, "a fork lives in its parent's container"
            where = (await child.run("import os\nprint(os.getcwd())")).stdout
            home = (await parent.run("import os\nprint(os.getcwd())")).stdout
    assert where.startswith("/forks/") and home == "/workspace\n"


async def test_a_childs_lost_session_leaves_the_container_and_its_next_gets_one_of_its_own():
    async with make(timeout=2) as parent:
        await parent.run("x = 'kept'")
        container = parent.container_id
        for code in ("while True:\n    pass", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"):
            async with await parent.fork() as child:
                assert (await child.run(code)).state_lost
                assert (st := state(container)) is not None and st["Running"], "the container stays"
                assert (await child.run("print('again')")).stdout == "again\n"
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


async def test_the_container_lives_until_the_familys_last_close():
    parent = make()
    await parent.open()
    await parent.run("depth = 0")
    container = parent.container_id
    child = await parent.fork()
    grandchild = await child.fork()
    assert grandchild.container_id == container
    await child.close()  # the middle one first
    assert (st := state(container)) is not None and st["Running"]
    await parent.close()
    assert (st := state(container)) is not None and st["Running"]
    assert (await grandchild.run("print(depth)")).stdout == "0\n"
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


async def test_a_fork_refused_by_the_runner_leaves_the_session_intact():
    """A working directory that already exists: the runner refuses, this session goes on."""
    async with make() as parent:
        await parent.run("x = 7")
        from sandboxes.backends.docker.container import DockerWorker
        from sandboxes.worker import ForkPlan

        worker = parent.session.worker
        assert isinstance(worker, DockerWorker)

        async def taken() -> ForkPlan:
            return ForkPlan("/forks", "listen")  # exists already (the family's own fork volume)

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
        assert wait_for(lambda: relays(container) == 3), (
            f"the child's relay and spare end with it: {relays(container)} left"
        )
        assert (await grandchild.run("print(x)")).stdout == "1\n"
        await grandchild.close()
        await again.close()
        assert wait_for(lambda: relays(container) == 1)  # the parent's spare, for its next fork
    assert wait_for(lambda: state(container) is None)


async def test_a_snapshot_opens_in_the_container_and_the_container_goes_with_its_executor():
    from sandboxes import open_executor

    parent = make()
    await parent.open()
    await parent.run("counter = 10")
    container = parent.container_id
    snapshot = await parent.snapshot()
    async with open_executor("docker", from_snapshot=snapshot) as opened:
        assert opened.container_id == container
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
