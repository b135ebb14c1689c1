"""`Executor`: the one interface every backend shares, and what a session's life means to its caller.

`Executor` owns the life cycle (`ExecutorState`), the lock (one operation at a time), the options
every backend shares (`ExecutorOptions`), the static policy check, the wall-clock timeout, tool calls
back into the parent, respawn after a loss with `state_lost`, and stamping the result. A backend
supplies sessions through two hooks (the contract is `sandboxes.session`):

- `_new_session()` (required): start a session and return it ready to run. Backends that run our
  runner start a `Worker` and return `await self._runner_session(worker)`;
- `_close_backend()`: release what outlives single sessions, once, at `close()` and after a failed
  `open()` (default: nothing);
- `_forked_executor()` and `_open_on_fork()`: the executor a `fork()` returns (or a snapshot opens),
  before and as its forked session is set (default: a copy of this one's options; a backend whose
  sessions share something, like E2B's sandbox, shares it there).

No backend overrides a public method or touches the private state of this class.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import inspect
import math
import posixpath
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, ClassVar, Self, TypedDict, TypeVar, Unpack

import anyio

from .egress.policy import NetworkPolicy
from .errors import (
    BackendUnavailable,
    ExecutorBusy,
    ExecutorClosed,
    FileTooLarge,
    ForkError,
    ProtocolError,
    SandboxError,
    SandboxFileError,
)
from .events import (
    Event,
    EventStream,
    OutputEvent,
    ResultEvent,
    StreamBudget,
    ToolCallEvent,
    ToolResultEvent,
    stream_options,
)
from .models import ExecutionError, ExecutionResult, ForkReport, RunUsage
from .policy import Policy, prepare_code
from .runtime.protocol import (
    TIMEOUT,
    WORKER_CRASHED,
    InitRequest,
    StreamOptions,
    ToolCall,
    ToolResult,
)
from .session import (
    HANDSHAKE_TIMEOUT,
    KILL_TIMEOUT,
    OutputHandler,
    Release,
    RunnerSession,
    Session,
    SessionLost,
    ToolCaller,
)
from .toolbridge import ToolCalls, ToolFunction, checked_call, still_running
from .usage import UsageProbe
from .variables import encode_variables
from .worker import Worker

__all__ = [
    "DEFAULT_DOWNLOAD_LIMIT",
    "DEFAULT_OUTPUT_LIMIT",
    "DEFAULT_TIMEOUT",
    "Executor",
    "ExecutorOptions",
    "ExecutorState",
    "KILL_TIMEOUT",
    "Snapshot",
]

DEFAULT_TIMEOUT = 30.0
"""Seconds a run may take when the executor is given no `timeout`."""
DEFAULT_OUTPUT_LIMIT = 64_000
"""Characters kept of stdout (and of stderr): the first half and the last half, when longer."""
USAGE_TIMEOUT = 5.0
"""Seconds a usage reading may take (a metrics request) before the run's result goes without it."""
DEFAULT_DOWNLOAD_LIMIT = 256 * 1024 * 1024
"""Bytes `download()` returns at most when given no `max_bytes` (256 MiB)."""

OutputCallback = Callable[[OutputEvent], Any]
"""A `run()` callback for output: called with each `OutputEvent`, in order; may be async."""
T = TypeVar("T")


def _unbounded_at_process_level(policy: Policy) -> tuple[str, str] | None:
    """What of `policy` runs code outside the Python-level guards, and the option that keeps it
    inside (None: nothing does). The host's bare `process` level has no wall but those guards, so
    it refuses such a policy: unguarded code, or a program the code starts (a shell, `curl`, another
    interpreter), would have this machine's network and files, and run as root (no private user for
    the session) processes that `Limits.max_processes` does not bound."""
    if not policy.python_guards:
        return (
            "Policy(python_guards=False) runs code without the Python-level guards",
            "keep python_guards=True",
        )
    if policy.subprocess:
        return (
            "Policy(subprocess=True) lets the code start programs, which run outside the Python-level guards",
            "keep subprocess=False",
        )
    return None


