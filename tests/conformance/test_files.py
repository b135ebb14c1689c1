"""The files contract, on every backend: upload, download and artifacts; and `download()` takes a
byte cap, and every backend stops reading at it.

The file is the sandbox's: its size, what a stat or an archive header says of it, and whether it is
still growing are all the code's to choose. Each backend counts the bytes as they arrive and stops
one past the cap, so the caller's memory is bounded by the cap, never by the file; past it the
download raises `FileTooLarge` and the session goes on as it was (its variables, its threads).
"""

from __future__ import annotations

import pathlib

import pytest
from support.security_helpers import policy

from sandboxes import FileTooLarge, HostExecutor, SandboxFileError, SyncExecutor
from sandboxes.executor import DEFAULT_DOWNLOAD_LIMIT

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
WRITE = "open({name!r}, 'wb').write(bytes(range(256)) * ({size} // 256) + bytes({size} % 256))\n"


def content(size: int) -> bytes:
    """What `WRITE` puts in a file of `size` bytes (not all one byte: a shifted copy would show)."""
    return bytes(range(256)) * (size // 256) + bytes(size % 256)


async def test_one_byte_over_the_cap_is_refused_and_one_at_it_is_returned(executor_factory) -> None:
    size = 10_000
    async with executor_factory(timeout=20) as ex:
        made = await ex.run("kept = 'still here'\n" + WRITE.format(name="data.bin", size=size))
        assert made.ok, made
        assert await ex.download("data.bin", max_bytes=size) == content(size)
        with pytest.raises(FileTooLarge) as refused:
            await ex.download("data.bin", max_bytes=size - 1)
        after = await ex.run("print(kept)")
        assert await ex.download("data.bin") == content(size)  # the default cap, far above it
    message = str(refused.value)
    assert "'data.bin'" in message and f"{size - 1:,} bytes" in message and "max_bytes=" in message
    assert isinstance(refused.value, SandboxFileError)
    assert after.ok and after.stdout == "still here\n" and not after.state_lost, after


async def test_a_cap_of_zero_returns_an_empty_file_and_refuses_any_byte(executor_factory) -> None:
    async with executor_factory(timeout=20) as ex:
        made = await ex.run("open('empty', 'wb').close()\nopen('one', 'wb').write(b'x')")
        assert made.ok, made
        assert await ex.download("empty", max_bytes=0) == b""
        with pytest.raises(FileTooLarge):
            await ex.download("one", max_bytes=0)
        assert await ex.download("one", max_bytes=1) == b"x"
        after = await ex.run("print('fine')")
    assert after.stdout == "fine\n" and not after.state_lost, after


async def test_a_file_that_grows_while_it_is_read_is_cut_at_the_cap(executor_factory) -> None:
    # A thread of the session appends to the file with no end in sight (until 256 MiB, or told to
    # stop) while it is downloaded: a reader that reads to end-of-file would return whatever it had
    # reached, far past the cap, or never end.
    grow = (
        "import threading, time, os\n"
        "stop = threading.Event()\n"
        "def append():\n"
        "    with open('growing.log', 'ab') as out:\n"
        "        while not stop.is_set() and out.tell() < 256 * 1024 * 1024:\n"
        "            out.write(b'y' * 65536)\n"
        "            out.flush()\n"
        "            time.sleep(0.001)\n"
        "writer = threading.Thread(target=append, daemon=True)\n"
        "writer.start()\n"
        "while not os.path.exists('growing.log') or os.path.getsize('growing.log') <= 2 * 1024 * 1024:\n"
        "    time.sleep(0.01)\n"
        "print('growing')\n"
    )
    async with executor_factory(policy=policy("threading", "time", "os", "os.path"), timeout=30) as ex:
        started = await ex.run(grow)
        assert started.stdout == "growing\n", started
        with pytest.raises(FileTooLarge):
            await ex.download("growing.log", max_bytes=MIB)
        after = await ex.run("stop.set()\nwriter.join(10)\nprint(writer.is_alive())")
    assert after.stdout == "False\n" and not after.state_lost, after  # the session went on, its thread too


def _peak_rss_reset() -> None:
    """Start a new high-water mark of this process's resident memory (Linux: clear_refs 5)."""
    pathlib.Path("/proc/self/clear_refs").write_text("5")


def _peak_rss() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


async def test_a_huge_file_costs_this_process_no_more_than_the_cap(executor_factory, backend: str) -> None:
    # 200 MB of zeros (a sparse file: no disk) read with a 1 MB cap: an uncapped read holds all of it
    # (and its join, twice that) in this process before it could refuse anything.
    if backend == "e2b":
        pytest.skip("the E2B stand-in serves its files from this process: its own reads would count")
    async with executor_factory(timeout=30) as ex:
        made = await ex.run("f = open('huge.bin', 'wb')\nf.truncate(200 * 1000 * 1000)\nf.close()")
        assert made.ok, made
        _peak_rss_reset()
        before = _peak_rss()
        with pytest.raises(FileTooLarge):
            await ex.download("huge.bin", max_bytes=1000 * 1000)
        growth = _peak_rss() - before
    assert growth < 50 * 1000 * 1000, f"the peak resident memory grew by {growth:,} bytes"


@pytest.mark.parametrize("bad", [-1, True, False, 1.5, "10"])
async def test_a_cap_that_is_not_a_whole_number_of_bytes_is_refused(bad: object) -> None:
    ex = HostExecutor()  # checked before anything else: not even opened
    with pytest.raises(ValueError, match="max_bytes"):
        await ex.download("f.txt", max_bytes=bad)  # type: ignore[arg-type]


def test_the_sync_facade_takes_the_cap() -> None:
    with SyncExecutor(HostExecutor(timeout=10)) as ex:
        ex.upload("note.txt", b"12345")
        assert ex.download("note.txt", max_bytes=5) == b"12345"
        with pytest.raises(FileTooLarge):
            ex.download("note.txt", max_bytes=4)
        assert ex.download("note.txt") == b"12345"
    assert DEFAULT_DOWNLOAD_LIMIT == 256 * MIB


async def test_files_upload_download_and_artifacts(executor_factory):
    async with executor_factory(timeout=10) as ex:
        await ex.upload("data/in.txt", "3\n4\n")
        result = await ex.run(
            "total = sum(int(v) for v in open('data/in.txt').read().split())\n"
            "open('out.txt', 'w').write(str(total))\nprint(total)"
        )
        produced = await ex.download("out.txt")
        with pytest.raises(SandboxFileError):
            await ex.download("../etc/passwd")
        with pytest.raises(SandboxFileError):
            await ex.download("missing.txt")
    assert result.stdout == "7\n"
    assert produced == b"7"
    assert [(a.path, a.size) for a in result.artifacts] == [("out.txt", 1)]


async def test_track_artifacts_false_does_not_look_and_says_so(executor_factory):
    """Without the look at the working directory the result says "not looked at" (None), never "no
    file written" ([]); the files are written all the same, and a tracking session lists them."""
    write = "open('out.txt', 'w').write('xy')\nprint(1)"
    async with executor_factory(timeout=10, track_artifacts=False) as lean:
        unlooked = await lean.run(write)
        quiet = await lean.run("print(2)")
        produced = await lean.download("out.txt")
    async with executor_factory(timeout=10) as tracking:
        listed = await tracking.run(write)
        none_written = await tracking.run("print(2)")
    assert unlooked.ok and unlooked.stdout == "1\n" and unlooked.artifacts is None, unlooked
    assert quiet.ok and quiet.artifacts is None and produced == b"xy"
    assert [(a.path, a.size) for a in listed.artifacts or []] == [("out.txt", 2)]
    assert none_written.artifacts == [], none_written


async def test_the_last_runs_listing_opens_the_next_run_only_when_nothing_else_happened(executor_factory):
    """A run's opening listing of the working directory may be the last run's closing one (nothing
    else went on in between): a file written in one run is not the next run's, a file rewritten is,
    and a file uploaded or left by a run with tracking off between two runs is never a run's."""
    async with executor_factory(timeout=10) as ex:
        first = await ex.run("open('a.txt', 'w').write('1')")
        again = await ex.run("print(1)")
        rewritten = await ex.run("open('a.txt', 'w').write('22')")
        await ex.upload("up.txt", "uploaded")
        after_upload = await ex.run("print(2)")
        ex.track_artifacts = False
        await ex.run("open('quiet.txt', 'w').write('q')")
        ex.track_artifacts = True
        after_untracked = await ex.run("print(3)")
        await ex.send_variables({"n": 1})
        after_define = await ex.run("open('b.txt', 'w').write(str(n))")
    assert [(a.path, a.size) for a in first.artifacts or []] == [("a.txt", 1)]
    assert again.artifacts == []
    assert [(a.path, a.size) for a in rewritten.artifacts or []] == [("a.txt", 2)]
    assert after_upload.artifacts == [], after_upload.artifacts
    assert after_untracked.artifacts == [], after_untracked.artifacts
    assert [(a.path, a.size) for a in after_define.artifacts or []] == [("b.txt", 1)]


async def test_files_made_in_a_working_directory_left_empty_and_quiet_are_found(executor_factory):
    """A listing that finds the working directory empty, its last change 50 ms back or more, keeps
    the directory's change time, and while that reads the same the next listing does not scan: a
    file made then is still found, and so is one whose maker set the directory's times back, and one
    made in a subdirectory (a directory holding only an empty subdirectory is never taken as empty)."""
    settle = "import time\ntime.sleep(0.2)\n"  # the directory's last change 50 ms behind the listing
    async with executor_factory(timeout=10, policy=policy("os", "time")) as ex:
        await ex.run(settle)
        await ex.run("print(1)")
        quiet = await ex.run("print(2)")
        made = await ex.run("open('a.txt', 'w').write('1')")
        await ex.run("import os\nos.remove('a.txt')\n" + settle)
        await ex.run("print(3)")
        hidden = await ex.run(
            "import os\nbefore = os.stat('.')\nopen('b.txt', 'w').write('22')\n"
            "os.utime('.', ns=(before.st_atime_ns, before.st_mtime_ns))\n"
        )
        await ex.run("os.remove('b.txt')\nos.mkdir('sub')\n" + settle)
        await ex.run("print(4)")
        inside = await ex.run("open('sub/c.txt', 'w').write('333')")
    assert quiet.ok and quiet.artifacts == [], quiet
    assert [(a.path, a.size) for a in made.artifacts or []] == [("a.txt", 1)], made
    assert [(a.path, a.size) for a in hidden.artifacts or []] == [("b.txt", 2)], hidden
    assert [(a.path, a.size) for a in inside.artifacts or []] == [("sub/c.txt", 3)], inside
