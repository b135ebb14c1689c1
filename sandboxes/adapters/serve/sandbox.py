"""A served sandbox: one kodeagent executor (its session is the sandbox) and what E2B says about it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from starlette.requests import Request

    from ...executor import Executor

ENVD_PORT = 49983
"""E2B's in-sandbox daemon (files, processes), as the SDK addresses it."""
INTERPRETER_PORT = 49999
"""The code interpreter's Jupyter-backed server (`/execute`, `/contexts`)."""
SANDBOX_HOME = PurePosixPath("/home/user")
"""E2B's home, the only directory the files API exposes (the session's working directory)."""


@dataclass
class ServedSandbox:
    """One sandbox the server holds for a tenant.

    `executor` is open; its session is the sandbox, bounded at the OS layer. `busy` serialises what
    runs through the session (the runner takes one request at a time). `touch()` records activity, so
    an idle sandbox can be paused and its lifetime extended as E2B documents."""

    sandbox_id: str
    tenant: str
    access_token: str
    executor: Executor
    template: str = "base"
    home: PurePosixPath = SANDBOX_HOME
    metadata: dict[str, str] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    busy: anyio.Lock = field(default_factory=anyio.Lock)
    commands: dict[int, Any] = field(default_factory=dict)
    """Commands running now, by the pid the server gave them (envd's process service keeps them)."""
    contexts: dict[str, Any] = field(default_factory=dict)
    """The interpreter's contexts, by id (the interpreter keeps them)."""
    meter: Any = None
    """Its metrics readings so far (`metrics.Meter`, made by the control plane when first asked)."""
    watchers: Any = None
    """Its directory watchers by id (`envd.watch`), closed when it ends."""

    def touch(self) -> None:
        """Record that a request used this sandbox now."""
        self.last_active = time.monotonic()


Resolve = Callable[["Request"], Awaitable[ServedSandbox]]
"""Finds the sandbox an in-sandbox request is for, or raises a `ServeError`: checks the
`E2b-Sandbox-Id` header names a live sandbox of the caller's, that `X-Access-Token` is its token,
resumes it if paused, and touches it. The control plane provides it; envd and the interpreter take it."""