class ExecutorState(enum.Enum):
    """Where an executor is in its life: `open()` moves it to OPEN, `close()` to CLOSED for good."""

    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class ExecutorOptions(TypedDict, total=False):
    """The options every backend takes, declared once (each backend adds its own beside them).

    policy: what the code may do (imports, builtins, files, network, limits). Default `Policy()`.
    timeout: wall-clock seconds per `run()`; past it the worker and all it started are killed. Default 30.
    env: the only environment variables the code sees. Default none.
    tools: functions the code may call by name; they run here, in the parent, not in the sandbox.
    workdir: the code's working directory (backend-specific meaning; a fresh one if None).
    stateless: run every snippet in a fresh namespace instead of keeping state. Default False.
    output_limit: characters kept of stdout and of stderr (head and tail). Default 64,000.
    measure_usage: read what each run used (`ExecutionResult.usage`: CPU, peak memory) from outside
        the sandbox. Default True; False leaves `usage` None and saves the readings' cost on every
        run (on the host about a quarter of a warm run: several /proc reads before and after it),
        for jobs that never look at it.
    track_artifacts: list the files each run created or changed (`ExecutionResult.artifacts`), from
        a look at the working directory before and after the run. Default True; False leaves
        `artifacts` None (not looked at, which is not "none written") and saves the two walks: for
        graders and benchmarks, whose programs' files nobody reads.
    """

    policy: Policy | None
    timeout: float
    env: Mapping[str, str] | None
    tools: Mapping[str, ToolFunction] | None
    workdir: str | None
    stateless: bool
    output_limit: int
    measure_usage: bool
    track_artifacts: bool


COMMON_OPTIONS = frozenset(ExecutorOptions.__annotations__)


