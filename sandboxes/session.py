"""The contract between `Executor` and a backend: the `Session`, and the runner's protocol over a `Worker`.

`Executor` (executor.py) owns what a session's life means to its caller: the life cycle
(`ExecutorState`), the lock that keeps one operation at a time, the timeout, respawn after a loss,
`state_lost`, and stamping results. A backend supplies sessions and nothing else, through two hooks
of `Executor`:

- ``_new_session()`` (required): start a session somewhere and return it ready to run;
- ``_close_backend()`` (optional): release what outlives single sessions (E2B's sandbox), once, at
  `close()` and after a failed `open()`.

A `Session` implements every operation of the protocol: run (optionally streaming its output to an
`on_output` callable while it runs), reset, upload, download, close, discard, and fork where the
backend can copy a live session (the default refuses with `ForkError`). Most backends run our
runner inside their boundary and reach it through a `Worker` (a byte channel): they return a
`RunnerSession`, the one implementation of the runner's protocol. A backend that forwards whole
sessions to an executor elsewhere (Ray: a node runs its own executor, with its own lock, timeout and
respawn) implements `Session` directly and says how long past the timeout to wait for it
(`timeout_backstop`).

What a session raises tells the executor what happened, and the executor alone decides what follows:

- `SessionLost`: the sandbox ended or can no longer be reached (crash, OOM kill, a lost node);
- `ProtocolError`: the other side sent something that is not the protocol;
- `SandboxFileError` (upload, download): the transfer was refused; the session is intact;
- anything else, and a cancellation or the executor's timeout, leaves the session's state unknown.

A session may also measure its runs from outside the sandbox (`Session.usage_probe`, a
`UsageProbe` the executor starts before the code is sent and stops after the reply, or before the
kill of a timed-out run): the executor stamps what it reads as `result.usage`. A `RunnerSession`
asks its `Worker` for one; a session that returns None leaves `usage` as its result has it (Ray:
measured by the node's executor).

One rule, applied by the executor to every operation: an operation that did not end with its
answer (cancelled, timed out, malformed, lost) discards the session, and the next run says
`state_lost`.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import anyio

from .errors import ForkError, ProtocolError, SandboxFileError, WorkerStartError
from .events import DEFAULT_STREAM_CHARS, DEFAULT_STREAM_RATE, OutputEvent
from .models import Artifact, ExecutionError, ExecutionResult, ForkReport
from .runtime import bounds, values
from .runtime.protocol import (
    UNCARRIABLE_VALUE,
    DefineReply,
    DefineRequest,
    Fatal,
    ForkRequest,
    InitReply,
    InitRequest,
    OutputMessage,
    Reply,
    Request,
    RunReply,
    RunRequest,
    StreamOptions,
    ToolCall,
    ToolResult,
)
from .toolbridge import for_run, next_run_number
from .usage import UsageProbe
from .wire import check
from .worker import ForkPlan, Worker, WorkerExited

if TYPE_CHECKING:
    from .egress.policy import NetworkPolicy
    from .egress.service import EgressLink

HANDSHAKE_TIMEOUT = 30.0
KILL_TIMEOUT = 10.0
MAX_PID = 1 << 22
"""Linux's largest pid (``PID_MAX_LIMIT``): a fork's reply naming more is not the protocol."""
MAX_COUNT = 1 << 31
"""The largest count (threads, files...) a fork's reply may carry."""
MAX_BYTES = 1 << 60
"""The largest byte count a fork's greeting may carry."""

ToolCaller = Callable[[ToolCall], Awaitable[ToolResult]]
"""How a session asks the executor to run a tool the code called (the tool runs in the parent)."""

OutputHandler = Callable[[OutputEvent], None]
"""Where a streamed run's output goes: a plain callable that must not block (it runs on the read loop)."""


