"""The host backend forced to its fallback level (no namespaces), as on machines without bubblewrap."""

from __future__ import annotations

import os
from typing import Any

from sandboxes import HostExecutor


def unavailable() -> str | None:
    return None if os.name == "posix" else "the host backend needs a POSIX system"


def make_executor(**options: Any) -> HostExecutor:
    return HostExecutor(isolation="process", **options)