class Executor(ABC):
    """Runs Python code in a sandbox session whose state persists between runs, like a notebook.

    Use it as an async context manager (or call `open()` and `close()`)::

        async with HostExecutor(policy=Policy(allowed_imports=["math"]), timeout=10) as ex:
            result = await ex.run("import math; print(math.pi)")

    Takes the common `ExecutorOptions` (policy, timeout, env, tools, workdir, stateless,
    output_limit, measure_usage, track_artifacts); each backend adds options of its own. An unknown option is a `TypeError`.
    """

    backend: ClassVar[str] = ""

    def __init__(self, **options: Unpack[ExecutorOptions]) -> None:
        unknown = set(options) - COMMON_OPTIONS
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown options: {', '.join(sorted(unknown))}")
        policy = options.get("policy")
        timeout = options.get("timeout", DEFAULT_TIMEOUT)
        output_limit = options.get("output_limit", DEFAULT_OUTPUT_LIMIT)
        if not (isinstance(timeout, int | float) and timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not isinstance(output_limit, int) or output_limit < 100:
            raise ValueError(f"output_limit must be at least 100 characters, got {output_limit!r}")
        if policy is not None and not isinstance(policy, Policy):
            raise TypeError(f"policy must be a sandboxes.Policy, not {type(policy).__name__}")
        self.policy = policy if policy is not None else Policy()
        self.timeout = float(timeout)
        self.env = {str(k): str(v) for k, v in (options.get("env") or {}).items()}
        self.tools: dict[str, ToolFunction] = dict(options.get("tools") or {})
        for name, function in self.tools.items():
            if not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"tool name {name!r} must be a Python identifier not starting with '_'")
            if not callable(function):
                raise TypeError(f"tool {name!r} is not callable")
        self.workdir: str | None = options.get("workdir")
        self.stateless = bool(options.get("stateless", False))
        self.output_limit = output_limit
        self.measure_usage = bool(options.get("measure_usage", True))
        self.track_artifacts = bool(options.get("track_artifacts", True))
        self._state = ExecutorState.UNOPENED
        self._current: Session | None = None
        self._state_lost_pending = False
        # An uncontended acquire need not yield to the event loop: a warm run is a fraction of a
        # millisecond, and that extra loop iteration was a twentieth of it.
        self._lock = anyio.Lock(fast_acquire=True)
        self._isolation = "not started"
        self.fork_report: ForkReport | None = None
        """For an executor made by `fork()`: what the fork copied and what it could not."""
        self._snapshots: list[Snapshot] = []
        self._from_snapshot: Snapshot | None = None
        self._closed_session: Session | None = None

    # ----------------------------------------------------------------- backend hooks

    @abstractmethod
    async def _new_session(self) -> Session:
        """Start a session (or take one from a warm pool) and return it ready to run."""

    async def _close_backend(self) -> None:  # noqa: B027 - an optional hook: nothing to release by default
        """Release what outlives single sessions (once, at `close()` and after a failed `open()`)."""

    def _forked_executor(self) -> Self:
        """An executor with this one's options and no session yet, for `fork()` to open."""
        child = copy.copy(self)
        child.tools = dict(self.tools)
        child.env = dict(self.env)
        child._state = ExecutorState.UNOPENED
        child._current = None
        child._state_lost_pending = False
        child._lock = anyio.Lock(fast_acquire=True)
        child._isolation = "not started"
        child.fork_report = None
        child._snapshots = []
        child._from_snapshot = None
        child._closed_session = None
        return child

    def _runner_init(self) -> InitRequest:
        """The runner's `init` request for this executor's options (a backend may adjust a copy)."""
        return {
            "op": "init",
            "policy": self.policy.runtime_config(),
            "env": self.env,
            "tools": sorted(self.tools),
            "stateless": self.stateless,
            "output_limit": self.output_limit,
        }

    async def _runner_session(
        self,
        worker: Worker,
        init: InitRequest | None = None,
        release: Release | None = None,
        *,
        initialised: bool = False,
    ) -> RunnerSession:
        """The runner's protocol over a started `worker`, handshake done; for `_new_session`.

        `release` disposes of the worker at a normal close (default: kill it). `initialised`: the
        worker's runner already answered `init` (`session.initialise_ahead`, by a pool), with the
        request `init or self._runner_init()` exactly: no round trip then."""
        refusal = _unbounded_at_process_level(self.policy) if worker.isolation == "process" else None
        if refusal is not None:
            what, remedy = refusal
            with anyio.CancelScope(shield=True):
                await worker.kill()
            raise BackendUnavailable(
                f"{what}, so it needs a boundary around the process, and this host backend has only "
                "the bare 'process' level: install bubblewrap (`apt-get install bubblewrap`) for the "
                f"'namespaces' level, or use the docker or e2b backend, or {remedy}"
            )
        init = init or self._runner_init()
        if initialised:
            return RunnerSession.initialised(worker, init["output_limit"], release)
        return await RunnerSession.start(worker, init, release)

    # ----------------------------------------------------------------- introspection

    @property
    def state(self) -> ExecutorState:
        """Unopened, open or closed."""
        return self._state

    @property
    def isolation(self) -> str:
        """Which isolation level is active for this session (see the docs of each backend)."""
        return self._isolation

    @property
    def session(self) -> Session | None:
        """The backend's live session, if one is (None before open, after close or a loss). For
        introspection: go through the executor's methods to use it."""
        return self._current

    # ----------------------------------------------------------------- lifecycle

    async def open(self) -> Self:
        """Start the session. Raises `BackendUnavailable` when the backend cannot work here."""
        if self._state is ExecutorState.CLOSED:
            raise ExecutorClosed("this executor was closed; create a new one")
        if self._state is ExecutorState.UNOPENED:
            async with self._lock:
                if self._state is ExecutorState.UNOPENED and self._from_snapshot is not None:
                    self._open_on_fork(*await self._from_snapshot.kept._fork_session())
                if self._state is ExecutorState.UNOPENED:
                    try:
                        await self._live_session()
                    except BaseException:
                        with anyio.CancelScope(shield=True):
                            await self._close_backend()
                        raise
                    self._state = ExecutorState.OPEN
        return self

    async def close(self) -> None:
        """End the session and everything it started. Safe to call twice, and during a run (which then
        ends with the session lost).

        An idle session may be ended in the background (host: its worker is killed and reaped by a
        reaper thread, so `close()` returns at once); `wait_closed()` waits until nothing of it is
        left, and the process waits for every such session at exit."""
        if self._state is ExecutorState.CLOSED:
            return
        self._state = ExecutorState.CLOSED
        with anyio.CancelScope(shield=True):
            for snapshot in self._snapshots:
                await snapshot.close()
            session, self._current = self._current, None
            self._closed_session = session
            if session is not None:
                if self._lock.locked():  # an operation is in progress: its state is unknown
                    await session.discard()
                else:
                    await session.close()
            await self._close_backend()

    async def wait_closed(self) -> None:
        """After `close()`: wait until nothing of the session is left (its processes killed and
        reaped, its private user and directory released). Returns at once before a close."""
        session = self._closed_session
        if session is not None:
            with anyio.move_on_after(KILL_TIMEOUT * 3):
                await session.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _check_usable(self) -> None:
        if self._state is ExecutorState.CLOSED:
            raise ExecutorClosed("this executor was closed; create a new one")
        if self._state is ExecutorState.UNOPENED:
            raise ExecutorClosed("call `await executor.open()` or use `async with` before run()")

    async def _live_session(self) -> tuple[Session, bool]:
        """The current session, replaced first if it died while idle; and whether it is a new one."""
        session = self._current
        if session is not None and not await session.alive():
            await self._discard(session)
            session = None
        if session is not None:
            return session, False
        session = await self._new_session()
        if self._state is ExecutorState.CLOSED:  # closed while it started
            await session.discard()
            raise ExecutorClosed("this executor was closed while its session started")
        self._current = session
        self._isolation = session.isolation
        return session, True

    async def _discard(self, session: Session, *, report: bool = True) -> None:
        """Replace a session whose state is unknown; with `report`, the next run says `state_lost`."""
        if self._current is session:
            self._current = None
        with anyio.CancelScope(shield=True):
            await session.discard()
        if report:
            self._state_lost_pending = True

    # ----------------------------------------------------------------- running code

    async def run(
        self,
        code: str | bytes,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_output: OutputHandler | None = None,
        **budget: Unpack[StreamBudget],
    ) -> ExecutionResult:
        """Run `code` in the session and return what happened. Never raises because of the code.

        With `on_stdout` / `on_stderr`, each is called with the `OutputEvent`s of its stream while the
        code runs (within the stream's `budget`, see `stream`); a callback may be sync or async and
        is called (awaited) in order, off the channel's read loop; a callback that raises ends the
        run as a cancellation does (the session is replaced) and the error propagates. The result is
        the same as without callbacks.

        `on_output` is the low-level hook instead (for forwarding a stream elsewhere): a plain
        callable that must not block, called on the channel's read loop with the `OutputEvent`s of
        both streams, in order with the run's tool calls; no buffer of this side is involved."""
        if on_output is not None:
            if on_stdout is not None or on_stderr is not None:
                raise TypeError("give on_output, or on_stdout/on_stderr, not both")
            options, _ = stream_options(budget)
            self._check_usable()
            return await self._run_stamped(code, on_output, None, options)
        if on_stdout is None and on_stderr is None:
            if budget:
                stream_options(budget)  # a bad option is an error even when nothing streams
            self._check_usable()
            return await self._run_stamped(code)
        result: ExecutionResult | None = None
        async with self.stream(code, **budget) as events:
            async for event in events:
                if isinstance(event, OutputEvent):
                    callback = on_stdout if event.stream == "stdout" else on_stderr
                    if callback is not None:
                        value = callback(event)
                        if inspect.isawaitable(value):
                            await value
                elif isinstance(event, ResultEvent):
                    result = event.result
        assert result is not None  # the stream's last event is its result
        return result

    @contextlib.asynccontextmanager
    async def stream(self, code: str | bytes, **budget: Unpack[StreamBudget]) -> AsyncIterator[EventStream]:
        """Run `code` and watch it: an async context manager over the run's events::

            async with ex.stream("for i in range(3): print(i)") as events:
                async for event in events:
                    ...  # OutputEvent, ToolCallEvent, ToolResultEvent; last a ResultEvent

        The block holds the executor's lock and the run's timeout; the last event is a `ResultEvent`
        with what `run()` returns for the code. Leaving the block before it cancels the run: the
        session is replaced and the next run says `state_lost`. `budget` (`StreamBudget`): `chars`
        and `chars_per_second` bound what the sandbox streams (a token bucket; past it output is
        dropped and counted in `OutputEvent.dropped`, the result is unaffected), `buffer` the output
        events held here for a slow consumer (past it, dropped and counted too)."""
        options, limit = stream_options(budget)
        self._check_usable()
        events = EventStream(limit)

        async def produce() -> None:
            try:
                result = await self._run_stamped(code, events.put_output, events.put, options)
            except Exception as exc:  # misuse or a backend failure: the consumer's iteration raises it
                events.close(exc)
                return
            except BaseException:
                events.close()
                raise
            events.put(ResultEvent(result=result))
            events.close()

        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(produce)
            try:
                yield events
            except Exception as exc:  # raised below, as itself: the group would wrap it in a group
                failure = exc
            finally:
                group.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _run_stamped(
        self,
        code: str | bytes,
        on_output: OutputHandler | None = None,
        on_event: Callable[[Event], None] | None = None,
        stream: StreamOptions | None = None,
    ) -> ExecutionResult:
        async with self._lock:
            started = time.perf_counter()
            result = await self._run_locked(code, on_output, on_event, stream)
            result.duration = time.perf_counter() - started
            result.backend = self.backend
            return result

    def _tool_caller(self, tools: ToolCalls, on_event: Callable[[Event], None] | None) -> ToolCaller:
        if on_event is None:
            return tools.call
        emit = on_event

        async def call_and_report(call: ToolCall) -> ToolResult:
            checked = checked_call(call)  # before anything of it is reported
            emit(ToolCallEvent(name=checked.name, args=list(checked.args), kwargs=dict(checked.kwargs)))
            reply = await tools.run(checked)
            error = reply.get("error")
            emit(
                ToolResultEvent(
                    name=checked.name,
                    ok=error is None,
                    error=f"{error['type']}: {error['message']}" if error else None,
                )
            )
            return reply

        return call_and_report

    async def _run_locked(
        self,
        code: str | bytes,
        on_output: OutputHandler | None = None,
        on_event: Callable[[Event], None] | None = None,
        stream: StreamOptions | None = None,
    ) -> ExecutionResult:
        if len(code) > 50_000:  # parsing up to max_code_bytes takes seconds: not on the event loop
            text, problem = await anyio.to_thread.run_sync(prepare_code, code, self.policy, list(self.tools))
        else:
            text, problem = prepare_code(code, self.policy, extra_names=self.tools)
        if problem is not None:
            return ExecutionResult(error=problem)
        assert text is not None
        session, _ = await self._live_session()
        state_lost, self._state_lost_pending = self._state_lost_pending, False
        limit = self.timeout + session.timeout_backstop
        session.run_timeout = self.timeout
        session.track_artifacts = self.track_artifacts
        probe = session.usage_probe() if self.measure_usage else None
        if probe is not None and probe.local:
            await probe.start()
        elif probe is not None:
            with anyio.move_on_after(USAGE_TIMEOUT):
                await probe.start()
        tools = ToolCalls(self.tools)
        try:
            with anyio.fail_after(limit):
                result = await session.run(text, self._tool_caller(tools, on_event), on_output, stream)
            if probe is not None:
                result.usage = await (probe.stop() if probe.local else _stop_probe(probe))
            if session.egress is not None:
                result.network = await session.egress.take_report()
        except TimeoutError:
            usage = await _stop_probe(probe)  # before the kill: a stopped run reports what it used
            await self._discard(session, report=False)
            running = tools.stop()
            if session.timeout_backstop:
                message = (
                    f"the session did not answer within {limit:g} s (its timeout of {self.timeout:g} s and "
                    f"{session.timeout_backstop:g} s more); it was dropped and the next run starts a "
                    "fresh one; variables from earlier runs are lost"
                )
            else:
                message = (
                    f"the code ran longer than {self.timeout:g} s and was stopped; "
                    "variables from earlier runs are lost"
                )
            return ExecutionResult(
                timed_out=True,
                state_lost=True,
                error=ExecutionError(type=TIMEOUT, message=message + still_running(running)),
                usage=usage,
                tools_running=running,
            )
        except SessionLost as exc:
            await self._discard(session, report=False)
            return ExecutionResult(
                state_lost=True,
                oom=exc.oom,
                error=ExecutionError(
                    type=WORKER_CRASHED,
                    message=f"the sandbox process ended during the run ({exc.detail}); "
                    "variables from earlier runs are lost",
                ),
            )
        except ProtocolError as exc:
            await self._discard(session, report=False)
            return ExecutionResult(
                state_lost=True,
                error=ExecutionError(type=WORKER_CRASHED, message=f"{exc}; the sandbox was replaced"),
            )
        except BaseException:
            # Cancelled (or failed) mid-conversation: the session's state is unknown, so replace it.
            await self._discard(session)
            raise
        result.state_lost = result.state_lost or state_lost
        # A session that enforces the timeout elsewhere (Ray's node) answers a stopped run itself, and
        # a blocking tool it had asked for may still run here.
        result.tools_running = tools.stop()
        if result.tools_running and result.timed_out and result.error is not None:
            result.error.message += still_running(result.tools_running)
        return result

    async def set_network(self, network: bool | NetworkPolicy) -> None:
        """Change where the code may connect; the live session's next connection follows the new rules.

        `network` is what `Policy.network` takes: a `NetworkPolicy`, True (the public internet only)
        or False (every connection refused from now on). A session opened without network has no
        gateway to change: turning it on raises `ValueError` (open an executor with network on), as
        does a live session whose network is not behind the gateway (e2b's). Sessions that replace
        this one (after a loss) start with the new rules."""
        new = self.policy.model_copy(update={"network": network})
        rules = new.network_policy
        async with self._lock:
            self._check_usable()
            session = self._current
            on = session is not None and session.network_on
            if not on and rules is not None and self.policy.network_policy is None:
                raise ValueError(
                    "this executor was opened without network, so its session has no egress gateway; "
                    "open one with Policy(network=...) to change its rules later"
                )
            if session is not None and not on and self.policy.network_policy is not None:
                raise ValueError(
                    f"the {self.backend} backend cannot change a live session's network rules (its "
                    "network is not behind this machine's egress gateway); close the executor and open "
                    "one with the new Policy(network=...)"
                )
            if session is not None and on:
                await session.set_network(rules)
            self.policy = new

    # ----------------------------------------------------------------- fork

    async def fork(self) -> Self:
        """A new, independent executor whose session starts as a copy of this one's: its variables,
        imports and loaded data, and the working directory's files. The two diverge from then on.

        The caller owns the child (close it, or use it as an async context manager); closing either
        leaves the other running. The child has this executor's options (policy, limits, timeout,
        tools, which it calls in this process as the parent does) and its own channel.
        `child.fork_report` says what was copied and what a fork cannot copy (the code's threads and
        child processes; open sockets end up shared by both). See docs/fork.md for each backend.

        Raises `ExecutorBusy` while a run or another operation is in progress, `ExecutorClosed`
        before `open()` or after `close()`, and `ForkError` where the backend or this session cannot
        fork, or the fork failed (then this session is replaced unless the fork was refused with
        an answer, and the next run says `state_lost`)."""
        forked, report = await self._fork_session()
        child = self._forked_executor()
        child._open_on_fork(forked, report)
        return child

    def _open_on_fork(self, forked: Session, report: ForkReport) -> None:
        """Open this (unopened) executor on a forked session."""
        self._current, self._isolation = forked, forked.isolation
        self._state = ExecutorState.OPEN
        self.fork_report = report

    async def snapshot(self) -> Snapshot:
        """Keep a copy of this session as it is now, to open sessions from later: each
        `open_executor(backend, from_snapshot=snapshot)` (or `snapshot.executor()`) is a fork of the
        kept copy, which never runs code itself. A snapshot lives as long as this executor: its
        `close()` closes the snapshot too (executors already opened from it go on). Raises as
        `fork()` does; a backend that cannot fork cannot keep snapshots (`ForkError`)."""
        kept = await self.fork()
        snapshot = Snapshot(kept)
        self._snapshots.append(snapshot)
        return snapshot

    async def _fork_session(self) -> tuple[Session, ForkReport]:
        self._check_usable()
        if self._lock.locked():
            raise ExecutorBusy(
                "fork() needs the session idle, and a run or another operation is in progress; "
                "fork after it returns"
            )
        async with self._lock:
            session = self._current
            if session is None or not await session.alive():
                raise ForkError(
                    "this executor's session was lost, so there is no state to copy (its next run "
                    "starts a fresh session); run again, then fork"
                )
            limit = HANDSHAKE_TIMEOUT + self.timeout + session.timeout_backstop
            try:
                with anyio.fail_after(limit):
                    forked, report = await session.fork()
            except ForkError:
                raise  # refused with an answer: this session is intact
            except (TimeoutError, SessionLost, ProtocolError) as exc:
                await self._discard(session)
                raise ForkError(
                    f"the fork did not complete ({type(exc).__name__}: {exc}); this session was "
                    "replaced and its next run says state_lost"
                ) from exc
            except BaseException:
                await self._discard(session)
                raise
        return forked, report

    # ----------------------------------------------------------------- state and files

    async def reset(self) -> None:
        """Forget every variable of the session (the working directory's files stay).

        A reset that does not end with the runner's answer (timed out, cancelled, lost) replaces the
        session instead, and the next run says `state_lost`: whether the reset happened is unknown."""
        self._check_usable()
        async with self._lock:
            session, new = await self._live_session()
            if not new:
                try:
                    with anyio.fail_after(self.timeout + session.timeout_backstop):
                        await session.reset()
                except (TimeoutError, SessionLost, ProtocolError):
                    await self._discard(session)
                    return
                except BaseException:
                    await self._discard(session)
                    raise
            self._state_lost_pending = False

    async def send_variables(self, variables: Mapping[str, Any]) -> None:
        """Bind `variables` in the session, as if the code had assigned them, each value of its own
        type: every type of the values codec (docs/values.md) crosses whole. All are bound or none.

        Checked here before anything is sent: a name must be an identifier not starting with '_'
        and not a tool's or the runner's (`final_answer`, `ToolError`, `PolicyViolation`), else
        `ValueError`; a value the codec cannot carry is a `TypeError` naming its part and type;
        more than 16 MiB of them is a `ValueError` (upload large data as a file). They live in the
        session as the code's own variables do: `reset()` and a replaced session (`state_lost`)
        forget them, and a stateless executor cannot keep them (`ValueError`)."""
        if self.stateless:
            raise ValueError(
                "a stateless executor starts every run with a fresh namespace, so variables sent in "
                "would be gone before the next run; define them in the code you run instead"
            )
        encoded = encode_variables(variables, self.tools)
        self._check_usable()
        if not encoded:
            return
        async with self._lock:
            session, _ = await self._live_session()
            try:
                with anyio.fail_after(self.timeout + session.timeout_backstop):
                    refused = await session.define(encoded)
            except (TimeoutError, SessionLost, ProtocolError) as exc:
                await self._discard(session)
                raise SandboxError(
                    f"the sandbox did not bind the variables ({exc or type(exc).__name__}) and was "
                    "replaced; the next run starts a fresh session: send them again"
                ) from exc
            except BaseException:
                await self._discard(session)
                raise
        if refused is not None:
            raise ValueError(f"the sandbox bound none of the variables: {refused}")

    async def upload(self, path: str, data: bytes | str) -> None:
        """Write a file into the working directory (`path` is relative to it)."""
        self._check_usable()
        relative = _relative_path(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        async with self._lock:
            await self._transfer(path, lambda session: session.upload(relative, payload))

    async def download(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a file from the working directory (`path` is relative to it), at most `max_bytes`
        bytes of it (None: `DEFAULT_DOWNLOAD_LIMIT`, 256 MiB).

        Every backend counts the bytes as they arrive and stops reading one past the cap, so a huge
        or growing file costs this process no more than the cap: past it, `FileTooLarge` (a
        `SandboxFileError`), and the session stays as it was. A size the sandbox reports is never
        trusted. A cap that is not a whole number of bytes >= 0 is a `ValueError`."""
        cap = _download_cap(max_bytes)
        self._check_usable()
        relative = _relative_path(path)
        async with self._lock:
            data = await self._transfer(path, lambda session: session.download(relative, cap))
        if len(data) > cap:  # whatever the backend did, never more than was asked for
            raise FileTooLarge.over(path, cap)
        return data

    async def _transfer(self, path: str, operation: Callable[[Session], Awaitable[T]]) -> T:
        session, _ = await self._live_session()
        try:
            return await operation(session)
        except SandboxFileError:
            raise  # refused, with an answer: the session is intact
        except SessionLost as exc:
            await self._discard(session)
            raise SandboxFileError(
                f"the sandbox was lost while transferring {path!r} ({exc.detail}); "
                "the next run starts a fresh session"
            ) from exc
        except BaseException:
            await self._discard(session)
            raise


class Snapshot:
    """A session's state kept for later (`Executor.snapshot()`): a paused fork that never runs code.
    Every executor opened from it starts as a fork of it; it closes with the executor that made it."""

    def __init__(self, kept: Executor) -> None:
        self.kept = kept

    @property
    def backend(self) -> str:
        return self.kept.backend

    @property
    def closed(self) -> bool:
        return self.kept.state is ExecutorState.CLOSED

    def executor(self) -> Executor:
        """An unopened executor that opens as a fork of this snapshot (its options are the
        snapshot's: the policy and limits are part of the state it copies)."""
        if self.closed:
            raise ExecutorClosed(
                "this snapshot was closed (with the executor that made it); take a new snapshot"
            )
        opened = self.kept._forked_executor()
        opened._from_snapshot = self
        return opened

    async def close(self) -> None:
        await self.kept.close()


async def _stop_probe(probe: UsageProbe | None) -> RunUsage | None:
    """The probe's reading, bounded and shielded (it runs on the way to a kill, too)."""
    if probe is None:
        return None
    with anyio.CancelScope(shield=True), anyio.move_on_after(USAGE_TIMEOUT):
        return await probe.stop()
    return None


def _download_cap(max_bytes: object) -> int:
    """`download()`'s cap in bytes: `DEFAULT_DOWNLOAD_LIMIT` for None, else a whole number >= 0."""
    if max_bytes is None:
        return DEFAULT_DOWNLOAD_LIMIT
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(
            f"max_bytes must be a whole number of bytes >= 0 (or None for the default of "
            f"{DEFAULT_DOWNLOAD_LIMIT:,}), got {max_bytes!r}"
        )
    return max_bytes


def _relative_path(path: str) -> str:
    """Normalise a user path to one inside the working directory, or refuse it."""
    if not path or "\x00" in path:
        raise SandboxFileError(f"invalid file path {path!r}")
    normal = posixpath.normpath(path.replace("\\", "/"))
    if normal.startswith("/") or normal == ".." or normal.startswith("../") or normal == ".":
        raise SandboxFileError(
            f"{path!r} is outside the working directory; give a path relative to it, e.g. 'data/in.csv'"
        )
    return normal
