"""Host-backend specifics: isolation levels, the warm pool, the sync facade, option errors."""

from __future__ import annotations

import os
import subprocess

import pytest
from support.backend_host import tmp_left_open
from support.needs import require

from sandboxes import HostExecutor, Policy, UnknownBackend, open_executor, open_executor_sync
from sandboxes.backends.host import namespaces_available

pytestmark = pytest.mark.anyio


def test_sync_facade_runs_code_and_keeps_state():
    with open_executor_sync("host", timeout=10) as ex:
        ex.run("x = 20")
        result = ex.run("print(x + 22)")
        ex.upload("note.txt", "hello")
        data = ex.download("note.txt")
    assert result.stdout == "42\n"
    assert data == b"hello"


def test_unknown_backend_and_bad_options_raise():
    with pytest.raises(UnknownBackend, match="host, docker, e2b"):
        open_executor("vm")
    with pytest.raises(TypeError, match="memroy_mb"):
        HostExecutor(memroy_mb=5)
    with pytest.raises(ValueError, match="timeout"):
        HostExecutor(timeout=0)
    with pytest.raises(ValueError, match="isolation"):
        HostExecutor(isolation="vm")


async def test_namespace_level_hides_the_host():
    require(None if namespaces_available() else "bubblewrap cannot create namespaces here", "namespaces")
    # files="any" switches the audit-hook file guard off, so only the namespace layer is tested.
    policy = Policy(allowed_imports=["os"], files="any")
    async with HostExecutor(policy=policy, timeout=10) as ex:
        assert ex.isolation == "namespaces"
        result = await ex.run(
            "import os\n"
            "pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
            "print(sorted(pids))\n"
            "print(os.getuid() != 0)\n"  # an unprivileged user
            "print(sorted(os.listdir('/')))"  # a minimal view of the system
        )
    assert result.ok, result.error
    pids_line, unprivileged, root_listing = result.stdout.splitlines()
    visible = eval(pids_line)  # a list of ints printed by the sandbox
    assert os.getpid() not in visible and len(visible) < 50  # its own PID namespace, not the host's
    assert unprivileged == "True"
    assert "home" not in root_listing


async def test_temporary_files_land_in_the_working_directory_where_tmp_is_closed():
    require(tmp_left_open(), "a /tmp closed to sessions")
    guarded = Policy(allowed_imports=["os", "os.path", "tempfile"])
    unguarded = Policy(python_guards=False)
    for policy in (guarded, unguarded):
        async with HostExecutor(isolation="namespaces", timeout=10, policy=policy) as ex:
            result = await ex.run(
                "import os, tempfile\n"
                "fd, made = tempfile.mkstemp()\n"
                "os.close(fd)\n"
                "with tempfile.TemporaryDirectory() as d:\n"
                "    inside = os.path.dirname(d)\n"
                "here = os.getcwd()\n"
                "print(os.access('/tmp', os.W_OK), os.path.dirname(made) == here, inside == here,"
                " os.environ['TMPDIR'] == here)"
            )
            assert result.ok, result.error
            assert result.stdout == "False True True True\n"
    async with HostExecutor(isolation="namespaces", timeout=10, policy=unguarded) as ex:
        shell = await ex.run(
            "import os, subprocess\n"
            "made = subprocess.run(['mktemp'], capture_output=True, text=True, check=True).stdout\n"
            "print(os.path.dirname(made.strip()) == os.getcwd())"
        )
    assert shell.stdout == "True\n", shell.error  # a program the code starts finds it too


async def test_a_tmpdir_the_caller_set_is_kept():
    require(tmp_left_open(), "a /tmp closed to sessions")
    policy = Policy(allowed_imports=["os"])
    async with HostExecutor(
        isolation="namespaces", timeout=10, env={"TMPDIR": "/nowhere"}, policy=policy
    ) as ex:
        result = await ex.run("import os\nprint(sorted(os.environ.items()))")
    assert result.stdout == "[('TMPDIR', '/nowhere')]\n", result.error


async def test_process_level_drops_root_when_the_interpreter_is_reachable():
    import sys

    from sandboxes.backends.host.process import _path_is_world_traversable

    policy = Policy(allowed_imports=["os"])
    async with HostExecutor(policy=policy, timeout=10, isolation="process") as ex:
        result = await ex.run("import os\nprint(os.getuid())")
    assert ex.isolation == "process"
    expect_private_user = os.getuid() == 0 and _path_is_world_traversable(sys.executable)
    assert (int(result.stdout) >= 200_000) == expect_private_user


async def test_explicit_workdir_is_used_and_kept(tmp_path):
    (tmp_path / "input.txt").write_text("5")
    async with HostExecutor(timeout=10, workdir=str(tmp_path)) as ex:
        result = await ex.run("n = int(open('input.txt').read())\nopen('double.txt', 'w').write(str(2 * n))")
    assert result.ok, result.error
    assert (tmp_path / "double.txt").read_text() == "10"


async def test_workdir_at_shows_the_workdir_at_that_path_under_namespaces(tmp_path):
    require(None if namespaces_available() else "bubblewrap cannot create namespaces here", "namespaces")
    (tmp_path / "in.txt").write_text("given")
    policy = Policy(allowed_imports=("os",), files="any")
    async with HostExecutor(timeout=10, workdir=str(tmp_path), workdir_at="/home/user", policy=policy) as ex:
        result = await ex.run(
            "import os\nopen('/home/user/out.txt', 'w').write(open('/home/user/in.txt').read())\nos.getcwd()"
        )
    assert result.ok, result.error
    assert result.value == "/home/user"
    assert (tmp_path / "out.txt").read_text() == "given"  # the literal path is the workdir itself


