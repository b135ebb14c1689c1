"""Sessions that share a warm container (`DockerExecutor(sessions_per_container=N)`) share nothing else.

A pooled container hosts up to N sessions, one at a time: so what one session could do to another is
what it LEAVES BEHIND for the next one in the same container — files in /tmp, /dev/shm, /dev/mqueue
and its working directory, processes, System V IPC objects, environment, a full /tmp — or what it
does to the session host that starts them all. Every test here runs the sessions without the
Python-level guards (`python_guards=False`: the harness semantics' mode, and what code that got past
the guards has), so only the container and the session host's clean-up separate them; every test
checks that its sessions really shared one container (the same `container_id`), or it would prove
nothing, and proves the attack's effect absent (no file read or written, no marker, no signal), not
merely that some call raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from support import backend_docker
from support.needs import require

from sandboxes import Policy, SandboxFileError

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SHARED = 4
"""Sessions per container in these tests."""
UNGUARDED = Policy(python_guards=False)
SETTLE = 0.5
"""Seconds a session waits before looking for what a process left behind would have done by then
(ten rounds of a loop that acts every 50 ms)."""


@pytest.fixture(autouse=True)
def _docker() -> None:
    backend_docker.require()


def shared(**options: Any) -> Any:
    """An unopened executor in the shared mode, without the Python-level guards."""
    options.setdefault("policy", UNGUARDED)
    options.setdefault("timeout", 20)
    options.setdefault("sessions_per_container", SHARED)
    return backend_docker.make_executor(**options)


def api() -> Any:
    from sandboxes.backends.docker import client

    return client().api


def state(container_id: str) -> dict[str, Any] | None:
    """The container's State, or None when it no longer exists."""
    import docker.errors

    try:
        found: dict[str, Any] = api().inspect_container(container_id)["State"]
        return found
    except docker.errors.NotFound:
        return None


