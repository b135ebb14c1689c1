"""Files outside the working directory: what the attack corpus cannot say.

The routes themselves (`..`, absolute paths, symlinks, `/proc/self/cwd`, `chdir`, pathlib, shutil,
io.FileIO, os.open, rename, `dir_fd=`, device nodes...) are entries of `benchmarks/corpus/files.toml`,
run on every backend by `tests/conformance/test_attacks.py`. What stays here needs more than one
snippet in one session: the session's file API (uploads and downloads never follow a symlink out,
nor hang on a FIFO), code that acts after its run returned (a thread, a finalizer run by `reset()`
or by a later collection: the test waits, resets and runs again before it looks), the artifacts a
run reports, and a host fact that holds with every Python-level guard opened up (`files="any"`).
"""

from __future__ import annotations

import os
import pathlib
import sys
import uuid

import pytest
from support.security_helpers import HOST_BACKENDS, assert_usable, policy

from sandboxes import SandboxFileError

pytestmark = pytest.mark.anyio

FILE_MODULES = ("os", "os.path", "pathlib", "shutil", "io", "stat", "threading", "time", "atexit")


@pytest.fixture
def places(backend: str, tmp_path: pathlib.Path) -> dict[str, str]:
    """Where the session works and where "outside" is (a host directory for the host backends)."""
    name = f"escape-{uuid.uuid4().hex[:8]}.txt"
    if backend in HOST_BACKENDS:
        work, outside = tmp_path / "work", tmp_path / "outside"
        work.mkdir()
        outside.mkdir()
        (outside / "secret.txt").write_text("TOP SECRET")
        return {"workdir": str(work), "outside": str(outside), "name": name}
    # Elsewhere "outside" is a path inside the sandbox (unique: a stand-in may share this machine's /tmp).
    return {"workdir": "", "outside": f"/tmp/kodeagent-outside-{uuid.uuid4().hex[:8]}", "name": name}


def session_options(places: dict[str, str]) -> dict[str, object]:
    options: dict[str, object] = {"policy": policy(*FILE_MODULES), "timeout": 10}
    if places["workdir"]:
        options["workdir"] = places["workdir"]
    return options


async def test_files_inside_the_workdir_work(executor_factory, places) -> None:
    code = (
        "import os, pathlib, shutil\n"
        "os.makedirs('sub/dir', exist_ok=True)\n"
        "pathlib.Path('sub/dir/a.txt').write_text('hello')\n"
        "shutil.copy('sub/dir/a.txt', 'b.txt')\n"
        "os.chdir('sub')\nprint(open('dir/a.txt').read(), open('../b.txt').read())\n"
        "os.chdir('..')\nprint(sorted(os.listdir('.')))\n"
    )
    async with executor_factory(**session_options(places)) as ex:
        result = await ex.run(code)
        assert result.ok, result
        assert result.stdout == "hello hello\n['b.txt', 'sub']\n"
        assert {a.path for a in result.artifacts} == {"b.txt", "sub/dir/a.txt"}
        assert await ex.download("b.txt") == b"hello"


async def test_download_and_upload_refuse_symlinks_out(executor_factory, places, backend: str) -> None:
    secret = os.path.join(places["outside"], "secret.txt")
    outside = places["outside"]
    async with executor_factory(**session_options(places)) as ex:
        made = await ex.run(
            f"import os\nos.symlink({secret!r}, 'to_secret')\nos.symlink({outside!r}, 'to_dir')\nprint('made')"
        )
        assert made.ok, made
        # Artifacts never follow the links either.
        assert {a.path for a in made.artifacts} == set()
        with pytest.raises(SandboxFileError):
            await ex.download("to_secret")
        with pytest.raises(SandboxFileError):
            await ex.download("to_dir/secret.txt")
        with pytest.raises(SandboxFileError):
            await ex.upload("to_secret", b"OVERWRITTEN")
        with pytest.raises(SandboxFileError):
            await ex.upload("to_dir/planted.txt", b"PLANTED")
        for bad in ("../outside/secret.txt", "/etc/passwd", "..", ""):
            with pytest.raises(SandboxFileError):
                await ex.download(bad)
        await assert_usable(ex)
    if places["workdir"]:
        assert pathlib.Path(secret).read_text() == "TOP SECRET"
        assert not os.path.exists(os.path.join(outside, "planted.txt"))


