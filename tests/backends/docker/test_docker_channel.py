"""A shared container's sessions on their own sockets (`docker.channel`): nobody else's to reach.

Each session's runner connects to a socket this process listens on, in a 0700 directory of the
session's uid, in a directory bind-mounted read-only into the container. The attacks come from a
session whose code controls its runner (`python_guards=False`) and knows the victim's directory by
name (the names are random; here it is told, to the attacker's advantage): it tries to list the
channels, connect to the victim's socket, replace it, and forge a reply on it. Each test proves the
effect absent: no connection ever reached the victim's listener, the victim's socket is the one this
process made, and a session's next run answers exactly its own result. Peers the parent must refuse
(another uid, the right uid outside the container, the right uid in the container but not the runner)
are refused before a byte of theirs is read. And the clean-up, which removes a session's files with
that session's rights (no helper process any more), removes nobody else's through its links.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import textwrap
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from support import backend_docker

from sandboxes import Policy
from sandboxes.errors import SandboxFileError, WorkerStartError

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

UNGUARDED = Policy(python_guards=False)


@pytest.fixture(autouse=True)
def _docker() -> None:
    backend_docker.require()


@pytest.fixture(autouse=True)
def _channel_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The channel is on by default; these tests say so whatever the environment (their containers
    have settings of their own, `CHANNEL_TMP_MB`, so none started on the attach stream is taken)."""
    monkeypatch.setenv("KODEAGENT_DOCKER_CHANNEL", "socket")


CHANNEL_TMP_MB = 66


def shared(**options: Any) -> Any:
    options.setdefault("tmp_mb", CHANNEL_TMP_MB)
    options.setdefault("policy", UNGUARDED)
    options.setdefault("timeout", 30)
    options.setdefault("sessions_per_container", 4)
    return backend_docker.make_executor(**options)


def container_of(ex: Any) -> Any:
    """The `SharedContainer` behind an open executor, which must be on socket channels."""
    from sandboxes.backends.docker import shared as shared_module

    container = shared_module._LIVE[ex.container_id]
    assert container.channels is not None, "this container uses the attach stream: the test proves nothing"
    worker = ex.session.worker
    assert worker.link is not None, "this session is on the attach stream: the test proves nothing"
    return container


def docker_exec(container_id: str, code: str, user: str) -> str:
    from sandboxes.backends.docker import client

    api = client().api
    created = api.exec_create(container_id, ["python3", "-I", "-c", code], user=user)
    return str(api.exec_start(created["Id"]).decode())


def nothing_pending(listener: Any) -> bool:
    """No connection waits on `listener` (a connect that got through would queue one)."""
    listener.sock.setblocking(False)
    try:
        conn, _ = listener.sock.accept()
    except BlockingIOError:
        return True
    finally:
        listener.sock.setblocking(True)
    conn.close()
    return False


@contextlib.contextmanager
def connected_as(uid: int | None, path: str) -> Iterator[str]:
    """A forked process of this machine as `uid` (None: this process's) connected to `path`, a forged
    reply sent, alive (so its pid is its own) until the block ends; yields "connected" or the error."""
    report_r, report_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # only system calls here: the child of a threaded process
        os.close(hold_w)
        os.close(report_r)
        outcome = b"connected"
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            peer = socket.socket(socket.AF_UNIX)
            peer.connect(path)
            peer.sendall(b'{"op": "reply", "stdout": "forged"}\n')
        except OSError as exc:
            outcome = type(exc).__name__.encode()
        os.write(report_w, outcome)
        os.read(hold_r, 1)
        os._exit(0)
    os.close(report_w)
    os.close(hold_r)
    try:
        yield os.read(report_r, 100).decode()
    finally:
        os.close(hold_w)
        os.close(report_r)
        os.waitpid(pid, 0)


def connect_as(uid: int | None, path: str) -> str:
    with connected_as(uid, path) as outcome:
        return outcome


@contextlib.contextmanager
def connected_inside(container_id: str, path: str, user: str) -> Iterator[str]:
    """A process in the container (``docker exec`` as `user`) connected to `path`, alive until the
    block ends (it reads its stdin); yields what it printed once connected (or its error)."""
    from sandboxes.backends.docker import client

    code = textwrap.dedent(
        f"""
        import socket, sys
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({path!r})
            s.sendall(b'{{"op": "reply", "stdout": "forged"}}\\n')
            print('connected', flush=True)
        except OSError as exc:
            print(type(exc).__name__, flush=True)
        sys.stdin.read()
        """
    )
    api = client().api
    created = api.exec_create(container_id, ["python3", "-I", "-c", code], user=user, stdin=True)
    stream = api.exec_start(created["Id"], socket=True)
    raw = getattr(stream, "_sock", stream)
    try:
        seen = b""
        raw.settimeout(60)
        while b"\n" not in seen:
            chunk = raw.recv(4096)
            if not chunk:
                break
            seen += chunk
        yield seen.decode(errors="replace")
    finally:
        raw.close()  # its stdin ends: it exits


