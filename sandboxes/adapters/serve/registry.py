"""The sandboxes the server holds: per-tenant caps, lifetimes (E2B's timeout and `set_timeout`),
finding a sandbox for a request (`resolve`, the control plane's `get`), and closing them all.

A sandbox is reachable only by its tenant: through the control plane with the tenant's API key,
in-sandbox with the sandbox's own access token. Another tenant's sandbox, a killed one and one that
never was are answered the same way (not found), so an id cannot be probed and a token outlives its
sandbox by nothing.
"""

from __future__ import annotations

import datetime
import hmac
import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio

from ...egress.policy import NetworkPolicy
from ...policy import Policy
from . import homes, insession
from . import pause as pausing
from .config import ServeConfig
from .errors import BadRequest, SandboxNotFound, ServeError, TooMany
from .sandbox import INTERPRETER_PORT, SANDBOX_HOME, ServedSandbox
from .spares import Spares

if TYPE_CHECKING:
    from starlette.requests import Request

    from ...executor import Executor

logger = logging.getLogger("sandboxes.adapters.serve")

SANDBOX_ID_HEADER = "e2b-sandbox-id"
SANDBOX_PORT_HEADER = "e2b-sandbox-port"
ACCESS_TOKEN_HEADER = "x-access-token"
TOKENLESS_INTERPRETER_PATHS = ("/contexts",)
"""The code interpreter SDK sends no access token to these (only to `/execute`): there the sandbox id,
random and known only to its tenant, is the capability."""


class SandboxGone(ServeError):
    """In-sandbox: no such sandbox for this token. E2B's edge answers 502 with "The sandbox was not
    found", which the SDK turns into its `NotFoundException`/`SandboxException`."""

    status = 502


@dataclass(frozen=True)
class Spec:
    """What a create asks for, validated."""

    template: str
    timeout: int
    metadata: dict[str, str]
    envs: dict[str, str]
    network: bool | NetworkPolicy
    allow_internet_access: bool
    on_timeout: Literal["kill", "pause"] = "kill"


@dataclass(eq=False)
class Held:
    """A sandbox and what the control plane keeps about it. `active` counts its requests in flight
    (never paused while one runs); `changing` serialises pausing and resuming it."""

    sandbox: ServedSandbox
    spec: Spec
    end_at: float  # wall clock (E2B reports `endAt`)
    state: Literal["running", "paused"] = "running"
    active: int = 0
    changing: anyio.Lock = field(default_factory=anyio.Lock)
    home: str | None = None  # the registry's directory for its files, removed with it

    def idle(self) -> bool:
        return self.state == "running" and self.active == 0 and not self.sandbox.busy.locked()

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.sandbox_id

    @property
    def tenant(self) -> str:
        return self.sandbox.tenant


ExecutorFactory = Callable[[Spec, "str | None"], "Executor"]
"""Makes a sandbox's unopened executor from its spec and its home directory (None: the backend's own)."""


def new_sandbox_id() -> str:
    """20 random lowercase hex digits, as long as E2B's ids; 80 bits, so an id cannot be guessed."""
    return secrets.token_hex(10)


