"""The host backend forced to its fallback level (no namespaces), as on machines without bubblewrap."""

from __future__ import annotations

import os
from typing import Any

import pytest

from sandboxes import HostExecutor

REFUSED = "tests/test_security_forkbomb.py::test_the_process_level_refuses_subprocesses_before_anything_runs"


def unavailable() -> str | None:
    return None if os.name == "posix" else "the host backend needs a POSIX system"


def make_executor(**options: Any) -> HostExecutor:
    policy = options.get("policy")
    if policy is not None and policy.subprocess:
        # A started program runs outside the Python-level guards, this level's only wall.
        pytest.skip(f"Policy(subprocess=True) is refused at the host's process level ({REFUSED})")
    return HostExecutor(isolation="process", **options)