ATTACK = r"""
import json, os, socket, time
CHANNELS, VICTIM = '/run/kodeagent/channels', {victim!r}
victim_dir = CHANNELS + '/' + VICTIM
victim_sock = victim_dir + '/sock'
report = {{}}
def attempt(name, action):
    try:
        action()
        report[name] = 'done'
    except OSError as exc:
        report[name] = type(exc).__name__
def connect_and_forge():
    s = socket.socket(socket.AF_UNIX)
    s.connect(victim_sock)
    s.sendall(b'{{"op": "reply", "stdout": "forged"}}\n')
attempt('list_channels', lambda: os.listdir(CHANNELS))
attempt('list_victim', lambda: os.listdir(victim_dir))
attempt('stat_victim_sock', lambda: os.stat(victim_sock))
attempt('connect_and_forge', connect_and_forge)
attempt('unlink_victim_sock', lambda: os.unlink(victim_sock))
attempt('rename_victim_dir', lambda: os.rename(victim_dir, CHANNELS + '/moved'))
attempt('remove_victim_dir', lambda: os.rmdir(victim_dir))
attempt('make_dir', lambda: os.mkdir(CHANNELS + '/' + VICTIM[::-1]))
attempt('symlink_over', lambda: os.symlink('/tmp', CHANNELS + '/' + VICTIM[:-1] + 'x'))
def bind_over():
    s = socket.socket(socket.AF_UNIX)
    s.bind(CHANNELS + '/fake-sock')
attempt('bind_in_channels', bind_over)
attempt('chmod_channels', lambda: os.chmod(CHANNELS, 0o777))
# and a process left behind that keeps trying, until the clean-up kills it
if os.fork() == 0:
    os.setsid()
    while True:
        try:
            connect_and_forge()
        except OSError:
            pass
        time.sleep(0.02)
time.sleep(0.3)
print(json.dumps(report))
"""


async def test_a_session_cannot_reach_list_replace_or_forge_on_another_sessions_socket() -> None:
    from sandboxes.backends.docker.shared import SHARED_USERS

    async with shared() as a:
        container = container_of(a)
        victim_uid = SHARED_USERS.take()
        victim = container.channels.listen(victim_uid)
        try:
            inode = os.stat(os.path.join(victim.path, "sock")).st_ino
            result = await a.run(textwrap.dedent(ATTACK.format(victim=victim.name)))
            assert result.ok, result
            report = json.loads(result.stdout.strip().splitlines()[-1])
            assert set(report.values()) <= {"PermissionError", "OSError", "FileNotFoundError"}, report
            assert report["list_channels"] == "PermissionError", report
            assert report["connect_and_forge"] == "PermissionError", report
            await anyio.sleep(0.5)
            assert nothing_pending(victim), "a connection from the attacking session reached the victim"
            assert os.stat(os.path.join(victim.path, "sock")).st_ino == inode
            assert sorted(os.listdir(victim.path)) == ["sock"]
            assert sorted(os.listdir(container.channels.path)) == sorted(
                [victim.name, container.channels.token]
            )
            # the attacking session's own next run answers exactly its own result
            again = await a.run("print('a-own-result')")
            assert again.stdout == "a-own-result\n", again
            container_id = a.container_id
        finally:
            victim.close()
            SHARED_USERS.release(victim_uid)
    # the next session in that container (the left-behind process is dead by then) answers its own
    for _ in range(6):
        async with shared() as b:
            if b.container_id != container_id:
                continue
            container_of(b)
            first = await b.run("print(6 * 7)")
            assert first.stdout == "42\n", first
            assert (await b.run("print('b-' * 3)")).stdout == "b-b-b-\n"
            return
    pytest.fail("the container hosted nobody after the attacker (its clean-up was not clean?) in 6 tries")