async def test_workdir_at_at_the_process_level_leaves_the_workdir_where_it_is(tmp_path):
    policy = Policy(allowed_imports=("os",), files="any")
    async with HostExecutor(
        timeout=10, workdir=str(tmp_path), workdir_at="/home/user", isolation="process", policy=policy
    ) as ex:
        result = await ex.run("import os\nos.getcwd()")
    assert result.ok, result.error
    assert os.path.realpath(result.value) == os.path.realpath(tmp_path)


def test_workdir_at_needs_a_workdir_and_an_absolute_path(tmp_path):
    with pytest.raises(ValueError, match="give workdir= too"):
        HostExecutor(workdir_at="/home/user")
    for bad in ("home/user", "/", "/home/../etc", "/home/user/"):
        with pytest.raises(ValueError, match="absolute, normalised"):
            HostExecutor(workdir=str(tmp_path), workdir_at=bad)


@pytest.mark.parametrize("isolation", ["process", "auto"])
async def test_close_leaves_no_worker_process(isolation):
    # close() hands the worker to the reaper thread and returns; wait_closed() waits for the reap.
    async with HostExecutor(timeout=10, pool=False, isolation=isolation) as ex:
        await ex.run("print(1)")
        worker = ex.session.worker
        pid, uid = worker.pid, worker.uid
    await ex.wait_closed()
    assert worker.reaped.is_set()
    if worker.isolation == "process":
        assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0
    elif uid is None:  # a namespaced fork-server child is found only by its private user (as root)
        pytest.skip("not root: a namespaced worker has no private user to look for")
    if uid is not None:
        owners = {entry.stat().st_uid for entry in os.scandir("/proc") if entry.name.isdigit()}
        assert uid not in owners


async def test_namespaces_alone_hide_host_files_from_native_code():
    require(None if namespaces_available() else "bubblewrap cannot create namespaces here", "namespaces")
    # files="any" switches the audit-hook file guard off, so only the namespace layer is tested.
    pytest.importorskip("numpy")
    assert os.path.exists("/etc/hostname")
    policy = Policy(allowed_imports=["numpy", "numpy.*"], files="any")
    code = "import numpy as np\ntry:\n    print(len(np.fromfile('/etc/hostname', dtype='uint8')))\nexcept OSError as exc:\n    print(type(exc).__name__)"
    async with HostExecutor(policy=policy, timeout=20) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert result.stdout == "FileNotFoundError\n"


async def test_preloaded_modules_are_imported_once_and_each_session_has_its_own_copy(tmp_path):
    module = tmp_path / "shared_helpers.py"
    module.write_text(
        "import os\nLOADED_BY = os.getpid()\ncalls = []\ndef note(x):\n    calls.append(x)\n    return len(calls)\n"
    )
    allowed = Policy(allowed_imports=["shared_helpers"])
    seen = []
    for _ in range(3):
        async with HostExecutor(timeout=10, preload=[module], policy=allowed) as ex:
            seen.append(
                (
                    await ex.run(
                        "import shared_helpers\nprint(shared_helpers.note('x'), shared_helpers.LOADED_BY)"
                    )
                ).stdout
            )
    async with HostExecutor(timeout=10, preload=[module]) as guarded:
        refused = await guarded.run("import shared_helpers")
    counts = {line.split()[0] for line in seen}
    loaders = {line.split()[1] for line in seen}
    assert counts == {"1"}  # a session's changes to the module never reach the next session
    assert len(loaders) == 1  # imported once, by the fork server, before the sessions were forked
    assert refused.error is not None and refused.error.type == "PolicyViolation"  # the allowlist still rules
    with pytest.raises(ValueError, match="name.py"):
        HostExecutor(preload=[tmp_path / "not-a-module.txt"])


async def test_a_preload_file_edited_between_executors_is_staged_again(tmp_path):
    # staging is cached by the file's identity and change times: an edit must not serve the old copy
    module = tmp_path / "edited_helpers.py"
    allowed = Policy(allowed_imports=["edited_helpers"])
    versions = []
    for version in ("first", "second-and-longer", "third"):
        module.write_text(f"VERSION = {version!r}\n")
        async with HostExecutor(timeout=10, preload=[module], policy=allowed) as ex:
            versions.append((await ex.run("import edited_helpers\nprint(edited_helpers.VERSION)")).stdout)
    assert versions == ["first\n", "second-and-longer\n", "third\n"]
    module.unlink()
    with pytest.raises(ValueError, match="cannot read"):
        HostExecutor(preload=[module])


def _processes_of(uid: int) -> list[int]:
    """Every host process one of whose uids (real, effective, saved) is `uid` (read from its status,
    not from its /proc entry's owner, which the kernel may give to root for a non-dumpable one)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as handle:
                uids = next(line for line in handle if line.startswith("Uid:")).split()[1:4]
        except (OSError, StopIteration):
            continue
        if str(uid) in uids:
            found.append(int(entry.name))
    return found


ESCAPEE = """
import ctypes, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        time.sleep(60)
    os._exit(0)
time.sleep(0.3)
"""


async def test_a_pooled_session_leaves_no_process_of_its_user_even_non_dumpable_setsid_ones():
    """A fork-server child under namespaces is ended by its private user alone (swept among the fork
    server's namespace): the sweep must find a double-forked, `setsid`, non-dumpable grandchild."""
    require(
        None if namespaces_available() and os.getuid() == 0 else "needs bubblewrap namespaces and root",
        "the private-user sweep test",
    )
    async with HostExecutor(timeout=10, policy=Policy(python_guards=False)) as ex:
        result = await ex.run(ESCAPEE)
        assert result.ok, result.error
        uid = ex.session.worker.uid
        assert uid is not None
        assert len(_processes_of(uid)) >= 2, "control: the runner and the escaped grandchild run"
    await ex.wait_closed()
    assert _processes_of(uid) == []