def wait_for(predicate: Any, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


async def gone(container_id: str, seconds: float = 20.0) -> bool:
    return await anyio.to_thread.run_sync(lambda: wait_for(lambda: state(container_id) is None, seconds))


async def run_json(ex: Any, code: str) -> Any:
    """Run `code` (which prints one JSON value on its last line) and return that value."""
    result = await ex.run(code)
    assert result.ok, result
    return json.loads(result.stdout.strip().splitlines()[-1])


@contextlib.asynccontextmanager
async def next_in(container_id: str, *, recycled_ok: bool = False, **options: Any) -> AsyncIterator[Any]:
    """The next session that the pool places in `container_id` (opened, closed on exit).

    Sessions that land elsewhere are closed and another is opened, until one lands there. When the
    container is removed meanwhile (its clean-up could not prove it clean), yield None if
    `recycled_ok`, else fail: the test needed the container to be shared."""
    deadline = time.monotonic() + 30
    while True:
        if state(container_id) is None:
            if recycled_ok:
                yield None
                return
            pytest.fail(f"container {container_id[:12]} was removed instead of hosting the next session")
        ex = shared(**options)
        await ex.open()
        if ex.container_id == container_id:
            try:
                yield ex
            finally:
                await ex.close()
            return
        await ex.close()
        if time.monotonic() > deadline:
            pytest.fail(f"no session was placed in container {container_id[:12]} again within 30 s")
        await anyio.sleep(0.2)


async def in_turn(leave: Any, look: Any, **options: Any) -> tuple[Any, Any]:
    """`leave(a)` in a session A, then `look(b, left)` in the next session B that the pool places
    in A's container; returns what each gave. When A's container hosts nobody after it (it served
    its N sessions, or the pool already held enough idle ones and dropped it), start over with a
    fresh A, a few times: B must have really shared A's container, or the test proves nothing."""
    for _ in range(4):
        async with shared(**options) as a:
            left = await leave(a)
            container = a.container_id
            assert container is not None
        async with next_in(container, recycled_ok=True, **options) as b:
            if b is not None:
                return left, await look(b, left)
    pytest.fail("no session ever followed another in its container (4 tries): the shared mode did not share")


def token() -> str:
    return secrets.token_hex(6)


# ---------------------------------------------------------------------- the container is shared, then recycled


IDENTITY = r"""
import json, os
def mode(path):
    st = os.stat(path)
    return [oct(st.st_mode & 0o7777), st.st_uid, st.st_gid]
status = dict(line.split(':\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\t' in line)
try:
    os.listdir('/sessions')
    listing = 'listed'
except OSError as exc:
    listing = type(exc).__name__
print(json.dumps({
    'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(),
    'status_uid': status['Uid'].split(), 'status_gid': status['Gid'].split(),
    'cwd': os.getcwd(), 'cwd_mode': mode('.'), 'home': os.environ.get('HOME'),
    'tmpdir': os.environ.get('TMPDIR'), 'home_mode': mode(os.path.expanduser('~')),
    'sessions_mode': mode('/sessions'), 'listing': listing,
}))
"""


async def test_successive_sessions_share_a_container_until_n_then_it_is_replaced() -> None:
    """Sessions one after another until a container hosted N (at least 2N+1 of them): a container
    hosts at most N, one does reach N (the mode works at all), a container that hosted N is removed,
    and every session had its own uid, working directory and home, none of them another's to read.
    Under load a session may take another pooled container while the last one is still being
    cleaned, so the sessions rotate among the pool's containers; 8N bound that."""
    per_container: dict[str, int] = {}
    identities = []
    while len(identities) < 2 * SHARED + 1 or max(per_container.values()) < SHARED:
        assert len(identities) < 8 * SHARED, f"no container hosted {SHARED} sessions: {per_container}"
        async with shared() as ex:
            identities.append(await run_json(ex, IDENTITY))
            container = ex.container_id
            assert container is not None
        per_container[container] = per_container.get(container, 0) + 1
    assert max(per_container.values()) == SHARED, per_container
    for container, count in per_container.items():
        if count == SHARED:
            assert await gone(container), f"{container[:12]} hosted {SHARED} sessions and is still there"
    uids = [each["uid"] for each in identities]
    assert len(set(uids)) == len(uids), f"a uid served two sessions: {uids}"
    for each in identities:
        uid = each["uid"]
        assert uid >= 1_000_000 and each["gid"] == uid, each
        assert each["status_uid"] == [str(uid)] * 4 and each["status_gid"] == [str(uid)] * 4, each
        assert set(each["groups"]) <= {uid}, f"supplementary groups kept from the session host: {each}"
        assert each["cwd"].startswith("/sessions/") and each["cwd"].count("/") == 2, each
        assert each["cwd_mode"] == ["0o700", uid, uid], each
        assert each["home"] == each["tmpdir"] and each["home"].startswith("/tmp/"), each
        assert each["home_mode"] == ["0o700", uid, uid], each
        assert each["sessions_mode"] == ["0o1733", 0, 0], each
        assert each["listing"] == "PermissionError", each
    assert len({each["cwd"] for each in identities}) == len(identities)
    assert len({each["home"] for each in identities}) == len(identities)


# ---------------------------------------------------------------------- files left behind

LEAVE_FILES = r"""
import json, os, socket
TOKEN = {token!r}
made = []
def world(path, data):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o666)
    os.write(fd, data.encode())
    os.close(fd)
    os.chmod(path, 0o666)  # readable and writable by anyone: if it stayed, the next session could use it
    made.append(path)
home, tmpdir, cwd = os.path.expanduser('~'), os.environ.get('TMPDIR') or '/tmp', os.getcwd()
for place in ('/tmp', '/dev/shm', tmpdir, home, cwd):
    world(os.path.join(place, 'left-' + TOKEN), 'A-secret ' + place)
world('/tmp/.hidden-' + TOKEN, 'A-secret hidden')
os.mkdir('/tmp/dir-' + TOKEN)
os.chmod('/tmp/dir-' + TOKEN, 0o777)
world('/tmp/dir-' + TOKEN + '/inner', 'A-secret inner')
made.append('/tmp/dir-' + TOKEN)
os.link('/tmp/left-' + TOKEN, '/tmp/hardlink-' + TOKEN)
made.append('/tmp/hardlink-' + TOKEN)
os.symlink(cwd, '/tmp/symlink-' + TOKEN)
made.append('/tmp/symlink-' + TOKEN)
os.mkfifo('/tmp/fifo-' + TOKEN, 0o666)
made.append('/tmp/fifo-' + TOKEN)
unix = socket.socket(socket.AF_UNIX)
unix.bind('/dev/shm/sock-' + TOKEN)
made.append('/dev/shm/sock-' + TOKEN)
# a directory A locked itself out of, and a name that is not UTF-8 with a newline in it
os.mkdir('/tmp/locked-' + TOKEN)
world('/tmp/locked-' + TOKEN + '/f', 'A-secret locked')
os.chmod('/tmp/locked-' + TOKEN, 0)
made.append('/tmp/locked-' + TOKEN)
odd = os.fsdecode(b'/dev/shm/odd-' + TOKEN.encode() + b'\n\xff name')
world(odd, 'A-secret odd')
made += [cwd, home, tmpdir]
print(json.dumps({{'uid': os.getuid(), 'made': made}}))
"""

LOOK_FOR = r"""
import json, os
TOKEN, PATHS, UID = {token!r}, {paths!r}, {uid!r}
seen = [p for p in PATHS if os.path.lexists(p)]
readable = []
for p in seen:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)  # a FIFO must not block the look
    except OSError:
        continue
    try:
        readable.append([p, os.read(fd, 4096).decode(errors='replace')])
    except OSError:
        pass
    finally:
        os.close(fd)
owned = []
for top in ('/tmp', '/dev/shm', '/dev/mqueue'):
    try:
        names = os.listdir(top)
    except OSError:
        continue
    for name in names:
        path = os.path.join(top, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == UID or TOKEN in name:
            owned.append(path)
print(json.dumps({{'seen': seen, 'readable': readable, 'owned': owned, 'uid': os.getuid()}}))
"""


async def test_files_a_session_leaves_are_gone_for_the_next_one() -> None:
    tok = token()

    async def look(b: Any, left: Any) -> Any:
        return await run_json(b, LOOK_FOR.format(token=tok, paths=left["made"], uid=left["uid"]))

    left, found = await in_turn(lambda a: run_json(a, LEAVE_FILES.format(token=tok)), look)
    assert found["uid"] != left["uid"]
    assert found["readable"] == [], found
    assert found["seen"] == [] and found["owned"] == [], found


# ---------------------------------------------------------------------- processes left behind

# What a process left behind would do: write its pid into a marker every 50 ms, and try to write into
# every other process's working directory and /tmp (through /proc) and every directory under /tmp
# and /sessions it can name.
LOOP = r"""
import os, time
MARKER = {marker!r}
while True:
    for path in (MARKER, MARKER.replace('/tmp/', '/dev/shm/')):
        try:
            with open(path, 'w') as f:
                f.write(str(os.getpid()))
        except OSError:
            pass
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            for target in (f'/proc/{{pid}}/cwd/INTRUDED', f'/proc/{{pid}}/root/tmp/INTRUDED'):
                try:
                    with open(target, 'w') as f:
                        f.write('x')
                except OSError:
                    pass
    for top in ('/tmp', '/sessions', '/dev/shm'):
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(top, name, 'INTRUDED'), 'w') as f:
                    f.write('x')
            except OSError:
                pass
    time.sleep(0.05)
"""

LEAVE_PROCESSES = r"""
import json, os, subprocess, sys, time
TOKEN = {token!r}
LOOP = {loop!r}
markers = ['/tmp/marker-' + TOKEN + '-' + str(i) for i in range(4)]
quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
sleeper = subprocess.Popen(['sleep', '1000'], start_new_session=True, **quiet)
subprocess.Popen([sys.executable, '-c', LOOP.format(marker=markers[0])], start_new_session=True, **quiet)
# the shell's way out: nohup in the background, signals ignored
subprocess.Popen(['sh', '-c', 'trap "" HUP TERM INT; nohup ' + sys.executable + ' -c "$0" >/dev/null 2>&1 &',
                  LOOP.format(marker=markers[1])], **quiet).wait()
# a double fork with setsid: the loop's parent is gone before it starts
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open('/dev/null', os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 4096)
        exec(LOOP.format(marker=markers[2]))
    os._exit(0)
os.waitpid(child, 0)
# a loop that hops to a fresh pid every round (forks, and the parent exits): a kill by pid list misses it
HOP = 'import os, time\nwhile True:\n    if os.fork():\n        os._exit(0)\n    open(' + repr(markers[3]) + ', "w").write(str(os.getpid()))\n    time.sleep(0.05)\n'
subprocess.Popen([sys.executable, '-c', HOP], start_new_session=True, **quiet)
deadline = time.monotonic() + 10
while not all(os.path.exists(m) for m in markers) and time.monotonic() < deadline:
    time.sleep(0.05)
running = [m for m in markers if os.path.exists(m)]
print(json.dumps({{'uid': os.getuid(), 'markers': running, 'sleeper': sleeper.pid}}))
"""

LOOK_FOR_PROCESSES = r"""
import json, os, time
UID, MARKERS = {uid!r}, {markers!r}
def of_uid():
    found = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            status = open(f'/proc/{{pid}}/status').read()
        except OSError:
            continue
        fields = dict(line.split(':\t', 1) for line in status.splitlines() if ':\t' in line)
        if int(fields['Uid'].split()[0]) == UID:
            found.append([pid, fields['Name'], fields['State']])
    return found
before = of_uid()
time.sleep({settle!r})
after = of_uid()
markers = [m for m in MARKERS + [m.replace('/tmp/', '/dev/shm/') for m in MARKERS] if os.path.lexists(m)]
intruded = [p for p in (os.path.join(os.getcwd(), 'INTRUDED'), os.path.join(os.environ.get('TMPDIR', '/tmp'), 'INTRUDED'),
                        '/tmp/INTRUDED') if os.path.lexists(p)]
print(json.dumps({{'before': before, 'after': after, 'markers': markers, 'intruded': intruded, 'uid': os.getuid()}}))
"""


async def test_processes_a_session_leaves_are_gone_and_never_reach_the_next_one() -> None:
    tok = token()

    async def leave(a: Any) -> Any:
        left = await run_json(a, LEAVE_PROCESSES.format(token=tok, loop=LOOP))
        # the control: every kind of process was running, marking, when A closed
        assert len(left["markers"]) == 4, left
        return left

    async def look(b: Any, left: Any) -> Any:
        # B's own directories exist now: a survivor would write INTRUDED into them within SETTLE
        return await run_json(
            b, LOOK_FOR_PROCESSES.format(uid=left["uid"], markers=left["markers"], settle=SETTLE)
        )

    left, found = await in_turn(leave, look)
    assert found["uid"] != left["uid"]
    assert found["before"] == [] and found["after"] == [], f"processes of the previous session live: {found}"
    assert found["markers"] == [], f"a process of the previous session still writes: {found}"
    assert found["intruded"] == [], found


SIGNAL_HOST = r"""
import ctypes, json, os, signal, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def parent(pid):
    return int(dict(l.split(':\t', 1) for l in open(f'/proc/{pid}/status').read().splitlines() if ':\t' in l)['PPid'])
def cmdline(pid):
    return open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\0', b' ').decode(errors='replace')
def is_host(pid):  # the runner is a fork of the host (its command line too), but runs as the session's uid
    return 'sessionhost' in cmdline(pid) and os.stat(f'/proc/{pid}').st_uid == 0
host = os.getppid()
while host > 1 and not is_host(host):
    host = parent(host)
def attempt(call):
    try:
        outcome = call()
        if isinstance(outcome, int) and outcome < 0:  # a libc call's failure
            return os.strerror(ctypes.get_errno())
        return 'ok'
    except OSError as exc:
        return type(exc).__name__
def tries(pid):  # the attach first: SIGUSR1 ends an untraced control child, and a dying one refuses it
    return {
        'kill 0': attempt(lambda: os.kill(pid, 0)),
        'ptrace attach': attempt(lambda: libc.ptrace(16, pid, None, None)),
        'SIGSTOP': attempt(lambda: os.kill(pid, signal.SIGSTOP)),
        'SIGKILL': attempt(lambda: os.kill(pid, signal.SIGKILL)) if pid != child.pid else 'skipped',
        'SIGUSR1': attempt(lambda: os.kill(pid, signal.SIGUSR1)),
        'environ': attempt(lambda: open(f'/proc/{pid}/environ', 'rb').read() and None),
        'mem': attempt(lambda: open(f'/proc/{pid}/mem', 'rb').close()),
        'cwd': attempt(lambda: os.readlink(f'/proc/{pid}/cwd') and None),
        'fd': attempt(lambda: os.listdir(f'/proc/{pid}/fd') and None),
    }
child = subprocess.Popen(['sleep', '100'])
own = tries(child.pid)
libc.ptrace(17, child.pid, None, None)  # detach, then resume it
os.kill(child.pid, signal.SIGCONT)
child.kill()
stat = open(f'/proc/{host}/stat').read().rsplit(')', 1)[1].split()
print(json.dumps({'host': host, 'host_cmd': cmdline(host), 'host_uid': os.stat(f'/proc/{host}').st_uid,
                  'on_host': tries(host), 'on_init': tries(1), 'own': own,
                  'host_state': stat[0], 'host_start': stat[19]}))
"""


async def test_a_session_cannot_signal_or_trace_the_session_host() -> None:
    """The session host (root, with CAP_KILL) is what starts and cleans every session: one that could
    stop, kill or trace it would own the next ones. Control: the same calls on the session's own
    child succeed, so the calls themselves work here."""
    look = r"""
import json
stat = open('/proc/{host}/stat').read().rsplit(')', 1)[1].split()
print(json.dumps([stat[0], stat[19]]))
"""

    async def attack(a: Any) -> Any:
        seen = await run_json(a, SIGNAL_HOST)
        assert (await a.run("print('still here')")).stdout == "still here\n"
        return seen

    async def after(b: Any, seen: Any) -> Any:
        return await run_json(b, look.format(host=seen["host"]))

    seen, later = await in_turn(attack, after)
    assert "sessionhost" in seen["host_cmd"] and seen["host_uid"] == 0, seen
    controls = ("kill 0", "SIGSTOP", "SIGUSR1", "ptrace attach")
    assert {name: seen["own"][name] for name in controls} == dict.fromkeys(controls, "ok"), seen["own"]
    for target in ("on_host", "on_init"):
        done = {name: outcome for name, outcome in seen[target].items() if outcome == "ok"}
        assert done == {}, f"the session reached {target}: {done}"
    assert seen["host_state"] not in ("T", "t", "Z", "X"), seen
    # the same process (same start time), neither stopped nor dead, started the next session
    assert later[1] == seen["host_start"] and later[0] not in ("T", "t", "Z", "X"), later


# ---------------------------------------------------------------------- IPC and environment left behind

SYSV = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
IPC_CREAT, IPC_RMID, IPC_SET, IPC_STAT, IPC_PRIVATE = 0o1000, 0, 1, 2, 0
SETVAL = 16
SECRET = {secret!r}.encode()
KEYS = {keys!r}
class Message(ctypes.Structure):
    _fields_ = [('mtype', ctypes.c_long), ('mtext', ctypes.c_char * 64)]
def check(value, what):
    if value == -1 or value is None:
        raise OSError(ctypes.get_errno(), what + ': ' + os.strerror(ctypes.get_errno()))
    return value
def give_away(ctl, ident, *extra):
    # IPC_SET lets the owner hand the object to another uid: a clean-up by owner misses it then
    buf = ctypes.create_string_buffer(512)
    check(ctl(ident, *extra, IPC_STAT, buf), 'IPC_STAT')
    ctypes.c_uint.from_buffer(buf, 4).value = 0       # uid
    ctypes.c_uint.from_buffer(buf, 8).value = 0       # gid
    check(ctl(ident, *extra, IPC_SET, buf), 'IPC_SET')
def shm(key, away):
    ident = check(libc.shmget(key, 4096, IPC_CREAT | 0o666), 'shmget')
    addr = libc.shmat(ident, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), 'shmat')
    ctypes.memmove(addr, SECRET, len(SECRET))
    libc.shmdt(ctypes.c_void_p(addr))
    if away:
        give_away(libc.shmctl, ident)
    return ident
