"""A fresh host session's working directory (`sandboxes/backends/host/process.py`): made new for it
alone (mode 0700, its private user's, never another session's), and removed when it ends, whatever
unguarded code left in it (nothing, files, a tree, a symlink out of it), without following a link.
Real fork servers and sessions throughout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes import HostExecutor, Policy
from sandboxes.backends.host.process import HostWorker

pytestmark = pytest.mark.anyio

UNGUARDED = Policy(python_guards=False)
# The process level refuses unguarded code: there the code may use `os` with the file guard off, so
# only the operating system's permissions stand between the sessions.
POLICIES = {"namespaces": UNGUARDED, "process": Policy(allowed_imports=["os"], files="any")}


def _worker(executor: HostExecutor) -> HostWorker:
    worker = getattr(executor.session, "worker", None)
    assert isinstance(worker, HostWorker)
    return worker


@pytest.mark.parametrize("isolation", ["namespaces", "process"])
async def test_each_session_gets_a_new_private_directory_of_its_own(isolation: str) -> None:
    async with (
        HostExecutor(policy=POLICIES[isolation], timeout=20, isolation=isolation, pool=False) as one,
        HostExecutor(policy=POLICIES[isolation], timeout=20, isolation=isolation, pool=False) as two,
    ):
        first, second = _worker(one), _worker(two)
        assert first.process is None and second.process is None  # both from the fork server
        assert first.workdir != second.workdir
        assert os.path.dirname(first.workdir) == os.path.dirname(second.workdir)
        for worker in (first, second):
            info = os.lstat(worker.workdir)
            assert info.st_mode & 0o777 == 0o700
            if worker.uid is not None:
                assert info.st_uid == worker.uid
            assert os.listdir(worker.workdir) == []
        if first.uid is None:  # the process level without a private user: the caller's own user
            assert isolation == "process" or os.getuid() != 0
            return
        # Neither session can see into the other's directory.
        peek = await one.run(
            f"import os\ntry:\n    print(os.listdir({second.workdir!r}))\nexcept OSError as e:\n"
            "    print(type(e).__name__)"
        )
        assert peek.stdout.strip() in {"PermissionError", "FileNotFoundError"}, peek.stdout


LEFTOVERS = {
    "nothing": "pass",
    "files and a tree": (
        "import os\nos.makedirs('a/b/c')\nfor p in ('top.txt', 'a/b/c/deep.txt'):\n    open(p, 'w').write('x')"
    ),
    "a symlink out": "import os\nos.symlink({target!r}, 'out')\nos.symlink({outside!r}, 'dir-out')",
    "an unreadable directory": "import os\nos.makedirs('locked/inner')\nos.chmod('locked', 0)",
}


@pytest.mark.parametrize("leftover", list(LEFTOVERS))
async def test_a_closed_sessions_directory_is_removed_whatever_the_code_left(
    leftover: str, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "keep.txt"
    target.write_text("the caller's")
    tmp_path.chmod(0o755)  # the links are made by the session's user: they only name these paths
    code = LEFTOVERS[leftover].format(target=str(target), outside=str(outside))
    # Unguarded, inside the namespaces: the links name host paths the session cannot see, and the
    # directory is removed on the host, by root, where following one would reach them.
    executor = HostExecutor(policy=UNGUARDED, timeout=20, isolation="namespaces", pool=False)
    async with executor:
        workdir = _worker(executor).workdir
        result = await executor.run(code)
        assert result.ok, result.error
    await executor.wait_closed()
    assert not os.path.lexists(workdir), f"{leftover}: the session's directory was left behind"
    assert target.read_text() == "the caller's"  # no link was followed
    assert sorted(os.listdir(outside)) == ["keep.txt"]
