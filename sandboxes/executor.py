"""`Executor`: the one interface every backend shares, and the protocol logic they all reuse.

The hooks a backend implements or may override:

- `_start_worker()` (required): start a runner (or take one from a warm pool) and return its `Worker`;
  this class then sends `init` and waits for the handshake.
- `_release_worker(worker)`: dispose of the worker at `close()` (default: kill it).
- `_init_message()`: adjust the `init` request (Docker leaves rlimits to the container's cgroup).
- `_ensure_worker()`: wrap the start-and-handshake (Docker refills its pool after the handshake).

This class does the rest: the options every backend shares (`ExecutorOptions`), the static policy
check, the request/reply conversation with the runner, tool calls back into the parent, the
wall-clock timeout that kills, respawn after a crash with `state_lost`, and building a bounded
`ExecutionResult` (`runtime/bounds.py`).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import posixpath
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, ClassVar, Self, TypedDict, Unpack

import anyio

from .errors import BackendUnavailable, ExecutorClosed, ProtocolError, SandboxFileError, WorkerStartError
from .models import Artifact, ExecutionError, ExecutionResult
from .policy import Policy, prepare_code
from .runtime import bounds
from .worker import Worker, WorkerExited

DEFAULT_TIMEOUT = 30.0
DEFAULT_OUTPUT_LIMIT = 64_000
"""Characters kept of stdout (and of stderr): the first half and the last half, when longer."""

HANDSHAKE_TIMEOUT = 30.0
KILL_TIMEOUT = 10.0

ToolFunction = Callable[..., Any]


class ExecutorOptions(TypedDict, total=False):
    """The options every backend takes, declared once (each backend adds its own beside them).

    policy: what the code may do (imports, builtins, files, network, limits). Default `Policy()`.
    timeout: wall-clock seconds per `run()`; past it the worker and all it started are killed. Default 30.
    env: the only environment variables the code sees. Default none.
    tools: functions the code may call by name; they run here, in the parent, not in the sandbox.
    workdir: the code's working directory (backend-specific meaning; a fresh one if None).
    stateless: run every snippet in a fresh namespace instead of keeping state. Default False.
    output_limit: characters kept of stdout and of stderr (head and tail). Default 64,000.
    """

    policy: Policy | None
    timeout: float
    env: Mapping[str, str] | None
    tools: Mapping[str, ToolFunction] | None
    workdir: str | None
    stateless: bool
    output_limit: int


COMMON_OPTIONS = frozenset(ExecutorOptions.__annotations__)


class Executor(ABC):
    """Runs Python code in a sandbox session whose state persists between runs, like a notebook.

    Use it as an async context manager (or call `open()` and `close()`)::

        async with HostExecutor(policy=Policy(allowed_imports=["math"]), timeout=10) as ex:
            result = await ex.run("import math; print(math.pi)")

    Takes the common `ExecutorOptions` (policy, timeout, env, tools, workdir, stateless,
    output_limit); each backend adds options of its own. An unknown option is a `TypeError`.
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
        self._worker: Worker | None = None
        self._opened = False
        self._closed = False
        self._state_lost_pending = False
        self._lock = anyio.Lock()
        self._isolation = "not started"

    # ----------------------------------------------------------------- backend hooks

    @abstractmethod
    async def _start_worker(self) -> Worker:
        """Start (or take from a pool) a runner; the caller then sends `init` and waits for its reply."""

    async def _release_worker(self, worker: Worker) -> None:
        """Dispose of a worker at close. Default: kill it (a worker is never reused by another session)."""
        await worker.kill()

    @property
    def isolation(self) -> str:
        """Which isolation level is active for this session (see the docs of each backend)."""
        return self._isolation

    # ----------------------------------------------------------------- lifecycle

    async def open(self) -> Self:
        """Start the worker. Raises `BackendUnavailable` when the backend cannot work here."""
        if self._closed:
            raise ExecutorClosed("this executor was closed; create a new one")
        if not self._opened:
            self._opened = True
            try:
                await self._open_session()
            except BaseException:
                self._opened = False
                raise
        return self

    async def close(self) -> None:
        """Kill the worker and everything it started. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._close_session()

    async def _open_session(self) -> None:
        """What `open()` does once: start the worker and shake hands (overridden by delegating backends)."""
        await self._ensure_worker()

    async def _close_session(self) -> None:
        """What `close()` does once, shielded from cancellation: release the worker."""
        worker, self._worker = self._worker, None
        if worker is not None:
            await self._release_worker(worker)

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _check_usable(self) -> None:
        if self._closed:
            raise ExecutorClosed("this executor was closed; create a new one")
        if not self._opened:
            raise ExecutorClosed("call `await executor.open()` or use `async with` before run()")

    async def _ensure_worker(self) -> Worker:
        if self._worker is None:
            worker = await self._start_worker()
            worker.line_limit = bounds.line_limit(self.output_limit)
            if not self.policy.python_guards and worker.isolation == "process":
                with anyio.CancelScope(shield=True):
                    await worker.kill()
                raise BackendUnavailable(
                    "Policy(python_guards=False) runs code without the Python-level guards, so it needs a "
                    "boundary around the process, and this host backend has only the bare 'process' level: "
                    "install bubblewrap (`apt-get install bubblewrap`) for the 'namespaces' level, or use "
                    "the docker or e2b backend, or keep python_guards=True"
                )
            try:
                with anyio.fail_after(HANDSHAKE_TIMEOUT):
                    await self._request(worker, self._init_message())
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await worker.kill()
                raise
            self._worker = worker
            self._isolation = worker.isolation
        return self._worker

    def _init_message(self) -> dict[str, Any]:
        return {
            "op": "init",
            "policy": self.policy.runtime_config(),
            "env": self.env,
            "tools": sorted(self.tools),
            "stateless": self.stateless,
            "output_limit": self.output_limit,
        }

    async def _discard_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_TIMEOUT):
                await worker.kill()
        self._state_lost_pending = True

    # ----------------------------------------------------------------- running code

    async def run(self, code: str | bytes) -> ExecutionResult:
        """Run `code` in the session and return what happened. Never raises because of the code."""
        self._check_usable()
        async with self._lock:
            started = time.perf_counter()
            try:
                result = await self._run_locked(code)
            except BaseException:
                # Cancelled (or failed) mid-conversation: the worker's state is unknown, so replace it.
                await self._discard_worker()
                raise
            result.duration = time.perf_counter() - started
            result.backend = self.backend
            return result

    async def _run_locked(self, code: str | bytes) -> ExecutionResult:
        if len(code) > 50_000:  # parsing up to max_code_bytes takes seconds: not on the event loop
            text, problem = await anyio.to_thread.run_sync(prepare_code, code, self.policy, list(self.tools))
        else:
            text, problem = prepare_code(code, self.policy, extra_names=self.tools)
        if problem is not None:
            return ExecutionResult(error=problem)
        assert text is not None
        if self._worker is not None and not await self._worker.alive():
            await self._discard_worker()
        if self._worker is None:
            await self._ensure_worker()
        state_lost, self._state_lost_pending = self._state_lost_pending, False
        worker = self._worker
        assert worker is not None
        try:
            with anyio.fail_after(self.timeout):
                reply = await self._request(worker, {"op": "run", "code": text})
            result = self._result_from_reply(reply)
        except ProtocolError as exc:
            await self._discard_worker()
            self._state_lost_pending = False
            return ExecutionResult(
                state_lost=True,
                error=ExecutionError(type="WorkerCrashed", message=f"{exc}; the sandbox was replaced"),
            )
        except TimeoutError:
            await self._discard_worker()
            self._state_lost_pending = False
            return ExecutionResult(
                timed_out=True,
                state_lost=True,
                error=ExecutionError(
                    type="Timeout",
                    message=f"the code ran longer than {self.timeout:g} s and was stopped; "
                    "variables from earlier runs are lost",
                ),
            )
        except WorkerExited:
            exit_info = await worker.exit_info()
            await self._discard_worker()
            self._state_lost_pending = False
            return ExecutionResult(
                state_lost=True,
                oom=exit_info.oom,
                error=ExecutionError(
                    type="WorkerCrashed",
                    message=f"the sandbox process ended during the run ({exit_info.detail}); "
                    "variables from earlier runs are lost",
                ),
            )
        result.state_lost = result.state_lost or state_lost
        return result

    def _result_from_reply(self, reply: dict[str, Any]) -> ExecutionResult:
        """The result of a run reply, every part cut to its bound again here: the runner already cuts,
        but code without the Python-level guards can replace the runner's reply."""
        limit = self.output_limit
        try:
            stdout, stdout_cut = bounds.clip(_text(reply.get("stdout", "")), limit)
            stderr, stderr_cut = bounds.clip(_text(reply.get("stderr", "")), limit)
            error = reply.get("error")
            artifacts, artifacts_cut = bounds.bound_artifacts(list(reply.get("artifacts") or []))
            final = reply.get("final_answer")
            final_cut = 0
            if isinstance(final, str):
                final, final_cut = bounds.clip(final, limit)
            elif final is not None:
                encoded = json.dumps(final, ensure_ascii=False)
                if len(encoded) > limit:
                    final, final_cut = bounds.clip(encoded, limit)
            # A run has a final answer or a value, never both: the bound holds 3 texts of `limit`.
            value = None if final is not None or reply.get("has_final_answer") else reply.get("value")
            value_cut = 0
            if isinstance(value, str):
                value, value_cut = bounds.clip(value, limit)
            elif value is not None and len(encoded := json.dumps(value, ensure_ascii=False)) > limit:
                value, value_cut = bounds.clip(encoded, limit)
            artifacts_omitted = int(reply.get("artifacts_omitted", 0)) + artifacts_cut
            return ExecutionResult(
                stdout=stdout,
                stderr=stderr,
                stdout_omitted=int(reply.get("stdout_omitted", 0)) + stdout_cut,
                stderr_omitted=int(reply.get("stderr_omitted", 0)) + stderr_cut,
                error=ExecutionError(**bounds.bound_error(error)) if error else None,
                oom=bool(reply.get("oom")),
                truncated=bool(reply.get("truncated"))
                or bool(stdout_cut or stderr_cut or final_cut or value_cut or artifacts_cut),
                artifacts=[Artifact(**a) for a in artifacts],
                artifacts_omitted=artifacts_omitted,
                final_answer=final,
                has_final_answer=bool(reply.get("has_final_answer")),
                value=value,
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed result from the runner: {bounds.clipped(str(exc), 500)}") from exc

    async def _request(self, worker: Worker, message: dict[str, Any]) -> dict[str, Any]:
        """Send one request and serve tool calls until its reply arrives."""
        await worker.send(_encode(message))
        while True:
            line = await worker.receive_line()
            try:
                reply = json.loads(line)
            except ValueError as exc:
                raise ProtocolError(f"the runner sent a line that is not JSON: {line[:200]!r}") from exc
            if not isinstance(reply, dict):
                raise ProtocolError(f"the runner sent a line that is not a message: {line[:200]!r}")
            token = reply.pop("token", None)
            known = worker.channel_token
            if known is None and message.get("op") == "init" and isinstance(token, str):
                worker.channel_token = token  # learnt before any code runs
            elif known is None or token != known:
                raise ProtocolError("a message on the sandbox channel did not come from the runner "
                                    "(the code wrote to the channel's descriptor)")  # fmt: skip
            op = reply.get("op")
            if op == "tool_call":
                await worker.send(_encode(await self._call_tool(reply)))
            elif op == "fatal":
                raise WorkerStartError(f"the sandbox runner failed: {reply.get('message')}")
            elif op == "reply":
                return reply
            else:
                raise ProtocolError(f"unexpected message from the runner: {op!r}")

    async def _call_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        name = call.get("name", "")
        function = self.tools.get(name)
        reply: dict[str, Any] = {"op": "tool_result", "id": call.get("id")}
        if function is None:
            reply["error"] = {"type": "NameError", "message": f"no tool named {name!r}"}
            return reply
        args, kwargs = call.get("args", []), call.get("kwargs", {})
        try:
            if inspect.iscoroutinefunction(function):
                value = await function(*args, **kwargs)
            else:
                # In a thread, so that a blocking tool cannot hold the event loop past the timeout.
                value = await anyio.to_thread.run_sync(
                    functools.partial(function, *args, **kwargs), abandon_on_cancel=True
                )
                if inspect.isawaitable(value):
                    value = await value
            size = len(json.dumps(value, ensure_ascii=False).encode())
        except Exception as exc:  # the tool's failure goes back to the code, which may catch it
            reply["error"] = {
                "type": type(exc).__name__,
                "message": bounds.clipped(str(exc), bounds.ERROR_MESSAGE_LIMIT),
            }
            return reply
        if size > bounds.TOOL_MESSAGE_LIMIT:
            reply["error"] = {
                "type": "ToolResultTooLarge",
                "message": f"the result is {size:,} bytes of JSON; at most {bounds.TOOL_MESSAGE_LIMIT:,} cross into "
                "the sandbox. Have the tool return less, or a summary",
            }
            return reply
        reply["value"] = value
        return reply

    # ----------------------------------------------------------------- state and files

    async def reset(self) -> None:
        """Forget every variable of the session (the working directory's files stay)."""
        self._check_usable()
        async with self._lock:
            if self._worker is None:
                await self._ensure_worker()
                return
            try:
                with anyio.fail_after(self.timeout):
                    await self._request(self._worker, {"op": "reset"})
            except (TimeoutError, WorkerExited):
                await self._discard_worker()
            self._state_lost_pending = False

    async def upload(self, path: str, data: bytes | str) -> None:
        """Write a file into the working directory (`path` is relative to it)."""
        self._check_usable()
        relative = _relative_path(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        async with self._lock:
            worker = await self._ensure_worker()
            await worker.write_file(relative, payload)

    async def download(self, path: str) -> bytes:
        """Read a file from the working directory (`path` is relative to it)."""
        self._check_usable()
        relative = _relative_path(path)
        async with self._lock:
            worker = await self._ensure_worker()
            return await worker.read_file(relative)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode() + b"\n"


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