def msg(key, away):
    ident = check(libc.msgget(key, IPC_CREAT | 0o666), 'msgget')
    message = Message(1, SECRET)
    check(libc.msgsnd(ident, ctypes.byref(message), len(SECRET), 0), 'msgsnd')
    if away:
        give_away(libc.msgctl, ident)
    return ident
def sem(key, away):
    ident = check(libc.semget(key, 1, IPC_CREAT | 0o666), 'semget')
    check(libc.semctl(ident, 0, SETVAL, ctypes.c_int(7)), 'semctl')
    if away:
        give_away(libc.semctl, ident, 0)
    return ident
made = {{}}
for index, (kind, make) in enumerate((('shm', shm), ('msg', msg), ('sem', sem))):
    made[kind] = [make(KEYS[index], False), make(KEYS[index + 3], True), make(IPC_PRIVATE, True)]
def table(kind):
    lines = open('/proc/sysvipc/' + kind).read().splitlines()
    names = lines[0].split()
    return [dict(zip(names, line.split())) for line in lines[1:]]
print(json.dumps({{'uid': os.getuid(), 'made': made, 'tables': {{k: table(k) for k in ('shm', 'msg', 'sem')}}}}))
"""

SYSV_LOOK = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
SECRET, KEYS, IDS = {secret!r}.encode(), {keys!r}, {ids!r}
class Message(ctypes.Structure):
    _fields_ = [('mtype', ctypes.c_long), ('mtext', ctypes.c_char * 64)]
IPC_NOWAIT = 0o4000
def table(kind):
    lines = open('/proc/sysvipc/' + kind).read().splitlines()
    names = lines[0].split()
    return [dict(zip(names, line.split())) for line in lines[1:]]
tables = {{k: table(k) for k in ('shm', 'msg', 'sem')}}
found = []
for key in KEYS:
    for kind, get in (('shm', lambda: libc.shmget(key, 0, 0)), ('msg', lambda: libc.msgget(key, 0)),
                      ('sem', lambda: libc.semget(key, 0, 0))):
        if get() != -1:
            found.append([kind, key])
# whatever is listed, by id: attach it and look for the secret
for row in tables['shm']:
    addr = libc.shmat(int(row['shmid']), None, 0o10000)  # SHM_RDONLY
    if addr not in (None, ctypes.c_void_p(-1).value):
        if ctypes.string_at(addr, len(SECRET)) == SECRET:
            found.append(['read shm', row['shmid']])
        libc.shmdt(ctypes.c_void_p(addr))
for row in tables['msg']:
    message = Message()
    if libc.msgrcv(int(row['msqid']), ctypes.byref(message), 64, 0, IPC_NOWAIT) > 0 and SECRET in message.mtext:
        found.append(['read msg', row['msqid']])
for kind, ids in IDS.items():
    for ident in ids:
        probe = {{'shm': lambda: libc.shmctl(ident, 2, ctypes.create_string_buffer(512)),
                  'msg': lambda: libc.msgctl(ident, 2, ctypes.create_string_buffer(512)),
                  'sem': lambda: libc.semctl(ident, 0, 2, ctypes.create_string_buffer(512))}}[kind]
        if probe() != -1:
            found.append([kind + ' id', ident])
print(json.dumps({{'uid': os.getuid(), 'found': found, 'tables': tables}}))
"""


