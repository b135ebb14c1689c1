"""The unit tier: every test here runs in this process only (see `tests/support/unit_guard.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.unit_guard import in_this_process_only


@pytest.fixture(autouse=True)
def _in_this_process_only() -> Iterator[None]:
    with in_this_process_only() as attempts:
        yield
    if attempts:
        pytest.fail("this unit test tried to leave its process:\n" + "\n".join(attempts), pytrace=False)
