"""Attack class: files outside the working directory.

The code may write inside its working directory and nowhere else, by any route: `..`, absolute
paths, symlinks, `/proc/self/cwd`, `chdir`, pathlib, shutil, io.FileIO, os.open, rename, and
`dir_fd=` relative to a directory descriptor. Every test proves the file does not exist afterwards:
on the host (for the host backends, whose "outside" is a directory of this machine) and as seen
from inside the sandbox. Uploads and downloads never follow a symlink out of the working directory.
"""

from __future__ import annotations

import os
import pathlib
import sys
import uuid

import pytest
from support.security_helpers import ESCAPED, HOST_BACKENDS, assert_refused, assert_usable, policy

from sandboxes import SandboxFileError

pytestmark = pytest.mark.anyio

FILE_MODULES = ("os", "os.path", "pathlib", "shutil", "io", "stat", "threading", "time", "atexit")
REFUSED = ("PermissionError", "PolicyViolation", "FileNotFoundError", "OSError", "NotADirectoryError")
STDLIB_DIR = os.path.dirname(os.__file__)


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


ATTACKS = {
    "absolute path": "open(OUT + '/' + NAME, 'w').write('x')",
    "dot dot": "open('../' + NAME, 'w').write('x')\nopen('../outside/' + NAME, 'w').write('x')",
    "many dot dots": "open('../../../../../../../../' + OUT + '/' + NAME, 'w').write('x')",
    "symlink to the outside directory": (
        "import os\nos.symlink(OUT, 'link')\nopen('link/' + NAME, 'w').write('x')"
    ),
    "symlink to the outside file": (
        "import os\nos.symlink(OUT + '/' + NAME, 'flink')\nopen('flink', 'w').write('x')"
    ),
    "/proc/self/cwd": "open('/proc/self/cwd/../outside/' + NAME, 'w').write('x')",
    "/proc/self/root": "open('/proc/self/root' + OUT + '/' + NAME, 'w').write('x')",
    "os.chdir": "import os\nos.chdir(OUT)\nopen(NAME, 'w').write('x')",
    "os.chdir dot dot": "import os\nos.chdir('..')\nopen('outside/' + NAME, 'w').write('x')",
    "pathlib": "import pathlib\npathlib.Path(OUT, NAME).write_text('x')",
    "pathlib resolve": "import pathlib\n(pathlib.Path('.').resolve().parent / 'outside' / NAME).write_text('x')",
    "shutil.copy": "import shutil\nopen('in.txt', 'w').write('x')\nshutil.copy('in.txt', OUT + '/' + NAME)",
    "shutil.move": "import shutil\nopen('in.txt', 'w').write('x')\nshutil.move('in.txt', OUT + '/' + NAME)",
    "io.FileIO": "import io\nio.FileIO(OUT + '/' + NAME, 'w').write(b'x')",
    "io.open": "import io\nio.open(OUT + '/' + NAME, 'w').write('x')",
    "os.open": "import os\nfd = os.open(OUT + '/' + NAME, os.O_CREAT | os.O_WRONLY)\nos.write(fd, b'x')",
    "os.rename": "import os\nopen('in.txt', 'w').write('x')\nos.rename('in.txt', OUT + '/' + NAME)",
    "os.replace": "import os\nopen('in.txt', 'w').write('x')\nos.replace('in.txt', OUT + '/' + NAME)",
    "os.link": "import os\nopen('in.txt', 'w').write('x')\nos.link('in.txt', OUT + '/' + NAME)",
    "os.mkdir": "import os\nos.mkdir(OUT + '/' + NAME)",
    "dir_fd of the working directory's parent": (
        "import os\nfd = os.open('..', os.O_RDONLY)\n"
        "f = os.open('outside/' + NAME, os.O_CREAT | os.O_WRONLY, dir_fd=fd)\nos.write(f, b'x')"
    ),
    "dir_fd of a readable library directory": (
        "import os\nfd = os.open(LIB, os.O_RDONLY)\n"
        "f = os.open(NAME, os.O_CREAT | os.O_WRONLY, dir_fd=fd)\nos.write(f, b'x')"
    ),
    "write into the library directory": "open(LIB + '/' + NAME, 'w').write('x')",
    "os.mkfifo (no audit event)": "import os\nos.mkfifo(OUT + '/' + NAME)",
    "os.mknod (no audit event)": "import os\nos.mknod(OUT + '/' + NAME)",
    "from os import mknod": "from os import mknod as m\nm(OUT + '/' + NAME)",
    "device node in the workdir": (
        "import os, stat\nos.mknod('dev', stat.S_IFCHR | 0o666, os.makedev(1, 3))\n"
        "open(OUT + '/' + NAME, 'w').write('x')"
    ),
    "os.chroot": "import os\nos.chroot('.')\nopen(OUT + '/' + NAME, 'w').write('x')",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_writes_outside_the_workdir_do_not_happen(executor_factory, places, name: str) -> None:
    out, file_name = places["outside"], places["name"]
    prelude = f"OUT = {out!r}\nNAME = {file_name!r}\nLIB = {STDLIB_DIR!r}\n"
    async with executor_factory(**session_options(places)) as ex:
        result = await ex.run(prelude + ATTACKS[name] + f"\nprint('{ESCAPED}')")
        assert_refused(result, *REFUSED)
        # Seen from inside the sandbox: nothing there.
        probe = await ex.run(
            "import os\n"
            f"print(os.path.lexists({out + '/' + file_name!r}), os.path.lexists({STDLIB_DIR + '/' + file_name!r}))"
        )
        assert probe.stdout == "False False\n", probe
        await assert_usable(ex)
    # Seen from the host: nothing there either.
    assert not os.path.lexists(os.path.join(out, file_name))
    assert not os.path.lexists(os.path.join(STDLIB_DIR, file_name))


READS = {
    "absolute": "print('" + ESCAPED + "', open(SECRET).read())",
    "dot dot": "print('" + ESCAPED + "', open('../outside/secret.txt').read())",
    "symlink": "import os\nos.symlink(SECRET, 's')\nprint('" + ESCAPED + "', open('s').read())",
    "hard link": "import os\nos.link(SECRET, 'h')\nprint('" + ESCAPED + "', open('h').read())",
    "/etc/passwd": "print('" + ESCAPED + "', open('/etc/passwd').read())",
    "/proc/self/environ": "print('" + ESCAPED + "', open('/proc/self/environ').read())",
    "listing the root": "import os\nprint('" + ESCAPED + "', os.listdir('/'))",
}


@pytest.mark.parametrize("name", sorted(READS))
async def test_reads_outside_the_workdir_are_refused(executor_factory, places, name: str) -> None:
    secret = os.path.join(places["outside"], "secret.txt")
    async with executor_factory(**session_options(places)) as ex:
        result = await ex.run(f"SECRET = {secret!r}\n" + READS[name])
        assert_refused(result, *REFUSED)
        assert "TOP SECRET" not in result.stdout + result.stderr
        await assert_usable(ex)


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


async def test_files_none_refuses_even_the_workdir(executor_factory) -> None:
    async with executor_factory(policy=policy("os", "os.path", files="none"), timeout=10) as ex:
        result = await ex.run(
            f"import os\nfd = os.open('x.txt', os.O_CREAT | os.O_WRONLY)\nprint('{ESCAPED}')"
        )
        assert_refused(result)
        probe = await ex.run("import os\nprint(os.path.exists('x.txt'))")
        assert probe.stdout == "False\n"


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