async def test_system_v_ipc_objects_a_session_leaves_are_gone_even_those_it_gave_away() -> None:
    secret = "A-ipc-" + token()
    keys = [secrets.randbelow(1 << 30) + 1 for _ in range(6)]

    async def look(b: Any, left: Any) -> Any:
        return await run_json(b, SYSV_LOOK.format(secret=secret, keys=keys, ids=left["made"]))

    left, seen = await in_turn(lambda a: run_json(a, SYSV.format(secret=secret, keys=keys)), look)
    # the control: A made them all, and the given-away ones now belong to root (as owner, not creator)
    for kind in ("shm", "msg", "sem"):
        rows = [row for row in left["tables"][kind] if int(row["cuid"]) == left["uid"]]
        assert len(rows) == 3, left["tables"][kind]
        assert sorted(int(row["uid"]) for row in rows) == sorted([left["uid"], 0, 0]), rows
    assert seen["uid"] != left["uid"]
    assert seen["found"] == [], seen
    for kind, rows in seen["tables"].items():
        assert [row for row in rows if int(row["cuid"]) == left["uid"]] == [], (kind, rows)


MQUEUE = r"""
import ctypes, ctypes.util, json, os
libc = ctypes.CDLL(ctypes.util.find_library('rt') or None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
NAME = {name!r}.encode()
mq = libc.mq_open(NAME, os.O_CREAT | os.O_RDWR, 0o666, None)
if mq < 0:
    print(json.dumps({{'made': False, 'errno': ctypes.get_errno(), 'listed': os.listdir('/dev/mqueue')}}))
else:
    message = b'A-mqueue-secret'
    sent = libc.mq_send(mq, message, len(message), 0)
    os.chmod('/dev/mqueue' + NAME.decode(), 0o666)
    print(json.dumps({{'made': True, 'sent': sent, 'listed': os.listdir('/dev/mqueue')}}))
"""

