"""Sandbox sessions of the MCP server: opened per tenant (a token), capped, reaped when idle, all closed at exit.

Nothing here knows MCP: the server maps tool calls onto `SessionManager`, which only uses the public
`sandboxes` API (`open_executor`, `Executor.run/reset/upload/download/close`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from ... import ExecutionResult, Executor, SandboxError, open_executor
from ...errors import FileTooLarge
from .config import ServerConfig


class SessionRefused(SandboxError):
    """A session request was refused (unknown session, a cap reached, a file too large); the message says why."""


@dataclass(eq=False)
class Session:
    """One sandbox session: an open executor that belongs to one tenant."""

    id: str
    tenant: str
    executor: Executor
    default: bool = False
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    runs: int = 0
    busy: int = 0
    cancelled: bool = False
    """The last run was cancelled by the client: its worker was discarded (the next result says state_lost)."""
    replaces_reaped: bool = False
    """A default session opened after the tenant's previous one was reaped: its first result says state_lost."""
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def info(self) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "default": self.default,
            "backend": self.executor.backend,
            "isolation": self.executor.isolation,
            "created": round(self.created, 3),
            "idle_seconds": round(0.0 if self.busy else time.monotonic() - self.last_used, 3),
            "runs": self.runs,
            "busy": self.busy > 0,
        }