class SessionLost(Exception):
    """The session's sandbox ended, or can no longer be reached, during an operation.

    `detail` says how (exit code, signal, "the node was lost"); `oom` when it was killed for memory.
    """

    def __init__(self, detail: str, *, oom: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.oom = oom


class Session(ABC):
    """One live sandbox session, as a backend provides it to `Executor`.

    The executor calls one operation at a time (it holds its lock), applies the timeout around
    `run` and `reset`, and calls `discard` when an operation did not end with its answer. A session
    never retries, respawns or reports `state_lost` itself: that is the executor's job.
    """

    isolation: str = "process"
    """The isolation level this session runs under (see each backend's docs)."""
    egress: EgressLink | None = None
    """A network-on session's place in the egress gateway (its rules, its connection report); the
    backend sets it, the session's close and discard end it."""

    @property
    def network_on(self) -> bool:
        """Whether the session has an egress gateway whose rules `set_network` changes."""
        return self.egress is not None

    async def set_network(self, rules: NetworkPolicy | None) -> None:
        """New rules for the session's next connection (None: refuse every connection from now on)."""
        if self.egress is not None:
            await self.egress.set_policy(rules)

    timeout_backstop: float = 0.0
    """Seconds past the executor's timeout before it gives up on this session: 0 for a session whose
    sandbox the executor's timeout kills; more for one that forwards to an executor that enforces
    the timeout next to the sandbox and answers with the timed-out result itself (Ray)."""
    run_timeout: float | None = None
    """The executor's timeout for the run about to start, set by the executor before each run: a
    session whose timeout is enforced elsewhere (Ray's node) passes it on, so a changed `timeout`
    holds there too."""
    track_artifacts: bool = True
    """The executor's `track_artifacts` for the run about to start, set by the executor before each
    run: False asks the sandbox not to look at the working directory (the result's `artifacts` is
    None)."""

    async def alive(self) -> bool:
        """A cheap check before an operation, so a session that died while idle is replaced before the
        next snippet is sent. Sessions that cannot tell cheaply keep this default."""
        return True

    def usage_probe(self) -> UsageProbe | None:
        """A fresh probe that measures the next run, or None: the results then carry the usage the
        backend measured elsewhere (Ray: the node's executor), or none."""
        return None

    @abstractmethod
    async def run(
        self,
        code: str,
        call_tool: ToolCaller,
        on_output: OutputHandler | None = None,
        stream: StreamOptions | None = None,
    ) -> ExecutionResult:
        """Run checked code and return its result, every part bounded; tool calls go to `call_tool`.

        With `on_output`, the run's output goes to it as it is written, within the budget `stream`
        (the executor always passes one with `on_output`); the result is the same as without."""

    @abstractmethod
    async def reset(self) -> None:
        """Forget every variable of the session (the working directory's files stay)."""

    @abstractmethod
    async def define(self, variables: dict[str, Any]) -> str | None:
        """Bind variables in the session, all or none: `variables` maps checked names to values in
        the codec's tagged form (`runtime/values.py`), already bounded. None when they were bound;
        else the sandbox's reason for binding none of them (the session is intact)."""

    @abstractmethod
    async def upload(self, path: str, data: bytes) -> None:
        """Write a file at `path`, relative to the working directory (already validated)."""

    @abstractmethod
    async def download(self, path: str, max_bytes: int) -> bytes:
        """Read a file at `path`, relative to the working directory (already validated): `FileTooLarge`
        once more than `max_bytes` arrived, counted as they arrive, never from a size the sandbox
        reports (the executor checks what is returned again)."""

    @abstractmethod
    async def close(self) -> None:
        """End an idle session normally (it may be recycled where the backend can prove it clean)."""

    async def wait_closed(self) -> None:  # noqa: B027 - optional: most closes end everything at once
        """After `close()`: wait until everything of the session is gone, where the backend ends
        sessions in the background (host: the reaper thread)."""

    async def fork(self) -> tuple[Session, ForkReport]:
        """A new, independent session that starts with a copy of this one's state and files (the
        session is idle). Raise `ForkError` for a fork refused with this session intact; anything
        else leaves this session's state unknown."""
        raise ForkError(f"sessions of this backend ({type(self).__name__}) cannot be forked")

    async def discard(self) -> None:
        """End a session whose state is unknown: kill it and all it started. Idempotent, bounded,
        never raises. Default: `close()`."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_TIMEOUT):
            try:
                await self.close()
            except Exception:
                pass


Release = Callable[[Worker], Awaitable[None]]


class RunnerSession(Session):
    """The runner's protocol (`runtime/protocol.py`) over a `Worker`: the one implementation that every
    backend running our runner shares. Start it with `start`, which sends `init` and waits for the
    handshake, or, over a worker whose handshake was done ahead (`initialise_ahead`), with
    `initialised`."""

    def __init__(self, worker: Worker, output_limit: int, release: Release | None = None) -> None:
        self.worker = worker
        self.output_limit = output_limit
        self._release = release
        self.isolation = worker.isolation
        self.handshake_seconds: float | None = None
        """How long the open waited for the runner's answer to `init` (for breakdowns: `bench humaneval`);
        0 for a session whose handshake a pool did ahead (`initialised`)."""
        self.exec_seconds: float | None = None
        """Of the last run this session's runner answered, the seconds the code itself ran, as the
        runner reports them (None before a run, after one without an answer, or from a runner that
        does not report them; a run the executor refused before sending it leaves the previous
        figure). For breakdowns only (`bench latency`): code without the Python-level guards can forge it."""
        self.runner_seconds: float | None = None
        """Of the last run, the runner's whole time on it (the code and the runner's own work), as
        reported by the runner; the same caveats as `exec_seconds`."""
        self.after_first_run: Callable[[], None] | None = None
        """Called once, when the session's first run has ended (or at its close or discard, if it
        never ran): for a backend's work that would otherwise compete with that run for the CPU
        (host: topping its pools up). Must not block or raise."""
        worker.line_limit = bounds.line_limit(output_limit)
        self._probe_asked = False  # for the run about to start
        self._only_runs = False
        """Whether nothing but runs went on since the last run's reply (`artifacts_from_last`)."""
        self._probe: UsageProbe | None = None
        """The probe handed out for the last run, while it may measure the next one too
        (`UsageProbe.continues`)."""
        self._tagged = True
        """Whether the last line received holds the codec's tag (else no value in it needs decoding)."""

    @classmethod
    def initialised(cls, worker: Worker, output_limit: int, release: Release | None = None) -> RunnerSession:
        """A session over a worker whose runner already answered its `init` (`initialise_ahead`, done
        by a pool before anyone asked): no round trip. Its `handshake_seconds` is 0, the time this
        open waited for the handshake (the handshake itself was paid ahead, off the caller's path)."""
        if worker.channel_token is None:
            raise ProtocolError("this worker's runner has not answered an init request")
        session = cls(worker, output_limit, release)
        session.handshake_seconds = 0.0
        return session

    @classmethod
    async def start(cls, worker: Worker, init: InitRequest, release: Release | None = None) -> RunnerSession:
        """Shake hands with a started runner; on any failure the worker is killed before this raises."""
        session = cls(worker, init["output_limit"], release)
        started = time.perf_counter()
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                await session._request(init, _no_tools)
            session.handshake_seconds = time.perf_counter() - started
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await worker.kill()
            if isinstance(exc, WorkerExited):
                info = await worker.exit_info()
                raise WorkerStartError(f"the sandbox runner ended during its start ({info.detail})") from exc
            if isinstance(exc, TimeoutError):
                raise WorkerStartError(
                    f"the sandbox runner did not answer its start within {HANDSHAKE_TIMEOUT:g} s"
                ) from exc
            raise
        return session

    async def alive(self) -> bool:
        return await self.worker.alive()

    def usage_probe(self) -> UsageProbe | None:
        self._probe_asked = True
        probe = self._probe
        if probe is None:
            probe = self.worker.usage_probe()
            if probe is not None and probe.continues:
                self._probe = probe
        return probe

    def _not_only_runs(self) -> None:
        """Something other than a measured run went on in the session: the next run's probe reads
        afresh, and its runner lists the working directory afresh before it."""
        self._probe = None
        self._only_runs = False

    async def run(
        self,
        code: str,
        call_tool: ToolCaller,
        on_output: OutputHandler | None = None,
        stream: StreamOptions | None = None,
    ) -> ExecutionResult:
        if not self._probe_asked:  # a run not measured: the next one cannot count from the last
            self._not_only_runs()
        self._probe_asked = False
        request: RunRequest = {"op": "run", "code": code, "run": next_run_number()}
        if not self.track_artifacts:
            request["artifacts"] = False
        elif self._only_runs:
            request["artifacts_from_last"] = True
        self._only_runs = False
        gate = None
        if on_output is not None:
            request["stream"] = stream or {
                "chars": DEFAULT_STREAM_CHARS,
                "chars_per_second": DEFAULT_STREAM_RATE,
            }
            gate = OutputGate(request["stream"], on_output)
        self.exec_seconds = self.runner_seconds = None
        try:
            reply = await self._exchange(request, for_run(request["run"], call_tool), gate)
        finally:
            self._first_run_ended()
        if gate is not None:
            gate.flush()
        # checked by `_request`; the reply was the last line received
        result = result_from_reply(cast(RunReply, reply), self.output_limit, self._tagged)
        self._only_runs = True
        self.exec_seconds = reported_seconds(reply.get("exec_seconds"))
        self.runner_seconds = reported_seconds(reply.get("runner_seconds"))
        return result

    async def reset(self) -> None:
        self._not_only_runs()
        await self._exchange({"op": "reset"}, _no_tools)

    async def define(self, variables: dict[str, Any]) -> str | None:
        self._not_only_runs()
        request: DefineRequest = {"op": "define", "variables": variables}
        reply = cast(DefineReply, await self._exchange(request, _no_tools))
        return None if reply["error"] is None else bounds.clipped(reply["error"], bounds.ERROR_MESSAGE_LIMIT)

    async def upload(self, path: str, data: bytes) -> None:
        self._not_only_runs()
        try:
            await self.worker.write_file(path, data)
        except WorkerExited as exc:
            raise SessionLost(str(exc)) from exc
        except OSError as exc:
            raise SandboxFileError(f"could not write {path!r} in the sandbox: {exc}") from exc

    async def download(self, path: str, max_bytes: int) -> bytes:
        self._not_only_runs()
        try:
            return await self.worker.read_file(path, max_bytes)
        except WorkerExited as exc:
            raise SessionLost(str(exc)) from exc
        except OSError as exc:
            raise SandboxFileError(f"could not read {path!r} from the sandbox: {exc}") from exc

    async def close(self) -> None:
        self._first_run_ended()
        if self.egress is not None:
            await self.egress.close()
        if self._release is not None:
            await self._release(self.worker)
        else:
            await self.worker.kill()

    async def discard(self) -> None:
        self._first_run_ended()
        with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_TIMEOUT):
            if self.egress is not None:
                await self.egress.close()
            await self.worker.kill()

    def _first_run_ended(self) -> None:
        hook, self.after_first_run = self.after_first_run, None
        if hook is not None:
            hook()

    async def wait_closed(self) -> None:
        await self.worker.wait_reaped()

    async def fork(self) -> tuple[Session, ForkReport]:
        """Fork the runner (`runtime/sessionfork.py`): the worker supplies the new channel and the
        copy's working directory; the child greets on its channel with a token of its own.

        Nothing in the replies is taken on trust: every field is checked before it is used, and the
        child's identity comes from the backend (`Worker.forked`, the greeting's kernel credentials
        on the host), never from the pid the runner names. A reply that is not the protocol is a
        `ProtocolError` (this session is then discarded) before the child joins the family; once the
        child exists, any failure kills it before this raises."""
        if self.egress is not None:
            raise ForkError(
                "a network-on session cannot be forked: the fork would share its network namespace and "
                "its egress gateway; open a new executor with the same policy instead"
            )
        self._not_only_runs()
        started = time.monotonic()
        worker = self.worker
        plan = await worker.prepare_fork()
        try:
            reply = await self._fork_reply(plan)
            if "error" in reply:
                raise ForkError(
                    f"the session could not be forked: {bounds.clipped(str(reply['error']), 500)}"
                )
            pid = _fork_count(reply, "pid", MAX_PID, minimum=1)
            copied = {key: _fork_count(reply, key) for key in ("threads", "processes", "sockets")}
        except WorkerExited as exc:
            await worker.abandon_fork(plan)
            info = await worker.exit_info()
            raise SessionLost(info.detail, oom=info.oom) from exc
        except BaseException:
            with anyio.CancelScope(shield=True):
                await worker.abandon_fork(plan)
            raise
        child = worker.forked(plan, pid)
        session = RunnerSession(child, self.output_limit)
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                hello = await session._receive(learn_token=True)
            if hello.get("op") != "reply":
                raise ProtocolError(f"unexpected greeting of a fork: {bounds.clipped(repr(hello), 200)}")
            files, size = _fork_count(hello, "files"), _fork_count(hello, "bytes", MAX_BYTES)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await child.kill()
            if isinstance(exc, (WorkerExited, TimeoutError, ProtocolError)):
                raise ForkError(f"the forked session did not start ({type(exc).__name__}: {exc})") from exc
            raise
        report = ForkReport(
            threads_not_copied=copied["threads"],
            child_processes_not_copied=copied["processes"],
            shared_sockets=copied["sockets"],
            files_copied=files,
            bytes_copied=size,
            seconds=time.monotonic() - started,
        )
        return session, report

    async def _fork_reply(self, plan: ForkPlan) -> dict[str, Any]:
        """Send the fork request, hand the channel over when the runner asks, and return its reply."""
        worker = self.worker
        request: ForkRequest = {"op": "fork", "workdir": plan.workdir, "channel": plan.channel}
        await worker.send(_encode(request))
        reply = await self._receive()
        if reply.get("op") == "fork_channel":
            plan.answer = reply
            await worker.hand_over(plan)
            reply = await self._receive()
        if reply.get("op") != "reply":
            raise ProtocolError(f"unexpected answer to a fork: {bounds.clipped(repr(reply), 200)}")
        return reply

    async def _receive(self, learn_token: bool = False) -> dict[str, Any]:
        """The runner's next message, its token checked (with `learn_token`: learnt, for a greeting)."""
        line = await self.worker.receive_line()
        self._tagged = _TAG_TEXT in line  # no tag in the line: its values are plain JSON, as parsed
        return _decode(self.worker, line, learn_token)

    async def _exchange(
        self, message: Request, call_tool: ToolCaller, gate: OutputGate | None = None
    ) -> dict[str, Any]:
        try:
            return await self._request(message, call_tool, gate)
        except WorkerExited as exc:
            info = await self.worker.exit_info()
            raise SessionLost(info.detail, oom=info.oom) from exc

    async def _request(
        self, message: Request, call_tool: ToolCaller, gate: OutputGate | None = None
    ) -> dict[str, Any]:
        """Send one request and serve tool calls (and a streamed run's output) until its reply arrives."""
        worker = self.worker
        answer = _ANSWERS[message["op"]]
        await worker.send(_encode(message))
        while True:
            reply = await self._receive(learn_token=message["op"] == "init")
            op = reply["op"]
            if op == "output" and gate is not None:
                gate.receive(reply)
            elif op == "tool_call" and message["op"] == "run":
                await worker.send(_encode(await call_tool(check(ToolCall, reply))))
            elif op == "fatal" and message["op"] == "init":
                raise _fatal(check(Fatal, reply))
            elif op == "fatal":  # a runner fails only at its start: after that, one the code replaced
                raise ProtocolError(
                    f"the runner gave up: {bounds.clipped(check(Fatal, reply)['message'], 500)}"
                )
            elif op == "reply":
                return check(answer, reply)
            else:
                raise ProtocolError(
                    f"unexpected message from the runner while it {_DOING[message['op']]}: "
                    f"{bounds.clipped(repr(op), 60)}"
                )


