"""The private users of host sessions (`host.reap.PrivateUsers`): a uid is handed out again only once
released (after its session's processes were reaped), and running out is a clear error; between
processes, each holds a block of uids of its own (`UidBlocks`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes.backends.host.reap import PrivateUsers, UidBlocks
from sandboxes.errors import WorkerStartError


def test_a_uid_is_not_handed_out_again_until_released() -> None:
    users = PrivateUsers(base=500_000, size=3)
    first = users.take()
    others = {users.take(), users.take()}
    assert first not in others and len(others) == 2
    with pytest.raises(WorkerStartError, match="all 3 private users"):
        users.take()
    users.release(first)
    assert users.take() == first
    assert users.in_use() == 3


def test_uids_stay_in_their_range() -> None:
    users = PrivateUsers(base=700_000, size=5)
    taken = [users.take() for _ in range(5)]
    assert sorted(taken) == list(range(700_001, 700_006))


def test_a_full_table_is_a_clear_error(tmp_path: Path) -> None:
    blocks = UidBlocks(first=300_000, size=1000, count=2, lock_dir=str(tmp_path))
    held = [blocks.claim(0)[1], blocks.claim(0)[1]]  # flock: a second open file is a second holder
    try:
        with pytest.raises(WorkerStartError, match="all 2 blocks of private users"):
            blocks.claim(0)
    finally:
        for fd in held:
            os.close(fd)


def test_the_block_is_the_range_take_hands_out(tmp_path: Path) -> None:
    users = PrivateUsers(size=3, blocks=UidBlocks(first=300_000, size=3, count=2, lock_dir=str(tmp_path)))
    block = users.block()
    assert sorted(users.take() for _ in range(3)) == list(block)


def test_a_lock_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "locks"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # as another user's directory in a shared /tmp would let anyone in
    with pytest.raises(WorkerStartError, match="not a directory of this user's alone"):
        UidBlocks(first=300_000, size=1000, count=2, lock_dir=str(shared)).claim(0)
    assert os.listdir(shared) == []  # no lock was taken in it
