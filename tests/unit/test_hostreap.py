"""The private users of host sessions (`host.reap.PrivateUsers`): a uid is handed out again only once
released (after its session's processes were reaped), and running out is a clear error."""

from __future__ import annotations

import pytest

from sandboxes.backends.host.reap import PrivateUsers
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