async def test_the_parent_refuses_a_peer_that_is_not_the_sessions_runner_unread() -> None:
    from sandboxes.backends.docker.shared import SHARED_USERS

    async with shared() as a:
        container = container_of(a)
        uid = SHARED_USERS.take()
        listener = container.channels.listen(uid)
        try:
            path = os.path.join(listener.path, "sock")
            # root on this machine (the wrong uid), then the session's uid on this machine (not in
            # the container), then the session's uid inside the container (not its runner)
            inner_path = f"/run/kodeagent/channels/{listener.name}/sock"
            with (
                connected_as(None, path) as as_root,
                connected_as(uid, path) as as_uid,
                connected_inside(a.container_id, inner_path, f"{uid}:{uid}") as inside,
            ):
                assert as_root == "connected" and as_uid == "connected", (as_root, as_uid)
                assert "connected" in inside, inside
                refused = listener.refused
                with pytest.raises(WorkerStartError, match="did not connect to its channel"):
                    await anyio.to_thread.run_sync(lambda: listener.accept(runner_pid=1, timeout=3.0))
        finally:
            listener.close()
            SHARED_USERS.release(uid)
        assert len(refused) == 3, refused
        assert "uid 0" in refused[0], refused
        assert "not in the session's container" in refused[1], refused
        assert "not the session's runner" in refused[2], refused
        assert not os.path.exists(listener.path), "the session's directory outlived its listener"
        # the session itself was never disturbed
        assert (await a.run("print('still mine')")).stdout == "still mine\n"


def test_a_session_socket_is_reachable_by_its_uid_only() -> None:
    """The layout on this machine: the container's directory 0711 root's (entered, never listed),
    the session's 0700 its uid's, the socket 0600 its uid's."""
    from sandboxes.backends.docker.channel import ChannelDir

    directory = ChannelDir()
    try:
        listener = directory.listen(1_234_567)
        try:
            top = os.stat(directory.path)
            own = os.stat(listener.path)
            sock = os.stat(os.path.join(listener.path, "sock"))
            assert (top.st_mode & 0o7777, top.st_uid) == (0o711, 0)
            assert (own.st_mode & 0o7777, own.st_uid, own.st_gid) == (0o700, 1_234_567, 1_234_567)
            assert (sock.st_mode & 0o777, sock.st_uid) == (0o600, 1_234_567)
            assert connect_as(1_234_568, os.path.join(listener.path, "sock")) == "PermissionError"
            assert nothing_pending(listener)
        finally:
            listener.close()
    finally:
        directory.remove()
    assert not os.path.exists(directory.path)


LINKS = r"""
import json, os
VICTIM = {victim!r}
cwd = os.getcwd()
os.symlink(VICTIM, '/tmp/link-dir-' + {tok!r})
os.symlink(VICTIM + '/file', '/tmp/link-file-' + {tok!r})
os.symlink(VICTIM, 'to_victim')
os.symlink(VICTIM + '/file', 'to_file')
os.mkdir('deep')
os.symlink(VICTIM, 'deep/again')
os.symlink('/sessions', 'to_sessions')
os.symlink('/tmp', '/tmp/link-tmp-' + {tok!r})
try:
    os.link(VICTIM + '/file', 'hard')
    hard = 'linked'
except OSError as exc:
    hard = type(exc).__name__
print(json.dumps({{'hard': hard, 'removed': os.path.exists(VICTIM + '/file')}}))
"""

VICTIM_FILES = r"""
import os, sys
d = {victim!r}
os.makedirs(d, exist_ok=True)
os.chmod(d, 0o755)
with open(d + '/file', 'w') as f:
    f.write('victim data')
os.chmod(d + '/file', 0o644)
print('made')
"""

VICTIM_CHECK = r"""
import os
d = {victim!r}
print(open(d + '/file').read() if os.path.exists(d + '/file') else 'GONE')
"""


async def test_the_clean_up_removes_no_file_of_another_through_a_sessions_links() -> None:
    """Session A links to root's files (root: the uid the session host would remove them with, were
    it not acting as A), in /tmp and its working directory, to a directory, to a file, through a
    directory of its own; its clean-up, done with A's rights, removes A's links and leaves root's
    files as they were, and the container is proved clean (it hosts the next session)."""
    tok = secrets.token_hex(4)
    victim = f"/tmp/victim-{tok}"
    for _ in range(4):  # a container the pool had no room for is removed though clean: again
        if await links_then_next(tok, victim):
            return
    pytest.fail("no session ever followed the one with links in its container (4 tries)")