MQUEUE_LOOK = r"""
import ctypes, ctypes.util, json, os
libc = ctypes.CDLL(ctypes.util.find_library('rt') or None, use_errno=True)
NAME = {name!r}.encode()
mq = libc.mq_open(NAME, os.O_RDONLY | os.O_NONBLOCK)
content = None
if mq >= 0:
    buffer = ctypes.create_string_buffer(8192)
    got = libc.mq_receive(mq, buffer, 8192, None)
    content = buffer.raw[:max(got, 0)].decode(errors='replace')
print(json.dumps({{'opened': mq >= 0, 'errno': ctypes.get_errno(), 'content': content,
                  'listed': os.listdir('/dev/mqueue'), 'uid': os.getuid()}}))
"""


async def test_posix_message_queues_a_session_leaves_are_gone() -> None:
    name = f"/kodeagent-left-{token()}"
    made, seen = await in_turn(
        lambda a: run_json(a, MQUEUE.format(name=name)),
        lambda b, _: run_json(b, MQUEUE_LOOK.format(name=name)),
    )
    if made["made"]:
        assert made["sent"] == 0 and name[1:] in made["listed"], made
    else:  # no session can make one here (/dev/mqueue refused): then none can be left either
        assert made["errno"] in (13, 38, 1), made  # EACCES, ENOSYS, EPERM
    assert not seen["opened"] and seen["content"] is None, seen
    assert name[1:] not in seen["listed"], seen


async def test_the_environment_and_interpreter_state_of_a_session_do_not_reach_the_next() -> None:
    tok = token()
    leave = (
        "import builtins, json, os, sys, types\n"
        f"os.environ['KODEAGENT_LEFT'] = {tok!r}\n"
        f"os.putenv('KODEAGENT_PUT', {tok!r})\n"
        f"os.environ['PATH'] = '/tmp/evil-{tok}:' + os.environ.get('PATH', '')\n"
        f"os.environ['PYTHONPATH'] = '/tmp/evil-{tok}'\n"
        f"builtins.KODEAGENT_LEFT = {tok!r}\n"
        f"sys.modules['kodeagent_left'] = types.ModuleType('kodeagent_left')\n"
        f"sys.path.insert(0, '/tmp/evil-{tok}')\n"
        f"json.dumps = lambda *a, **k: {tok!r}\n"
        "print('[1]')\n"
    )
    look = (
        "import builtins, json, os, sys\n"
        "import subprocess\n"
        "print(json.dumps({'environ': dict(os.environ), 'child': subprocess.run(['env'], capture_output=True, text=True).stdout,\n"
        "  'builtin': getattr(builtins, 'KODEAGENT_LEFT', None), 'module': 'kodeagent_left' in sys.modules,\n"
        "  'path': sys.path}))\n"
    )
    made, result = await in_turn(lambda a: run_json(a, leave), lambda b, _: b.run(look))
    assert made == [1]
    assert result.ok, result
    assert tok not in result.stdout, f"the previous session's state reached this one: {result.stdout}"
    seen = json.loads(result.stdout)
    assert seen["builtin"] is None and seen["module"] is False, seen
    assert "KODEAGENT_LEFT" not in seen["environ"] and "KODEAGENT_PUT" not in seen["environ"], seen


# A session finds its own memory by reading it (its address space is its own): every readable
# private mapping, searched for PREFIX and a candidate after it whose hash is the other session's
# secret. The code never holds the secret itself, only its hash.
SCAN_MEMORY = r"""
import ctypes, hashlib, json
PREFIX, LENGTH, WANTED = {prefix!r}.encode(), {length!r}, set({hashes!r})
found, scanned = [], 0
for line in open('/proc/self/maps'):
    fields = line.split()
    span, perms = fields[0], fields[1]
    name = fields[5] if len(fields) > 5 else ''
    if not perms.startswith('rw') or name.startswith('[v') or (name and not name.startswith('[heap')):
        continue  # anonymous and heap memory: where a parent's buffers would be
    start, end = (int(x, 16) for x in span.split('-'))
    data = ctypes.string_at(start, end - start)
    scanned += len(data)
    at = data.find(PREFIX)
    while at >= 0:
        candidate = data[at:at + LENGTH]
        if hashlib.sha256(candidate).hexdigest() in WANTED:
            found.append(candidate.decode(errors='replace')[:12])
        at = data.find(PREFIX, at + 1)
print(json.dumps({{'found': found, 'scanned': scanned}}))
"""