class OutputGate:
    """The parent's side of a streamed run's output: checks each `output` message and holds it to the
    run's budget again (a token bucket as the runner's, with room for what the runner buffered), so
    the stream stays bounded even when the code replaced the runner; then hands it on."""

    def __init__(self, stream: StreamOptions, on_output: OutputHandler) -> None:
        slack = 2 * bounds.STREAM_BUFFER_CHARS + bounds.STREAM_MESSAGE_CHARS
        self.bucket = bounds.TokenBucket(
            stream["chars"] + slack, stream["chars_per_second"], time.monotonic()
        )
        self.on_output = on_output
        self.dropped = {"stdout": 0, "stderr": 0}

    def receive(self, reply: dict[str, Any]) -> None:
        """Check one output message against `OutputMessage` (`ProtocolError` if it is not one) and
        hand on what the budget allows."""
        message = check(OutputMessage, reply)
        name, text = message["stream"], message["text"]
        dropped = _count(message["dropped"]) + self.dropped[name]
        granted = self.bucket.take(min(len(text), bounds.STREAM_MESSAGE_CHARS), time.monotonic())
        if granted < len(text):
            self.dropped[name] = len(text) - granted
            text = text[:granted]
        else:
            self.dropped[name] = 0
        if text or dropped:
            self.on_output(OutputEvent(stream=name, text=text, dropped=dropped))

    def flush(self) -> None:
        """After the reply: report what this side dropped last."""
        for name in ("stdout", "stderr"):
            if self.dropped[name]:
                self.on_output(OutputEvent(stream=name, text="", dropped=self.dropped[name]))
                self.dropped[name] = 0