async def links_then_next(tok: str, victim: str) -> bool:
    """One try of the test above: False when the pool dropped the (clean) container."""
    from sandboxes.backends.docker import shared as shared_module

    async with shared(sessions_per_container=100) as a:
        container_id = a.container_id
        container = shared_module._LIVE[container_id]
        made = await anyio.to_thread.run_sync(
            docker_exec, container_id, VICTIM_FILES.format(victim=victim), "0:0"
        )
        assert "made" in made, made
        result = await a.run(LINKS.format(victim=victim, tok=tok))
        assert result.ok, result
    with anyio.fail_after(60):
        while container in shared_module._CLEANING:
            await anyio.sleep(0.05)
    assert not container.last_problems, f"the clean-up was not clean: {container.last_problems}"
    if container.removed:
        return False
    check = await anyio.to_thread.run_sync(
        docker_exec, container_id, VICTIM_CHECK.format(victim=victim), "0:0"
    )
    assert check.strip() == "victim data", check
    with anyio.fail_after(60):
        while not container.removed:
            async with shared(sessions_per_container=100) as b:
                if b.container_id == container_id:
                    left = await b.run(
                        f"import os; print(sorted(n for n in os.listdir('/tmp') if {tok!r} in n))"
                    )
                    assert left.stdout == f"['victim-{tok}']\n", left
                    return True
            await anyio.sleep(0.2)
    return False


async def test_with_the_attach_stream_asked_for_sessions_work_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``KODEAGENT_DOCKER_CHANNEL=attach`` (what a remote daemon gets without asking): no channels
    directory, the runner relayed by the session host on the stream, and successive sessions in one
    container still answer their own results."""
    from sandboxes.backends.docker import shared as shared_module

    monkeypatch.setenv("KODEAGENT_DOCKER_CHANNEL", "attach")
    containers = set()
    for each in range(3):
        # settings of their own (tmp_mb), so no container started on channels earlier is taken
        async with shared(tmp_mb=65) as ex:
            container = shared_module._LIVE[ex.container_id]
            assert container.channels is None and ex.session.worker.link is None
            result = await ex.run(f"print('own-{each}')")
            assert result.stdout == f"own-{each}\n", result
            containers.add(ex.container_id)
    assert len(containers) < 3, "no two sessions shared a container: the stream's relay was not exercised"


def state_of(pid: int) -> tuple[str, str]:
    """A process's state letter and kernel wait channel ("gone" once reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            letter = stat.read().rpartition(")")[2].split()[0]
        with open(f"/proc/{pid}/wchan") as wchan:
            return letter, wchan.read()
    except OSError:
        return "gone", ""


async def until(condition: Any, what: str, seconds: float = 60.0) -> None:
    with anyio.move_on_after(seconds):
        while not condition():
            await anyio.sleep(0.02)
        return
    pytest.fail(f"waited {seconds:.0f} s for {what}")


async def test_a_close_that_finds_the_runners_exit_waiting_leaves_the_host_answering() -> None:
    """A runner on its own socket ends when its channel closes, which the parent does just before
    it asks the host to close the session, so the host can wake to both at once: the close request
    first, the zygote's report of that exit second. The close takes the report; the host must not
    then wait for it again (it would never come: the host answers nobody from then on, and the next
    session's first file transfer, which goes through the host, waits for good). Here the host and
    its zygote are stopped to make that order certain: the close is sent, the runner ends, the
    zygote reports it, and only then does the host run."""
    for _ in range(4):
        if await close_then_next():
            return
    pytest.fail("the pool dropped the container after the close in 4 tries (it had no room to keep it)")


async def close_then_next() -> bool:
    """One try of the test above: False when the pool dropped the (clean) container, which a
    pool with no room for another idle one does."""
    from sandboxes.backends.docker import client
    from sandboxes.backends.docker import shared as shared_module

    stopped: list[int] = []
    try:
        async with shared() as a:
            container = container_of(a)
            container_id = a.container_id
            assert (await a.run("print('first')")).stdout == "first\n"
            init = int(client().api.inspect_container(container_id)["State"]["Pid"])
            (host,) = backend_docker.children(init)
            (zygote,) = backend_docker.children(host)
            (runner,) = backend_docker.children(zygote)
            for pid in (host, zygote):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        # closed: its channel first (the runner ends), then the close request (waiting for the host)
        await until(lambda: state_of(runner)[0] == "Z", "the runner to end")
        os.kill(zygote, signal.SIGCONT)
        await until(
            lambda: state_of(runner)[0] == "gone" and state_of(zygote)[1] == "do_epoll_wait",
            "the zygote to report the runner's exit",
        )
        os.kill(host, signal.SIGCONT)
        stopped.clear()
        await until(lambda: container not in shared_module._CLEANING, "the clean-up")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert not container.last_problems, container.last_problems
    if container.removed:
        return False
    for _ in range(6):  # the pool may hand out another idle container first
        async with shared() as b:
            if b.container_id != container_id:
                continue
            with anyio.fail_after(60):
                with pytest.raises(SandboxFileError, match="no file"):
                    await b.download("nothing-here.txt")
                await b.upload("here.txt", "kept")
                assert await b.download("here.txt") == b"kept"
            return True
    pytest.fail("the container hosted nobody after that close in 6 tries")
