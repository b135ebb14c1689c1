"""The host backend for the conformance suite: always available on POSIX."""

from __future__ import annotations

import os
from typing import Any

from sandboxes import HostExecutor


def unavailable() -> str | None:
    return None if os.name == "posix" else "the host backend needs a POSIX system"


def tmp_left_open() -> str | None:
    """Why a namespaced host session could write `/tmp` here (None: it cannot, and its `TMPDIR` is
    then its working directory): only bubblewrap run as root gives each session a uid of its own."""
    from sandboxes.backends.host import namespaces_available

    if not namespaces_available():
        return "bubblewrap cannot create namespaces here"
    return None if os.getuid() == 0 else "only as root is /tmp closed to a session (its own uid)"


def make_executor(**options: Any) -> HostExecutor:
    return HostExecutor(**options)
