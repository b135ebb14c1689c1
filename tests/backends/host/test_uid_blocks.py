"""Private-uid blocks between processes (`host.reap.UidBlocks`): two live processes on one machine
never hold one block, whatever their pids; a dead owner's block is free again; a forked child takes
its own. (Within one process, `tests/unit/test_hostreap.py`.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandboxes.backends.host.reap import PrivateUsers, UidBlocks


def test_two_live_processes_never_hold_one_block(tmp_path: Path) -> None:
    blocks = UidBlocks(first=300_000, size=1000, count=4, lock_dir=str(tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_BLOCK, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        theirs = int(holder.stdout.readline())
        assert theirs == 302_000  # it asked for block 2 and got it
        ours, fd = blocks.claim(preferred=2)  # the same preference, as two pids alike modulo the count
        assert ours == 303_000, ours  # the next free block, not theirs
        os.close(fd)
    finally:
        holder.communicate(b"\n", timeout=30)
    again, fd = blocks.claim(preferred=2)  # its owner ended: the kernel dropped its lock
    os.close(fd)
    assert again == 302_000


def test_a_forked_child_takes_a_block_of_its_own(tmp_path: Path) -> None:
    users = PrivateUsers(
        size=1000, blocks=UidBlocks(first=300_000, size=1000, count=8, lock_dir=str(tmp_path))
    )
    parent_uid = users.take()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write_end, str(users.take()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child_uid = int(os.read(read_end, 64))
    os.waitpid(child, 0)
    os.close(read_end)
    assert child_uid // 1000 != parent_uid // 1000, (parent_uid, child_uid)
    assert users.take() // 1000 == parent_uid // 1000  # the parent keeps its block


HOLD_BLOCK = """
import sys
from sandboxes.backends.host.reap import UidBlocks
base, fd = UidBlocks(first=300_000, size=1000, count=4, lock_dir=sys.argv[1]).claim(preferred=2)
print(base, flush=True)
sys.stdin.readline()
"""