def initialise_ahead(worker: Worker, init: InitRequest, exchange: Callable[[bytes, float], bytes]) -> float:
    """The `init` handshake of a started runner, done ahead of its session and blocking: for a pool's
    refill thread, never an event loop. `exchange(line, timeout)` sends the request line and returns
    the runner's next line. The answer is checked and the channel token learnt as `RunnerSession.start`
    does; then `RunnerSession.initialised` makes the session without a round trip. Returns the seconds
    the handshake took. Raises as `start` would (`WorkerExited`, `ProtocolError`, `WorkerStartError`);
    the caller kills the worker then."""
    worker.line_limit = bounds.line_limit(init["output_limit"])
    started = time.perf_counter()
    reply = _decode(worker, exchange(_encode(init), HANDSHAKE_TIMEOUT), learn_token=True)
    op = reply["op"]
    if op == "fatal":
        raise _fatal(check(Fatal, reply))
    if op != "reply":
        raise ProtocolError(f"unexpected answer to init from the runner: {bounds.clipped(repr(op), 60)}")
    check(InitReply, reply)
    return time.perf_counter() - started


def _decode(worker: Worker, line: bytes, learn_token: bool) -> dict[str, Any]:
    """A line from the runner as a message whose `op` is text, its token checked (with `learn_token`:
    learnt, for the answer to `init` or a fork's greeting, when the worker has none yet).

    The runner writes its token first, so a line that does not start with it is refused before it is
    parsed: code that can write to the channel's descriptor but does not hold the token cannot make
    the parent decode anything. The line is already bounded in length (`Worker.line_limit`); JSON
    nested past the parser's recursion limit is refused as malformed, not raised."""
    known = worker.channel_token
    if known is not None and not line.startswith(_token_prefix(known)):
        raise ProtocolError(_NOT_FROM_THE_RUNNER)
    if known is None and not learn_token:
        raise ProtocolError(_NOT_FROM_THE_RUNNER)
    try:
        reply = json.loads(line)
    except (ValueError, RecursionError) as exc:
        kind = "nested too deeply" if isinstance(exc, RecursionError) else "not JSON"
        raise ProtocolError(f"the runner sent a line that is {kind}: {line[:200]!r}") from None
    if type(reply) is not dict or type(reply.get("op")) is not str:
        raise ProtocolError(f"the runner sent a line that is not a message: {line[:200]!r}")
    token = reply.pop("token", None)
    if known is None:
        if type(token) is not str or not _TOKEN_SHAPE.fullmatch(token):
            raise ProtocolError(_NOT_FROM_THE_RUNNER)
        worker.channel_token = token  # learnt before any code runs
    elif token != known:  # a second "token" key: JSON keeps the last one
        raise ProtocolError(_NOT_FROM_THE_RUNNER)
    return reply