class Registry:
    """Every live sandbox of the server. Use as an async context manager: entering starts the timer
    that ends sandboxes at their `end_at`; leaving closes every sandbox."""

    def __init__(self, config: ServeConfig, factory: ExecutorFactory | None = None) -> None:
        self.config = config
        self._factory = factory or self._open_executor
        self._held: dict[str, Held] = {}
        self._reserved: dict[str, int] = {}  # tenant -> sandboxes being created
        self._in_flight: dict[str, int] = {}  # tenant -> requests being served
        self._wake = anyio.Event()
        self._group: anyio.abc.TaskGroup | None = None
        self._closed = False
        self._homes: homes.Homes | None = None
        self._spares: Spares | None = None
        self.started = time.time()
        self.killed_on_timeout = 0
        self.paused_on_timeout = 0
        self.paused_idle = 0

    def _open_executor(self, spec: Spec, home: str | None) -> Executor:
        from ...backends import open_executor

        policy = Policy(
            python_guards=self.config.python_guards,
            allowed_imports=("*",),
            subprocess=True,
            files="any",
            network=spec.network,
        )
        options: dict[str, Any] = {
            "policy": policy,
            "timeout": self.config.run_timeout,
            "env": spec.envs,
            **self.config.backend_options,
        }
        if home is not None:
            options["workdir"] = home
            if self.config.backend == "host":
                # Code naming E2B's home literally reaches the files API's (namespaces level only).
                options.setdefault("workdir_at", str(SANDBOX_HOME))
        if self.config.backend == "host":
            # Plain Python needs the namespaces boundary (the bare process level refuses it).
            options.setdefault("isolation", "namespaces")
            # The server's helpers compiled once in the fork server, not at each sandbox's first cell.
            options.setdefault("preload", insession.preload_files())
        return open_executor(self.config.backend, **options)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Registry:
        if self.config.durable_home:
            await anyio.to_thread.run_sync(homes.check, self.config)
            self._homes = homes.Homes(self.config)
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._expire_forever)
        if self._homes is not None and self.config.warm_sandboxes:
            self._spares = Spares(
                self.config.warm_sandboxes, self._start_spare, _discard, self._group.start_soon
            )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._group is not None
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(None, None, None)
        await self.close_all()

    async def close_all(self) -> int:
        """Close every sandbox (shielded: runs to the end while the server is being cancelled)."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            held, self._held = list(self._held.values()), {}
            async with anyio.create_task_group() as group:
                for entry in held:
                    group.start_soon(_close_quietly, entry)
        if held:
            logger.warning("closed %d sandbox(es) at shutdown", len(held))
        if self._spares is not None:
            await self._spares.close()
        if self._homes is not None:
            self._homes.close()
        return len(held)

    async def _expire_forever(self) -> None:
        while True:
            with anyio.move_on_after(self._next_due()):
                await self._wake.wait()
            self._wake = anyio.Event()
            await self.expire()

    def _next_due(self) -> float:
        """Seconds until a running sandbox reaches its end or its idle limit (at most a minute)."""
        now, clock = time.time(), time.monotonic()
        due = [h.end_at - now for h in self._held.values() if h.state == "running"]
        if self.config.idle_pause:
            due += [
                h.sandbox.last_active + self.config.idle_pause - clock
                for h in self._held.values()
                if h.idle()
            ]
        return max(0.0, min([60.0, *due]))

    async def expire(self) -> list[str]:
        """End (or, with on_timeout pause, pause) the running sandboxes whose lifetime is over, and
        pause the ones idle past `idle_pause`; return the ids of those that ended."""
        now, clock = time.time(), time.monotonic()
        ended = []
        for entry in [h for h in self._held.values() if h.state == "running" and h.end_at <= now]:
            if entry.spec.on_timeout == "pause":
                logger.info("sandbox %s of %s reached its timeout: paused", entry.sandbox_id, entry.tenant)
                if await self._pause(entry, quiet=True):
                    self.paused_on_timeout += 1
                continue
            logger.info("sandbox %s of %s reached its timeout: killed", entry.sandbox_id, entry.tenant)
            self.killed_on_timeout += 1
            ended.append(entry.sandbox_id)
            await self._drop(entry)
        if self.config.idle_pause:
            limit = clock - self.config.idle_pause
            for entry in [h for h in self._held.values() if h.idle() and h.sandbox.last_active <= limit]:
                logger.info("sandbox %s of %s idle: paused", entry.sandbox_id, entry.tenant)
                if await self._pause(entry, quiet=True):
                    self.paused_idle += 1
        return ended

    def _rearm(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ control plane

    def _earlier_run(self) -> str:
        """What a client reconnecting after a restart is told: its sandboxes ended with the old server."""
        started = datetime.datetime.fromtimestamp(self.started, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"of a run of this server before its start at {started} UTC: sandboxes end with the server"

    def _make_home(self, sandbox_id: str) -> str | None:
        """The sandbox's own directory (its /home/user), which outlives a replaced session, as the
        disk of an E2B sandbox outlives its processes (`homes`); None without `durable_home`."""
        return None if self._homes is None else self._homes.make(sandbox_id)

    def spares_ready(self) -> int:
        """Sandboxes started ahead and waiting for a create (`warm_sandboxes`)."""
        return len(self._spares) if self._spares is not None else 0

    def count(self, tenant: str | None = None) -> int:
        """Live sandboxes (and ones being created) of `tenant`, or of everyone."""
        if tenant is None:
            return len(self._held) + sum(self._reserved.values())
        return sum(1 for h in self._held.values() if h.tenant == tenant) + self._reserved.get(tenant, 0)

    def check_timeout(self, timeout: Any) -> int:
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
            raise BadRequest("timeout must be a whole number of seconds, 0 or more")
        if timeout > self.config.max_timeout:
            raise BadRequest(
                f"timeout {timeout} s is above this server's limit of {self.config.max_timeout} s "
                "(max_timeout); ask for less and extend it with set_timeout"
            )
        return timeout

    async def create(self, tenant: str, spec: Spec) -> Held:
        """A new running sandbox of `tenant`, or `TooMany` when a cap is reached."""
        if self._closed:
            raise ServeError("the server is shutting down; no new sandboxes", status=503)
        if self.count(tenant) >= self.config.max_sandboxes_per_key:
            raise TooMany(
                f"this API key already has {self.config.max_sandboxes_per_key} sandboxes (the limit, "
                "max_sandboxes_per_key): kill one, or wait for one to reach its timeout"
            )
        if self.count() >= self.config.max_sandboxes:
            raise TooMany(
                f"the server holds {self.config.max_sandboxes} sandboxes (the limit, max_sandboxes); "
                "try again later"
            )
        self._reserved[tenant] = self._reserved.get(tenant, 0) + 1
        sandbox_id = new_sandbox_id()
        try:
            spare = self._spares.take(spec) if self._spares is not None else None
            home, executor = spare if spare is not None else await self._start(spec, sandbox_id)
        except Exception as exc:
            if isinstance(exc, ServeError):
                raise
            logger.warning("could not start a sandbox for %s: %s", tenant, exc)
            raise ServeError(f"could not start a sandbox: {exc}", status=500) from None
        finally:
            self._reserved[tenant] -= 1
            if not self._reserved[tenant]:
                del self._reserved[tenant]
        sandbox = ServedSandbox(
            sandbox_id=sandbox_id,
            tenant=tenant,
            access_token=secrets.token_urlsafe(32),
            executor=executor,
            template=spec.template,
            metadata=dict(spec.metadata),
            envs=dict(spec.envs),
        )
        entry = Held(sandbox=sandbox, spec=spec, end_at=time.time() + spec.timeout, home=home)
        if self._closed:  # shut down while this one was starting
            await _close_quietly(entry)
            raise ServeError("the server is shutting down; no new sandboxes", status=503)
        self._held[sandbox.sandbox_id] = entry
        self._rearm()
        if self._spares is not None:  # the next create like this one finds a sandbox started
            self._spares.refill(spec)
        logger.info("created sandbox %s for %s (%s s)", sandbox.sandbox_id, tenant, spec.timeout)
        return entry

    async def _start(self, spec: Spec, name: str) -> tuple[str | None, Executor]:
        """A new opened executor for `spec` on a new home named `name` (removed if it fails)."""
        home = self._make_home(name)
        try:
            executor = self._factory(spec, home)
            await executor.open()
        except BaseException:
            _remove(home)
            raise
        return home, executor

    async def _start_spare(self, spec: Spec) -> tuple[str | None, Executor]:
        return await self._start(spec, "spare-" + new_sandbox_id())

    def get(self, tenant: str, sandbox_id: str) -> Held:
        """The tenant's sandbox by id; another tenant's is as unknown as one that never was."""
        entry = self._held.get(sandbox_id)
        if entry is None or entry.tenant != tenant:
            raise SandboxNotFound(
                f"sandbox {_short(sandbox_id)} doesn't exist or you don't have access to it (it may have "
                f"been killed, reached its timeout, or {self._earlier_run()})"
            )
        return entry

    def list(self, tenant: str) -> list[Held]:
        return sorted(
            (h for h in self._held.values() if h.tenant == tenant), key=lambda h: h.sandbox.started_at
        )

    async def kill(self, tenant: str, sandbox_id: str) -> None:
        await self._drop(self.get(tenant, sandbox_id))

    def set_timeout(self, tenant: str, sandbox_id: str, timeout: Any) -> Held:
        """The sandbox now ends `timeout` seconds from now (E2B: shorter or longer)."""
        seconds = self.check_timeout(timeout)
        entry = self.get(tenant, sandbox_id)
        entry.end_at = time.time() + seconds
        self._rearm()
        return entry

    async def connect(self, tenant: str, sandbox_id: str, timeout: Any) -> tuple[Held, bool]:
        """The sandbox (resumed if it was paused: then True second), its lifetime extended to
        `timeout` from now if that is later (a running one's is never shortened)."""
        entry = self.get(tenant, sandbox_id)
        seconds = None if timeout is None else self.check_timeout(timeout)
        resumed = await self.resume(entry, seconds)
        if seconds is not None and not resumed:
            entry.end_at = max(entry.end_at, time.time() + seconds)
            self._rearm()
        entry.sandbox.touch()
        return entry, resumed

    async def pause(self, tenant: str, sandbox_id: str) -> bool:
        """Pause the tenant's sandbox; False when it already was."""
        return await self._pause(self.get(tenant, sandbox_id))

    async def _pause(self, entry: Held, *, quiet: bool = False) -> bool:
        async with entry.changing:
            if entry.state == "paused" or self._held.get(entry.sandbox_id) is not entry:
                return False
            if quiet and not entry.idle():  # a request arrived meanwhile: it keeps running
                return False
            try:
                await pausing.freeze(entry.sandbox.executor)
            except ServeError:
                if quiet:
                    logger.warning("could not pause sandbox %s", entry.sandbox_id, exc_info=True)
                    return False
                raise
            entry.state = "paused"
            return True

    async def resume(self, entry: Held, timeout: int | None = None) -> bool:
        """Continue a paused sandbox; its lifetime restarts (`timeout`, else its create's) unless it
        has longer left. False when it was running."""
        async with entry.changing:
            if entry.state != "paused":
                return False
            await pausing.thaw(entry.sandbox.executor)
            entry.state = "running"
            entry.end_at = max(
                entry.end_at, time.time() + (entry.spec.timeout if timeout is None else timeout)
            )
            entry.sandbox.touch()
            self._rearm()
            return True

    async def _drop(self, entry: Held) -> None:
        if self._held.get(entry.sandbox_id) is not entry:
            return
        del self._held[entry.sandbox_id]
        await _close_quietly(entry)

    # ------------------------------------------------------------------ in-sandbox requests

    def authenticate(self, headers: Mapping[str, str], port: int, path: str) -> Held:
        """The sandbox an in-sandbox request is for, its token checked in constant time, or
        `SandboxGone` (the same answer for a wrong token, another tenant's id, a killed sandbox and
        one that never was)."""
        sandbox_id = headers.get(SANDBOX_ID_HEADER, "")
        entry = self._held.get(sandbox_id)
        given = headers.get(ACCESS_TOKEN_HEADER)
        if given is None and entry is not None and port == INTERPRETER_PORT and _tokenless(path):
            return entry
        expected = entry.sandbox.access_token if entry is not None else "-" * 43
        matches = hmac.compare_digest((given or "").encode("utf-8", "replace"), expected.encode())
        if entry is None or not matches:
            raise SandboxGone(
                f"The sandbox was not found: {_short(sandbox_id)} is not a live sandbox of this token "
                f"(killed, timed out, or {self._earlier_run()})"
            )
        return entry

    async def resolve(self, request: Request) -> ServedSandbox:
        """The `Resolve` the in-sandbox apps take: the request's sandbox, authenticated, resumed if
        paused, touched."""
        port_text = request.headers.get(SANDBOX_PORT_HEADER, "")
        port = int(port_text) if port_text.isdigit() else 0
        entry = self.authenticate(request.headers, port, request.url.path)
        await self.resume(entry)
        entry.sandbox.touch()
        return entry.sandbox

    @asynccontextmanager
    async def using(self, entry: Held) -> AsyncIterator[None]:
        """An in-sandbox request in flight: the sandbox resumed first if paused, not paused while it
        runs, and touched at both ends (its idle time counts from the end)."""
        entry.active += 1
        entry.sandbox.touch()
        try:
            await self.resume(entry)
            yield
        finally:
            entry.active -= 1
            entry.sandbox.touch()
            self._rearm()

    @asynccontextmanager
    async def in_flight(self, tenant: str) -> AsyncIterator[None]:
        """Count a request of `tenant` while it is served; past `max_requests_per_key`, `TooMany`."""
        if self._in_flight.get(tenant, 0) >= self.config.max_requests_per_key:
            raise TooMany(
                f"this API key has {self.config.max_requests_per_key} requests in flight (the limit, "
                "max_requests_per_key): wait for some to finish"
            )
        self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        try:
            yield
        finally:
            self._in_flight[tenant] -= 1
            if not self._in_flight[tenant]:
                del self._in_flight[tenant]


async def _close_quietly(entry: Held) -> None:
    for watcher in list((entry.sandbox.watchers or {}).values()):  # envd's watchers: their streams end
        watcher.close()
    with anyio.CancelScope(shield=True):
        try:
            await entry.sandbox.executor.close()
        except Exception:  # one sandbox failing to close must not keep the others open
            logger.warning("closing sandbox %s failed", entry.sandbox_id, exc_info=True)
        await anyio.to_thread.run_sync(_remove, entry.home)


async def _discard(spare: tuple[str | None, Executor]) -> None:
    """End a spare no sandbox took (`spares`)."""
    home, executor = spare
    with anyio.CancelScope(shield=True):
        try:
            await executor.close()
        except Exception:
            logger.warning("closing a spare sandbox failed", exc_info=True)
        await anyio.to_thread.run_sync(_remove, home)


def _remove(directory: str | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def _tokenless(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in TOKENLESS_INTERPRETER_PATHS)


def _short(sandbox_id: str) -> str:
    return repr(sandbox_id if len(sandbox_id) <= 48 else sandbox_id[:45] + "...")


__all__ = ["ExecutorFactory", "Held", "Registry", "SandboxGone", "Spec", "new_sandbox_id"]