async def test_a_session_finds_nothing_of_the_previous_one_in_its_own_memory() -> None:
    """Each runner is forked from the session host, so it starts with a copy of the host's memory;
    the host relayed the previous session's code, output and uploads. None of that may be in it.
    Control: the session finds its own secret in its memory the same way."""
    import hashlib

    prefix = "KDLEAK-"
    secrets_of_a = {
        kind: prefix + kind + "-" + secrets.token_hex(16) for kind in ("cod", "out", "upl", "own")
    }
    length = len(secrets_of_a["cod"])
    hashes = {kind: hashlib.sha256(value.encode()).hexdigest() for kind, value in secrets_of_a.items()}

    async def leave(a: Any) -> None:
        await a.upload("secret.txt", (secrets_of_a["upl"] + "\n") * 64)
        ran = await a.run(f"kept = {secrets_of_a['cod']!r}\nprint({secrets_of_a['out']!r} * 8)")
        assert ran.ok, ran
        assert (await a.download("secret.txt")).startswith(secrets_of_a["upl"].encode())
        # the control: the scan finds a secret this session holds
        own = await run_json(
            a,
            f"mine = {secrets_of_a['own'][:-1]!r} + {secrets_of_a['own'][-1]!r}\n"
            + SCAN_MEMORY.format(prefix=prefix, length=length, hashes=[hashes["own"]]),
        )
        assert own["found"], own

    async def look(b: Any, _: None) -> Any:
        return await run_json(
            b, SCAN_MEMORY.format(prefix=prefix, length=length, hashes=list(hashes.values()))
        )

    _, seen = await in_turn(leave, look)
    assert seen["scanned"] > 1 << 20, seen
    assert seen["found"] == [], f"the previous session's data is in this one's memory: {seen}"


FILL = r"""
import json, os
def free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
before = {'/tmp': free('/tmp'), '/dev/shm': free('/dev/shm')}
chunk = b'x' * (1 << 20)
for place in ('/tmp', os.environ.get('TMPDIR', '/tmp'), '/dev/shm'):
    for index in range(10000):
        try:
            with open(os.path.join(place, f'fill-{index}'), 'ab') as f:
                for _ in range(8):
                    f.write(chunk)
        except OSError:
            break
after = {'/tmp': free('/tmp'), '/dev/shm': free('/dev/shm')}
print(json.dumps({'before': before, 'after': after}))
"""

WRITE_16MB = r"""
import json, os
def free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
room = {'/tmp': free('/tmp'), '/dev/shm': free('/dev/shm')}
written = {}
for place in (os.environ.get('TMPDIR', '/tmp'), '/dev/shm', '/tmp'):
    path = os.path.join(place, 'mine-' + str(len(written)))
    with open(path, 'wb') as f:
        f.write(b'y' * (16 << 20))
    written[place] = os.path.getsize(path)
    os.remove(path)
print(json.dumps({'room': room, 'written': written}))
"""


async def test_a_session_that_fills_tmp_and_shm_leaves_the_next_one_its_space() -> None:
    filled, room = await in_turn(lambda a: run_json(a, FILL), lambda b, _: run_json(b, WRITE_16MB))
    for place in ("/tmp", "/dev/shm"):
        assert filled["after"][place] < (1 << 20), f"the control did not fill {place}: {filled}"
    for place in ("/tmp", "/dev/shm"):
        assert room["room"][place] >= 0.9 * filled["before"][place], room
    assert sorted(room["written"].values()) == [16 << 20] * 3, room


# ---------------------------------------------------------------------- clean-up that cannot prove the container clean


async def test_a_session_host_killed_from_outside_recycles_the_container_and_the_session_recovers() -> None:
    find_host = (
        "import json, os\n"
        "def parent(pid):\n"
        "    return int(dict(l.split(':\\t', 1) for l in open(f'/proc/{pid}/status').read().splitlines() if ':\\t' in l)['PPid'])\n"
        "def is_host(pid):\n"
        "    return b'sessionhost' in open(f'/proc/{pid}/cmdline', 'rb').read() and os.stat(f'/proc/{pid}').st_uid == 0\n"
        "host = os.getppid()\n"
        "while host > 1 and not is_host(host):\n"
        "    host = parent(host)\n"
        "print(json.dumps(host))\n"
    )
    async with shared(timeout=10) as ex:
        await ex.run("x = 1")
        container = ex.container_id
        host = await run_json(ex, find_host)
        assert host > 1
        done = await anyio.to_thread.run_sync(
            lambda: api().exec_start(api().exec_create(container, ["sh", "-c", f"kill -9 {host}"], user="0"))
        )
        assert done == b"", done

        def stopped() -> bool:  # the host ends its container once its zygote or itself is gone
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if not api().inspect_container(container)["State"]["Running"]:
                    return True
                time.sleep(0.05)
            return False

        assert await anyio.to_thread.run_sync(stopped), "the container outlived its session host"
        result = await ex.run("print('x' in dir())")
        assert result.state_lost, result
        assert result.stdout == "False\n" or result.error is not None, result
        after = await ex.run("print(2)")
        assert after.stdout == "2\n" and after.ok, after
        assert ex.container_id != container
    assert await gone(container), "the container whose session host died is still there"