_NOT_FROM_THE_RUNNER = "a message on the sandbox channel did not come from the runner (the code wrote to the channel's descriptor)"
_TOKEN_SHAPE = re.compile(r"[0-9a-f]{32}")
"""The runner's channel token: 16 random bytes in hex (`runner.Channel`)."""


@functools.lru_cache(maxsize=64)
def _token_prefix(token: str) -> bytes:
    return b'{"token": "' + token.encode() + b'", '


_ANSWERS: dict[str, type[Any]] = {
    "init": InitReply,
    "run": RunReply,
    "reset": Reply,
    "define": DefineReply,
    "warmup": Reply,
}
"""The reply each request is answered with (a fork's replies are checked by `RunnerSession.fork`)."""
_DOING = {
    "init": "started",
    "run": "ran code",
    "reset": "reset",
    "define": "bound variables",
    "warmup": "warmed up",
}


def _fork_count(message: dict[str, Any], key: str, limit: int = MAX_COUNT, minimum: int = 0) -> int:
    """`message[key]` as an int in [minimum, limit] (0 when absent, where 0 is allowed), else
    `ProtocolError`: a reply the code replaced may carry anything (`True` is not a count)."""
    value = message.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= limit:
        raise ProtocolError(
            f"the runner's fork reply has {key}={bounds.clipped(repr(value), 100)}, "
            f"not a whole number from {minimum} to {limit:,}"
        )
    return value


