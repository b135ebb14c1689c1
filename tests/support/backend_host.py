"""The host backend for the conformance suite: always available on POSIX."""

from __future__ import annotations

import os
from typing import Any

from sandboxes import HostExecutor


def unavailable() -> str | None:
    return None if os.name == "posix" else "the host backend needs a POSIX system"


def make_executor(**options: Any) -> HostExecutor:
    return HostExecutor(**options)