async def test_a_file_the_clean_up_cannot_remove_gets_the_container_removed() -> None:
    """No unprivileged session can make a file its own uid cannot remove (no CAP_LINUX_IMMUTABLE,
    no mount, no chown; the paths past PATH_MAX, locked directories and odd names of the tests
    above are all removable), so the failing clean-up is made from outside: a tmpfs mounted, by
    this machine's root in the container's mount namespace (``nsenter``: a privileged ``docker
    exec`` needs every capability, which root here may lack), on a directory of the session's.
    A mount point cannot be removed; the container must go rather than host another session."""
    reason = (
        None if os.geteuid() == 0 and shutil.which("nsenter") else "needs root and nsenter on this machine"
    )
    require(reason, "placing a mount point in a session's directory")
    async with shared() as a:
        where = await run_json(
            a,
            "import json, os\nos.mkdir('pinned')\nos.mkdir(os.environ['TMPDIR'] + '/pinned')\n"
            "print(json.dumps([os.getuid(), os.getcwd() + '/pinned', os.environ['TMPDIR'] + '/pinned']))",
        )
        container = a.container_id
        uid, pinned_work, pinned_tmp = where
        script = (
            f"mount -t tmpfs -o size=1m kodeagent-pin {pinned_work} && mount -t tmpfs -o size=1m kodeagent-pin {pinned_tmp}"
            f" && chown {uid}:{uid} {pinned_work} {pinned_tmp} && echo mounted"
        )

        def pin() -> subprocess.CompletedProcess[str]:
            pid = str(api().inspect_container(container)["State"]["Pid"])
            return subprocess.run(
                ["nsenter", "-t", pid, "-m", "sh", "-c", script], capture_output=True, text=True, timeout=30
            )

        pinned = await anyio.to_thread.run_sync(pin)
        assert pinned.stdout == "mounted\n", pinned
        check = await run_json(
            a,
            f"import json, os\nprint(json.dumps([os.path.ismount({pinned_work!r}), os.stat({pinned_tmp!r}).st_uid]))",
        )
        assert check == [True, uid], check
    assert await gone(container), "the clean-up could not remove a mount point, yet the container was kept"