DEFERRED = {
    # Code that runs after the snippet returned: it is as confined as the snippet itself.
    "a thread that writes after the run": (
        "import threading, time\n"
        "def late():\n    time.sleep(0.3)\n    open(TARGET, 'w').write('x')\n"
        "threading.Thread(target=late).start()\n",
        "wait",
    ),
    "an exception whose __str__ writes": (
        "class E(Exception):\n    def __str__(self):\n        open(TARGET, 'w').write('x')\n        return 'e'\nraise E()\n",
        "wait",
    ),
    "a finalizer run by reset()": (
        "def d(self):\n    open(TARGET, 'w').write('x')\n"
        "Late = type('Late', (), {'_' + '_del_' + '_': d})\nkeep = Late()\n",
        "reset",
    ),
    "a finalizer of a garbage cycle": (
        "def d(self):\n    open(TARGET, 'w').write('x')\n"
        "Late = type('Late', (), {'_' + '_del_' + '_': d})\n"
        "for _ in range(100):\n    a = Late()\n    a.me = a\n",
        "wait",
    ),
}


@pytest.mark.parametrize("name", sorted(DEFERRED))
async def test_code_running_after_the_snippet_stays_confined(executor_factory, places, name: str) -> None:
    target = os.path.join(places["outside"], places["name"])
    code, then = DEFERRED[name]
    async with executor_factory(**session_options(places)) as ex:
        await ex.run(f"TARGET = {target!r}\n" + code)
        if then == "reset":
            await ex.reset()
        import anyio

        await anyio.sleep(0.6)
        for _ in range(3):  # runs that allocate, so that pending garbage is collected
            await ex.run("x = [[i] for i in range(20000)]\ndel x")
        probe = await ex.run(f"import os\nprint(os.path.lexists({target!r}))")
        assert probe.stdout == "False\n", probe
        await assert_usable(ex)
    assert not os.path.lexists(target)


@pytest.mark.skipif(sys.platform != "linux", reason="Linux namespaces")
async def test_host_namespaces_hide_the_host_filesystem(tmp_path: pathlib.Path) -> None:
    """Host fact: under namespaces, even with every Python-level guard opened up (`files="any"`),
    home directories and the host /tmp are not there and /usr is read-only."""
    from sandboxes import HostExecutor
    from sandboxes.backends.host import namespaces_available

    if not namespaces_available():
        pytest.skip("bubblewrap namespaces are not available here")
    marker = tmp_path / "host-marker.txt"
    marker.write_text("host")
    code = (
        "import os\n"
        f"print(os.path.exists({str(marker)!r}), os.path.exists('/root/.bashrc'), os.path.exists('/home'))\n"
        "try:\n    open('/usr/kodeagent-probe', 'w')\nexcept OSError as e:\n    print(type(e).__name__)\n"
    )
    async with HostExecutor(policy=policy("os", "os.path", files="any"), timeout=10) as ex:
        assert ex.isolation == "namespaces"
        result = await ex.run(code)
    assert result.stdout.splitlines()[0] == "False False False", result
    assert result.stdout.splitlines()[1] in ("OSError", "PermissionError")
    assert not os.path.exists("/usr/kodeagent-probe")


async def test_download_and_upload_refuse_special_files_without_hanging(
    executor_factory, backend: str
) -> None:
    """A FIFO in the working directory (made by a child process) must neither hang nor be followed."""
    if backend not in HOST_BACKENDS:
        pytest.skip("special files are checked on the host backend")
    policy_ = policy("subprocess", subprocess=True)
    async with executor_factory(policy=policy_, timeout=10) as ex:
        made = await ex.run("import subprocess\nsubprocess.run(['mkfifo', 'pipe'], check=True)\nprint('ok')")
        assert made.ok, made
        with pytest.raises(SandboxFileError):
            await ex.download("pipe")
        with pytest.raises(SandboxFileError):
            await ex.upload("pipe", b"data")
        await ex.upload("nested/new/dir/file.txt", b"deep")
        assert await ex.download("nested/new/dir/file.txt") == b"deep"
        seen = await ex.run("print(open('nested/new/dir/file.txt').read())")
        assert seen.stdout == "deep\n", seen
