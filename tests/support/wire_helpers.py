"""What tests that play the runner need: a run reply's fields, and the processes of a user."""

from __future__ import annotations

import os
from typing import Any

RUN_FIELDS: dict[str, Any] = {
    "stdout": "",
    "stderr": "",
    "stdout_omitted": 0,
    "stderr_omitted": 0,
    "truncated": False,
    "error": None,
    "oom": False,
    "final_answer": None,
    "has_final_answer": False,
    "value": None,
    "artifacts": [],
    "artifacts_omitted": 0,
}
"""Every field a run's reply must have (`runtime.protocol.RunReply`), each at its 'nothing happened' value."""


def pids_of(uid: int) -> set[int]:
    """The pids of this machine's processes owned by `uid` (as /proc shows them now)."""
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.add(int(entry.name))
            except OSError:
                continue
    return found