HOSTILE_LEFTOVERS = (
    LEAVE_FILES
    + r"""
import subprocess, sys
# deeper than PATH_MAX (4096), in /tmp and in the working directory: a clean-up that walks by full
# path names cannot reach the bottom
back = os.open('.', os.O_RDONLY)
for top in ('/tmp/deep-' + TOKEN, os.path.join(cwd, 'deep')):
    os.mkdir(top)
    os.chdir(top)
    for _ in range(40):
        os.mkdir('d' * 200)
        os.chdir('d' * 200)
    open('bottom', 'w').write('A-secret deep')
    os.fchdir(back)
os.close(back)
# and a pid-hopping process that keeps recreating a file while the clean-up runs
HOP = 'import os, time\nwhile True:\n    if os.fork():\n        os._exit(0)\n    open("/tmp/hop-' + TOKEN + '", "w").write(str(os.getpid()))\n    time.sleep(0.01)\n'
subprocess.Popen([sys.executable, '-c', HOP], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""
)


async def test_hard_leftovers_end_in_a_clean_container_or_a_recycled_one() -> None:
    """Paths past PATH_MAX, a locked directory, a non-UTF-8 name with a newline, a process hopping
    pids while it recreates a file: the next session in the container finds none of it, or the
    container was removed (its clean-up could not prove it clean): never a container kept dirty."""
    tok = token()
    async with shared() as a:
        result = await a.run(HOSTILE_LEFTOVERS.format(token=tok) + "\nimport time\ntime.sleep(0.3)\n")
        assert result.ok, result
        left = json.loads(result.stdout.strip().splitlines()[0])
        container = a.container_id
    paths = [*left["made"], f"/tmp/hop-{tok}", f"/tmp/deep-{tok}"]
    async with next_in(container, recycled_ok=True) as b:
        if b is None:
            assert await gone(container)
            return
        found = await run_json(b, LOOK_FOR.format(token=tok, paths=paths, uid=left["uid"]))
        await anyio.sleep(SETTLE)
        again = await run_json(b, LOOK_FOR.format(token=tok, paths=paths, uid=left["uid"]))
    assert found["seen"] == [] and found["owned"] == [] and found["readable"] == [], found
    assert again["seen"] == [] and again["owned"] == [], again


# ---------------------------------------------------------------------- files API and limits


async def test_uploads_never_follow_a_session_symlink_out_of_its_workdir() -> None:
    tok = token()
    outside_file, planted = f"/tmp/outside-{tok}", f"planted-{tok}"
    async with shared() as ex:
        made = await ex.run(
            "import os\n"
            f"open({outside_file!r}, 'w').write('ORIGINAL')\nos.chmod({outside_file!r}, 0o666)\n"
            f"os.symlink({outside_file!r}, 'to_file')\nos.symlink('/tmp', 'to_tmp')\n"
            "os.symlink('/sessions', 'to_sessions')\nos.symlink('/', 'to_root')\n"
            "os.symlink('..', 'to_parent')\nos.mkdir('sub')\nos.symlink('/tmp', 'sub/deeper')\n"
            "print('made')"
        )
        assert made.ok and made.stdout == "made\n", made
        uploads = {
            "to_file": "to_file",
            "to_tmp": f"to_tmp/{planted}",
            "to_sessions": f"to_sessions/{planted}",
            "to_root": f"to_root/tmp/{planted}",
            "to_parent": f"to_parent/{planted}",
            "sub/deeper": f"sub/deeper/{planted}",
        }
        accepted = []
        for link, path in uploads.items():
            try:
                await ex.upload(path, b"PLANTED")
            except SandboxFileError:
                continue
            accepted.append(link)
        check = (
            "import json, os\n"
            f"print(json.dumps({{'outside': open({outside_file!r}).read(),\n"
            f"  'planted': [p for p in ('/tmp/{planted}', '/sessions/{planted}', os.path.dirname(os.getcwd()) + '/{planted}')\n"
            "      if os.path.lexists(p)],\n"
            f"  'links': {{name: os.path.islink(name) for name in {list(uploads)!r}}}}}))\n"
        )
        seen = await run_json(ex, check)
    assert seen["outside"] == "ORIGINAL", seen
    assert seen["planted"] == [], f"an upload followed a link out of the working directory: {seen}"
    # an upload that was accepted replaced the link by a file inside the workdir, never wrote through it
    for link in accepted:
        assert not seen["links"][link], (link, seen)


FLIP = r"""
import os, shutil, subprocess, sys
TARGET = {target!r}
os.mkdir(TARGET)
os.chmod(TARGET, 0o777)
FLIPPER = '''
import os, shutil
while not os.path.exists('stop'):
    try:
        if os.path.islink('flip'):
            os.unlink('flip')
            os.mkdir('flip')
        elif os.path.isdir('flip'):
            shutil.rmtree('flip')
            os.symlink({target!r}, 'flip')
        else:
            os.mkdir('flip')
    except OSError:
        pass
'''
flipper = subprocess.Popen([sys.executable, '-c', FLIPPER])
print(flipper.pid)
"""


async def test_uploads_racing_a_symlink_swap_never_land_outside() -> None:
    """A process of the session turns `flip` from a directory into a link out and back, again and
    again, while the parent uploads `flip/...`: a check-then-write placement would sometimes follow."""
    target = f"/tmp/target-{token()}"
    async with shared() as ex:
        started = await ex.run(FLIP.format(target=target))
        assert started.ok, started
        for index in range(40):
            try:
                await ex.upload(f"flip/raced-{index}", b"RACED")
            except SandboxFileError:
                pass
        seen = await run_json(
            ex,
            "import json, os, time\nopen('stop', 'w').close()\ntime.sleep(0.2)\n"
            f"print(json.dumps(sorted(os.listdir({target!r}))))",
        )
    assert seen == [], f"uploads landed in the link's target outside the working directory: {seen}"


async def test_memory_rlimit_gives_memory_error_inside_the_container_limit() -> None:
    """Per-session bound: RLIMIT_AS is the policy's memory, below the container's cgroup memory, so a
    greedy session gets MemoryError (its state kept) and the container's OOM killer never picks a
    victim among the host's processes."""
    from sandboxes import Limits

    policy = UNGUARDED.model_copy(update={"limits": Limits(memory_mb=256)})
    async with shared(policy=policy) as ex:
        await ex.run("keep = 41")
        container = ex.container_id
        limits = await run_json(
            ex,
            "import json, resource\nprint(json.dumps([resource.getrlimit(resource.RLIMIT_AS)[0],\n"
            "  int(open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read())]))",
        )
        # the runner's address-space reserve (to report the run) comes on top of the policy's memory
        assert 256 << 20 <= limits[0] <= 320 << 20 and limits[1] > limits[0], limits
        result = await ex.run("blob = b'a' * (400 << 20)")
        assert result.error is not None and result.error.type == "MemoryError", result
        assert result.oom and not result.state_lost, result  # the runner's MemoryError: its state is kept
        after = await ex.run("print(keep + 1)")
        assert after.stdout == "42\n" and ex.container_id == container, after


# ---------------------------------------------------------------------- nothing left behind by the executor

CHILD = textwrap.dedent(
    """
    import json, os, sys, anyio
    sys.path.insert(0, {tests!r})
    from support import backend_docker

    async def main():
        seen = []
        for _ in range({sessions}):
            async with backend_docker.make_executor(timeout=20, sessions_per_container={shared}) as ex:
                await ex.run("x = 1")
                seen.append(ex.container_id)
        print(json.dumps(seen), flush=True)
        sys.stdin.readline()  # the parent looks now
        {then}

    anyio.run(main)
    """
)


def owned_by(pid: int) -> list[dict[str, Any]]:
    """Sandbox containers (running or not) whose owner label names process `pid`."""
    from sandboxes.images import LABEL_OWNER, LABEL_SANDBOX

    found = api().containers(all=True, filters={"label": f"{LABEL_SANDBOX}=1"})
    return [c for c in found if (c.get("Labels") or {}).get(LABEL_OWNER, "").split(":")[1:2] == [str(pid)]]


def start_child(then: str) -> tuple[subprocess.Popen[str], list[str]]:
    code = CHILD.format(tests=os.path.join(ROOT, "tests"), sessions=2 * SHARED + 1, shared=SHARED, then=then)
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline().strip()
    if not line:
        child.wait(timeout=30)
        pytest.fail(f"the child did not run its sessions:\n{child.stderr.read()[-3000:]}")
    return child, json.loads(line)


async def test_no_container_outlives_the_process_that_used_the_shared_pool() -> None:
    child, seen = await anyio.to_thread.run_sync(start_child, "")
    try:
        # a container that hosted its N sessions goes at once; the others wait warm in the pool
        full = [c for c in set(seen) if seen.count(c) == SHARED]
        assert full, seen
        for container in full:
            assert await gone(container), container
    finally:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.flush()
        await anyio.to_thread.run_sync(lambda: child.wait(timeout=60))
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""
    # removed at its exit, synchronously: a short wait only (another process's sweep of dead owners'
    # containers would hide a leak given longer)
    assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: owned_by(child.pid) == [], 2)), owned_by(
        child.pid
    )


async def test_shared_containers_of_a_killed_parent_stop_and_cleanup_removes_them() -> None:
    from sandboxes.images import cleanup

    child, seen = await anyio.to_thread.run_sync(start_child, "os.kill(os.getpid(), 9)")
    assert child.stdin is not None
    child.stdin.write("\n")
    child.stdin.flush()
    assert await anyio.to_thread.run_sync(lambda: child.wait(timeout=30)) == -signal.SIGKILL
    left = await anyio.to_thread.run_sync(owned_by, child.pid)
    assert left, "the child's pool had warm containers; none were found to watch"
    # no atexit ran: the session hosts read end-of-file on their closed stdin and exit, so nothing runs
    stopped = await anyio.to_thread.run_sync(
        lambda: wait_for(
            lambda: all(not (state(c["Id"]) or {}).get("Running") for c in owned_by(child.pid)), 20
        )
    )
    assert stopped, [(c["Id"][:12], c["State"]) for c in owned_by(child.pid)]
    removed = await anyio.to_thread.run_sync(lambda: cleanup(progress=lambda _m: None))
    assert {c["Id"] for c in left} <= set(removed)
    assert await anyio.to_thread.run_sync(owned_by, child.pid) == []