def _fatal(reply: Fatal) -> WorkerStartError:
    return WorkerStartError(f"the sandbox runner failed: {bounds.clipped(reply['message'], 500)}")


async def _no_tools(call: ToolCall) -> ToolResult:
    raise ProtocolError(f"the runner called tool {call.get('name')!r} outside a run")


def reported_seconds(value: Any) -> float | None:
    """A duration the runner reported, or None when it is missing or not a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an int past float's range
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def result_from_reply(reply: RunReply, limit: int, tagged: bool = True) -> ExecutionResult:
    """The result of a run reply (already checked against `RunReply`), every part cut to its bound
    again here (the runner already cuts, but code without the Python-level guards can replace the
    runner's reply), its values decoded (`carry_values`; not `tagged`: the reply's line holds no
    tag, so its values are plain JSON as parsed, and the decoding is skipped)."""
    try:
        stdout, stdout_cut = bounds.clip(reply["stdout"], limit)
        stderr, stderr_cut = bounds.clip(reply["stderr"], limit)
        error = reply["error"]
        listed = reply["artifacts"]
        artifacts, artifacts_cut = (None, 0) if listed is None else bounds.bound_artifacts(cast(Any, listed))
        value_repr, value_error = reply.get("value_repr"), reply.get("value_error")
        result = ExecutionResult(
            stdout=stdout,
            stderr=stderr,
            stdout_omitted=_count(reply["stdout_omitted"]) + stdout_cut,
            stderr_omitted=_count(reply["stderr_omitted"]) + stderr_cut,
            error=ExecutionError(**bounds.bound_error(dict(error))) if error else None,
            oom=reply["oom"],
            truncated=reply["truncated"] or bool(stdout_cut or stderr_cut or artifacts_cut),
            artifacts=None if artifacts is None else [Artifact(**a) for a in artifacts],
            artifacts_omitted=_count(reply["artifacts_omitted"]) + artifacts_cut,
            final_answer=reply["final_answer"],
            has_final_answer=reply["has_final_answer"],
            value=reply["value"],
            value_repr=value_repr if isinstance(value_repr, str) else None,
            value_error=value_error if isinstance(value_error, str) else None,
        )
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise ProtocolError(f"malformed result from the runner: {bounds.clipped(str(exc), 500)}") from exc
    return carry_values(result, limit, tagged)


_TAG_TEXT = json.dumps(values.TAG).encode()


def carry_values(result: ExecutionResult, limit: int, tagged: bool = True) -> ExecutionResult:
    """`result` with its final answer and value, which hold the codec's tagged form as the sandbox
    side sent them, bounded again and decoded (`runtime/values.py`: hostile input, nothing executed).

    A run has a final answer or a value, never both, and a value or its repr, never both: the result
    holds at most 3 texts of `limit`. A tagged form longer than `limit` becomes its JSON text cut to
    head and tail (`truncated`). One that does not decode (not the codec's form, past its bounds: a
    runner the code replaced) is dropped and said: a final answer becomes the run's error
    (``UncarriableValue``), a value its `value_error`. The session goes on: the wire itself was sound."""
    final, value = result.final_answer, result.value
    has_final = result.has_final_answer
    value_repr, value_error = result.value_repr, result.value_error
    if final is None and not has_final and value is None and value_repr is None and value_error is None:
        return result  # nothing to bound or decode (most runs: no value, no final answer)
    error = result.error
    cut = 0
    if final is not None or has_final:
        value = value_repr = value_error = None
        final, cut = _bounded(final, limit)
        if tagged and not isinstance(final, str):
            try:
                final = values.decode(final)
            except values.CodecError as exc:
                final, has_final = None, False
                message = f"the final answer could not be carried out of the sandbox: {exc}"
                error = error or ExecutionError(
                    type=UNCARRIABLE_VALUE, message=bounds.clipped(message, 4_000)
                )
    elif value is not None:
        value_repr = value_error = None
        value, cut = _bounded(value, limit)
        if tagged and not isinstance(value, str):
            try:
                value = values.decode(value)
            except values.CodecError as exc:
                value, value_error = None, bounds.clipped(f"value: it could not be decoded: {exc}", 4_000)
    else:
        if value_repr is not None:
            value_repr, cut = bounds.clip(value_repr, limit)
        if value_error is not None:
            value_error = bounds.clipped(value_error, bounds.ERROR_MESSAGE_LIMIT)
    return result.model_copy(
        update={
            "final_answer": final,
            "has_final_answer": has_final,
            "value": value,
            "value_repr": value_repr,
            "value_error": value_error,
            "error": error,
            "truncated": result.truncated or bool(cut),
        }
    )


def _bounded(encoded: Any, limit: int) -> tuple[Any, int]:
    """A tagged form as it is when its JSON fits `limit`, else that JSON text cut (and the count cut)."""
    if isinstance(encoded, str):
        return bounds.clip(encoded, limit)
    if encoded is None:
        return None, 0
    text = json.dumps(encoded, ensure_ascii=False)
    return (encoded, 0) if len(text) <= limit else bounds.clip(text, limit)


def _count(value: int) -> int:
    """A count the runner reported, held to what a result can say (never negative, never past 2**53)."""
    return min(max(0, value), COUNT_LIMIT)


COUNT_LIMIT = 2**53
"""The most any count of a result says (what JSON numbers carry exactly)."""


def _encode(message: Request | ToolResult) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode() + b"\n"