class SessionManager:
    """The server's sessions. Use as an async context manager: it reaps idle sessions meanwhile and
    closes every session on exit.

    `executor_factory` makes an unopened executor (default: `open_executor` with the config's backend,
    policy, tool functions and options), so tests can count what is opened.
    """

    def __init__(
        self,
        config: ServerConfig,
        tools: dict[str, Callable[..., Any]] | None = None,
        executor_factory: Callable[[], Executor] | None = None,
    ) -> None:
        self.config = config
        self.tools = dict(tools or {})
        self._factory = executor_factory or self._open_executor
        self._sessions: dict[str, Session] = {}
        self._defaults: dict[str, str] = {}  # tenant -> its default session's id
        self._reaped_defaults: set[str] = set()  # tenants whose default session was reaped while idle
        self._reserved: dict[str, int] = {}  # tenant -> sessions being opened (counted against the caps)
        self._default_lock = anyio.Lock()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._closed = False

    def _open_executor(self) -> Executor:
        return open_executor(
            self.config.backend,
            policy=self.config.policy,
            timeout=self.config.timeout,
            tools=self.tools,
            output_limit=self.config.output_limit,
            **self.config.backend_options,
        )

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> SessionManager:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._reap_forever)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        await self._task_group.__aexit__(exc_type, exc, tb)
        await self.close_all()

    async def close_all(self) -> None:
        """Close every session (shielded: runs to the end even while the server is being cancelled)."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            sessions, self._sessions = list(self._sessions.values()), {}
            self._defaults.clear()
            async with anyio.create_task_group() as group:
                for session in sessions:
                    group.start_soon(session.executor.close)

    async def _reap_forever(self) -> None:
        interval = min(max(self.config.idle_timeout / 4, 0.05), 30.0)
        while True:
            await anyio.sleep(interval)
            await self.reap_idle()

    async def reap_idle(self) -> list[str]:
        """Close the sessions idle longer than `idle_timeout`; return their ids."""
        now = time.monotonic()
        idle = [
            s for s in self._sessions.values() if not s.busy and now - s.last_used > self.config.idle_timeout
        ]
        for session in idle:
            if session.default:
                self._reaped_defaults.add(session.tenant)
            await self._close(session)
        return [s.id for s in idle]

    # ------------------------------------------------------------------ opening and finding

    def count(self, tenant: str | None = None) -> int:
        """Open sessions (and sessions being opened) of `tenant`, or of everyone."""
        if tenant is None:
            return len(self._sessions) + sum(self._reserved.values())
        return sum(1 for s in self._sessions.values() if s.tenant == tenant) + self._reserved.get(tenant, 0)

    async def open(self, tenant: str, *, default: bool = False) -> Session:
        """Open a new session for `tenant`, or refuse when a cap is reached."""
        if self._closed:
            raise SessionRefused("the server is shutting down; no new sessions")
        if self.count(tenant) >= self.config.max_sessions_per_token:
            raise SessionRefused(
                f"this token already has {self.config.max_sessions_per_token} open sessions (the limit, "
                "max_sessions_per_token): close one with close_session, or reuse one by its session_id"
            )
        if self.count() >= self.config.max_sessions:
            raise SessionRefused(
                f"the server has {self.config.max_sessions} open sessions (the limit, max_sessions); "
                "try again later or close one of yours with close_session"
            )
        self._reserved[tenant] = self._reserved.get(tenant, 0) + 1
        try:
            executor = self._factory()
            await executor.open()
        finally:
            self._reserved[tenant] -= 1
        session = Session(id=secrets.token_urlsafe(24), tenant=tenant, executor=executor, default=default)
        if self._closed:  # shut down while this one was starting
            await executor.close()
            raise SessionRefused("the server is shutting down; no new sessions")
        self._sessions[session.id] = session
        return session

    def get(self, tenant: str, session_id: str) -> Session:
        """The tenant's session by id. Another tenant's session is as unknown as one that never was."""
        session = self._sessions.get(session_id)
        if session is None or session.tenant != tenant:
            raise SessionRefused(
                f"no open session {_short(session_id)} for this token (it may have been closed, or reaped "
                f"after {self.config.idle_timeout:g} s idle); open one with open_session, or leave "
                "session_id out to use your default session"
            )
        return session

    async def default(self, tenant: str) -> Session:
        """The tenant's default session (used when a call names none), opened on first use."""
        async with self._default_lock:
            session_id = self._defaults.get(tenant)
            if session_id is not None and session_id in self._sessions:
                return self._sessions[session_id]
            session = await self.open(tenant, default=True)
            session.replaces_reaped = tenant in self._reaped_defaults
            self._reaped_defaults.discard(tenant)
            self._defaults[tenant] = session.id
            return session

    async def resolve(self, tenant: str, session_id: str | None) -> Session:
        """The named session of `tenant`, or its default session when `session_id` is None or empty."""
        return self.get(tenant, session_id) if session_id else await self.default(tenant)

    def list(self, tenant: str) -> list[Session]:
        return [s for s in self._sessions.values() if s.tenant == tenant]

    async def close(self, tenant: str, session_id: str) -> None:
        await self._close(self.get(tenant, session_id))

    async def _close(self, session: Session) -> None:
        if self._sessions.pop(session.id, None) is None:
            return
        if self._defaults.get(session.tenant) == session.id:
            del self._defaults[session.tenant]
        await session.executor.close()

    # ------------------------------------------------------------------ using a session

    async def run(
        self, session: Session, code: str, timeout: float | None = None
    ) -> tuple[ExecutionResult, bool]:
        """Run code in the session with its own timeout. Returns the result and whether the previous run
        was cancelled by the client (its worker was discarded: the result then says `state_lost`).

        A cancellation of this call (an MCP cancel, a client gone) cancels the executor's `run()`, which
        discards the worker; the session stays open and the next run starts a fresh one."""
        limit = self.config.timeout if timeout is None else timeout
        if not 0 < limit <= self.config.max_timeout:
            raise SessionRefused(
                f"timeout must be more than 0 and at most {self.config.max_timeout:g} s (max_timeout), got {limit:g}"
            )
        with self._using(session):
            async with session.lock:
                was_cancelled, session.cancelled = session.cancelled, False
                # The executor's timeout is read by each run; the session lock keeps it this call's.
                session.executor.timeout = limit
                try:
                    result = await session.executor.run(code)
                except anyio.get_cancelled_exc_class():
                    session.cancelled = True
                    raise
                if session.replaces_reaped:  # the variables of the reaped default session are gone
                    session.replaces_reaped = False
                    result.state_lost = True
                session.runs += 1
                return result, was_cancelled

    async def reset(self, session: Session) -> None:
        with self._using(session):
            async with session.lock:
                await session.executor.reset()
                session.cancelled = False

    async def upload(self, session: Session, path: str, data: bytes) -> None:
        if len(data) > self.config.max_file_bytes:
            raise SessionRefused(
                f"the file is {len(data):,} bytes; the limit is {self.config.max_file_bytes:,} (max_file_bytes)"
            )
        with self._using(session):
            async with session.lock:
                await session.executor.upload(path, data)

    async def download(self, session: Session, path: str) -> bytes:
        """The file, read under the cap: reading stops past `max_file_bytes`, so a file of any size
        costs this process at most that much memory."""
        limit = self.config.max_file_bytes
        with self._using(session):
            async with session.lock:
                try:
                    data = await session.executor.download(path, max_bytes=limit)
                except FileTooLarge:
                    data = None
        if data is None or len(data) > limit:
            raise SessionRefused(
                f"{path!r} is larger than {limit:,} bytes; at most {limit:,} (max_file_bytes) are "
                "returned: have the code split or summarise it"
            )
        return data

    def _using(self, session: Session) -> _InUse:
        return _InUse(session)


class _InUse:
    """Marks a session busy (never reaped) for the duration of a call, and touches it at both ends."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def __enter__(self) -> Session:
        self.session.busy += 1
        self.session.last_used = time.monotonic()
        return self.session

    def __exit__(self, *exc: object) -> None:
        self.session.busy -= 1
        self.session.last_used = time.monotonic()


def _short(session_id: str) -> str:
    return repr(session_id if len(session_id) <= 48 else session_id[:45] + "...")
