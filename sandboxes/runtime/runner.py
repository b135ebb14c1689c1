"""The program that runs inside every sandbox (host process, container, microVM).

It is started as ``python3 -I runner.py [--sys-path DIR]... [--uid N --gid N] [--subreaper]`` (or
forked from `forkserver.py`, which calls `main` with the same flags) and talks to the parent over its
original stdin (requests) and stdout (replies), one JSON object per line, each reply starting with
the channel token (the parent refuses a line that does not, before parsing it). Before any user code runs it moves that channel to private descriptors and points
fd 0 at /dev/null and fd 1/2 at pipes that a drain thread empties (head and tail kept, the middle
counted), so everything the code (or a C extension, or a child process) writes is captured, writing
never fails, and nothing it writes can reach the channel. ``--subreaper`` makes orphans of the code's
processes children of the runner, so a kill finds all of them (`proctools.kill_process_tree`).

Requests and replies::

    {"op": "warmup"}                       -> {"op": "reply"}   (pool workers, before init only)
    {"op": "init", "policy": {...}, "env": {...}, "tools": [...], "stateless": b, "output_limit": n}
                                           -> {"op": "reply", "pid", "uid"}
    {"op": "run", "code": "...", "run": N} -> {"op": "reply", "stdout", "stderr", "stdout_omitted",
                                               "stderr_omitted", "truncated", "error", "oom",
                                               "final_answer", "has_final_answer", "value",
                                               "value_repr", "value_error", "artifacts", "artifacts_omitted",
                                               "exec_seconds", "runner_seconds"}
                                                  (every part bounded: bounds.py)
    {"op": "reset"}                        -> {"op": "reply"}
    {"op": "fork", "workdir": DIR, "channel": "fd"}  -> a new session's runner (`sessionfork.py`)
    during a run:  {"op": "tool_call", "id", "run": N, "name", "args", "kwargs"}
                                           <- {"op": "tool_result", "id", "value" | "error"}
                   (a call made between runs is refused here, unsent: it belongs to a run that ended)
    during a run with "stream": {"chars", "chars_per_second"}:
                   {"op": "output", "stream": "stdout"|"stderr", "text", "dropped"}  (no answer)
    on a startup failure: {"op": "fatal", "message": "..."}, then exit

Values (final answers, the last expression's value, tool arguments and results) cross in the tagged
JSON form of `values.py`, never pickle. Only the stdlib and RestrictedPython are needed.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import io
import json
import linecache
import mmap
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # the wire's types, for the type checker only: the runner imports nothing at run time
    from .protocol import (
        InitReply,
        InitRequest,
        Reply,
        RunError,
        RunReply,
        ToolCall,
        ToolResult,
    )

HERE = os.path.dirname(os.path.abspath(__file__))


_clock = time.perf_counter
"""Bound once at import: a run's timings (`exec_seconds`) are read with the runner's own reference."""


def _private_json() -> Any:
    """A copy of the json package that only the runner holds. The code may import json and reach its
    classes (`json.JSONEncoder`); library code it calls can set attributes on them below the guard
    (`functools.update_wrapper(json.JSONEncoder, f, assigned=("encode",))`). The channel and final
    answers must not run through anything the code can change."""
    shared = {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name == "json" or name.startswith("json.")
    }
    try:
        return importlib.import_module("json")
    finally:
        for name in [n for n in sys.modules if n == "json" or n.startswith("json.")]:
            del sys.modules[name]
        sys.modules.update(shared)


json = _private_json()  # noqa: F811
RUN_ENDED = (
    "the run that made this call has ended, so the call was not executed; a tool can be called only "
    "while its run is in progress (join the threads that call tools before the code ends)"
)
"""Why a tool call made between runs is refused (the parent's refusal says the same: toolbridge)."""
MAX_ARTIFACT_SCAN = 5000
RESERVE_BYTES = 32 << 20
"""Address space the runner keeps back for itself under a memory limit (added to the limit)."""
COMPILED_CELLS = 64
COMPILED_SOURCE_CHARS = 16_000
"""The compiled-cell cache keeps the last 64 sources of up to 16,000 characters: small snippets are
the ones run again; a cache of large ones would hold memory under the session's limit."""


def _load_sibling(name: str) -> Any:
    # Loaded by path under a private name: the runtime directory is never put on sys.path.
    # A runner forked from the fork server finds the server's copy already loaded (it holds no state).
    if f"_kodeagent_{name}" in sys.modules:
        return sys.modules[f"_kodeagent_{name}"]
    spec = importlib.util.spec_from_file_location(f"_kodeagent_{name}", os.path.join(HERE, f"{name}.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bounds = _load_sibling("bounds")
capture = _load_sibling("capture")
values = _load_sibling("values")
sessionfork = _load_sibling("sessionfork")
Capture, Drain, Streamer = capture.Capture, capture.Drain, capture.Streamer


class Channel:
    """JSON lines over the two descriptors the runner keeps private."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.reader = open(read_fd, "rb", buffering=1 << 16, closefd=True)
        self.write_fd = write_fd
        # Every message carries this token; the parent learns it from the init reply, before any
        # user code runs, and refuses lines without it: the code can write to the channel's
        # descriptor (with `os` allowed) but cannot forge a message.
        self.token = os.urandom(16).hex()
        self.forked_child = False
        self.own_fork = False  # set while the runner forks a new session (`sessionfork.py`)
        # One writer at a time: the stream's sender thread, tool calls and replies never interleave.
        self.lock = threading.Lock()
        self._open_mailbox()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._close_in_child)

    def rebind(self, fd: int) -> None:
        """In a forked session's runner: leave the old channel and speak on `fd`, with a new token."""
        self.reader.close()
        os.close(self.write_fd)
        self.reader = open(fd, "rb", buffering=1 << 16, closefd=True)
        self.write_fd = os.dup(fd)
        self.token = os.urandom(16).hex()
        self.forked_child = False
        self.lock = threading.Lock()
        self._open_mailbox()  # threads do not survive a fork: none of theirs is waiting here

    def _open_mailbox(self) -> None:
        # One thread at a time reads the descriptor (the serve loop waiting for a request, or a thread
        # waiting for its tool's result) and files each message for whom it is: requests for the
        # serve loop, a tool_result for the call of its id. So neither is ever taken for the other.
        self.mail = threading.Condition()
        self.reading = False
        self.ended = False
        self.requests: list[Any] = []
        self.results: dict[int, Any] = {}
        self.awaited: set[int] = set()
        # The run in progress (`RunRequest.run`), None between runs; `calls` makes the stub's check of
        # it and the sending of the call one step, so no call of a run is sent after its reply.
        self.calls = threading.Lock()
        self.run: int | None = None
        self.call_id = 0

    def _close_in_child(self) -> None:
        if self.own_fork:  # the runner's own fork: `rebind` leaves the old channel in order
            return
        # A process the code forked must never speak on (or read from) the parent's channel.
        self.forked_child = True
        for fd in (self.reader.fileno(), self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def send(self, message: Mapping[str, Any], limit: int | None = None) -> None:
        """Write one message; with `limit`, refuse (ValueError, nothing sent) one longer than that."""
        if self.forked_child:
            raise RuntimeError("a forked process cannot use the sandbox channel")
        message = {"token": self.token, **message}  # first: the parent checks it before parsing
        encoded = json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n"
        if limit is not None and len(encoded) > limit:
            raise ValueError(f"the message is {len(encoded):,} bytes of JSON; the limit is {limit:,}")
        data = memoryview(encoded)
        with self.lock:
            while data:
                data = data[os.write(self.write_fd, data) :]

    def receive(self) -> Any:
        """The parent's next request; None at the end of the channel."""
        return self._collect(lambda: self.requests.pop(0) if self.requests else None)

    def begin_run(self, run: Any) -> None:
        with self.calls:
            self.run = run if isinstance(run, int) else None

    def end_run(self) -> None:
        """Before the run's reply: from now on its calls are refused here, none is sent."""
        with self.calls:
            self.run = None

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any], limit: int) -> ToolResult | None:
        """Send a tool call tagged with the run in progress and wait for its result (None: the channel
        ended). Between runs nothing is sent: the answer is the refusal the parent would give."""
        if self.forked_child:  # before the lock, which a thread of the forking process may have held
            raise RuntimeError("a forked process cannot use the sandbox channel")
        with self.calls:
            if self.run is None:
                return {
                    "op": "tool_result",
                    "id": None,
                    "error": {"type": "ToolCallRefused", "message": RUN_ENDED},
                }
            self.call_id += 1
            call_id = self.call_id
            message: ToolCall = {
                "op": "tool_call",
                "id": call_id,
                "run": self.run,
                "name": name,
                "args": args,
                "kwargs": kwargs,
            }
            with self.mail:
                self.awaited.add(call_id)
            try:
                self.send(message, limit)
            except BaseException:
                with self.mail:
                    self.awaited.discard(call_id)
                raise
        try:
            return cast("ToolResult | None", self._collect(lambda: self.results.pop(call_id, None)))
        finally:
            with self.mail:
                self.awaited.discard(call_id)
                self.results.pop(call_id, None)

    def _collect(self, take: Any) -> Any:
        """What `take` finds in the mailbox, reading the channel (or waiting for the thread that does)
        until it is there; None once the channel ended."""
        while True:
            with self.mail:
                while True:
                    found = take()
                    if found is not None or self.ended:
                        return found
                    if not self.reading:
                        self.reading = True
                        break
                    self.mail.wait()
            line = b""
            try:
                line = self.reader.readline()
            finally:
                with self.mail:
                    self.reading = False
                    self._file(line)
                    self.mail.notify_all()

    def _file(self, line: bytes) -> None:
        if not line:
            self.ended = True
            return
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            message = {"op": None}  # the serve loop answers it as an unknown request
        if message.get("op") == "tool_result":
            call_id = message.get("id")
            if isinstance(call_id, int) and call_id in self.awaited:
                self.results[call_id] = message
            # else: a result no call waits for any more; dropped, never taken for a request
        else:
            self.requests.append(message)


class MemoryReserve:
    """Address space the runner holds back from the code, so that it can still describe the run, collect
    its output and send the reply after the code used up the memory limit (and kept what it took).

    An anonymous mapping that is never touched: it counts against RLIMIT_AS but is never resident.
    Released the moment the code's run ends, taken again after the reply once there is room.
    """

    def __init__(self, size: int, system: Any) -> None:
        self.size = size
        self.system = system
        self.block: mmap.mmap | None = None

    def take(self) -> None:
        if self.size and self.block is None:
            try:
                with self.system.trusted():  # the audit hook refuses mmap to the code, not to us
                    self.block = mmap.mmap(-1, self.size)
            except (OSError, ValueError, MemoryError):
                pass  # the code still holds the memory: tried again after the next request

    def release(self) -> None:
        block, self.block = self.block, None
        if block is not None:
            block.close()


class FinalAnswerSignal(BaseException):
    """Raised by `final_answer()`. A BaseException, so `except Exception:` in user code cannot catch it."""


class ToolError(Exception):
    """A tool raised an exception in the parent; the message says which and why.

    A builtin exception arrives as a class that is both (`ToolKeyError(ToolError, KeyError)`, see
    `tool_error_class`), so `except KeyError:` and `except ToolError:` both catch it."""

    def __str__(self) -> str:
        # The message as given: KeyError's own `__str__` would show it quoted, as a missing key.
        return BaseException.__str__(self)


_TOOL_ERROR_BASES: dict[str, type[Exception]] = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type)
    and issubclass(value, Exception)
    and not issubclass(value, BaseExceptionGroup)  # built from a list of exceptions, not a message
}
"""The builtin exceptions a tool's failure may arrive as, by name; fixed when the runner starts,
before any code runs, so no name the parent sends is ever looked up anywhere else."""

_tool_error_classes: dict[str, type[ToolError]] = {}


def tool_error_class(type_name: str) -> type[ToolError]:
    """The class the code sees for a tool's exception named `type_name`: ``Tool<Name>``, a subclass of
    `ToolError` and of that builtin, or `ToolError` itself for any other name (the parent names a
    non-builtin exception by its module and class, which is in no table)."""
    found = _tool_error_classes.get(type_name)
    if found is None:
        base = _TOOL_ERROR_BASES.get(type_name)
        found = ToolError
        if base is not None:
            try:
                made = type(f"Tool{type_name}", (ToolError, base), {"__module__": ToolError.__module__})
                made("probe")  # UnicodeDecodeError and kin need more than a message: plain ToolError
                found = made
            except TypeError:
                pass
        # A module global, as ToolError is: the guard's `_own_class` then refuses the code's writes.
        globals().setdefault(found.__name__, found)
        _tool_error_classes[type_name] = found
    return found


class Runner:
    def __init__(self, channel: Channel, guard_module: Any, audit_module: Any) -> None:
        self.channel = channel
        self.guard_module = guard_module
        self.system = audit_module.SystemGuard()
        self.system.install()
        self.stdout = Capture(1, "stdout")
        self.stderr = Capture(2, "stderr")
        self._start_capture_threads()
        _fresh_streams()
        sys.__stdout__, sys.__stderr__ = _STREAMS  # type: ignore[misc]  # the originals point at the channel
        self.initialised = False
        self.python_guards = True
        self.guard: Any = None
        self.builtins: dict[str, Any] = {}
        self.trusted_names: dict[str, Any] = {}
        self.namespace: dict[str, Any] = {}
        self.stateless = False
        self.output_limit = 64_000
        self.cell = 0
        self.compiled: dict[str, tuple[Any, Any]] = {}
        """Source -> its compiled cell (`compile_cell`), oldest first, at most `COMPILED_CELLS`."""
        self.final: Any = None
        self.has_final = False
        self.workdir = os.path.realpath(os.getcwd())
        self.reserve = MemoryReserve(0, self.system)
        self.subreaper = False  # set by `main` when the runner took orphans (a fork restores it)

    # ------------------------------------------------------------------ requests

    def serve(self) -> None:
        while True:
            message = self.channel.receive()
            if message is None:
                return
            op = message.get("op")
            if op == "init":
                self.init(cast("InitRequest", message))
                answer: InitReply = {"op": "reply", "pid": os.getpid(), "uid": os.getuid()}
                self.channel.send(answer)
            elif op == "run":
                self.channel.begin_run(message.get("run"))
                try:
                    reply = self.run(message.get("code", ""), message.get("stream"))
                except MemoryError:  # even the reserve did not suffice: a reply that needs next to nothing
                    self.reserve.release()
                    reply = _out_of_memory_reply()
                self.channel.end_run()
                self.streamer.finish()  # (already finished, but for a run that raised)
                self.channel.send(reply)
                self.reserve.take()
            elif op == "reset":
                self.namespace = self.fresh_namespace()  # finalizers of the old one run confined
                self.channel.send(_reply())
            elif op == "fork" and self.initialised:
                with self.system.trusted():
                    forked = sessionfork.fork(self, message, self.subreaper)
                if forked is not None:  # a refusal; a fork (or the new session's runner) has answered
                    self.channel.send(forked)
            elif op == "warmup" and not self.initialised:
                self.warm_up()
                self.channel.send(_reply())
            else:
                self.channel.send({"op": "fatal", "message": f"unknown request {op!r}"})

    def warm_up(self) -> None:
        """Before any session: touch what a session will use, so a pooled worker answers its first
        requests at full speed (a fork's copy-on-write pages, lazily built caches). Applies no limit,
        sets no environment and leaves nothing behind; only allowed before `init`."""
        guard = self.guard_module.Guard(["math"], (), (), self.import_module)
        source = "def f(n):\n    return [i * i for i in range(n)]\nprint(f(3), 'x'.upper())"
        exec(
            guard.compile(source, "<warm-up>"), {"__builtins__": guard.builtins({}), "__name__": "__warmup__"}
        )
        _flush_streams()
        _snapshot(self.workdir)
        self.drain.collect()
        self.drain.restart(self.output_limit)

    def init(self, message: InitRequest) -> None:
        policy = message["policy"]
        self.initialised = True
        os.environ.clear()
        os.environ.update(message.get("env", {}))
        limits = policy.get("limits", {})
        if limits.get("memory_mb"):
            self.reserve = MemoryReserve(RESERVE_BYTES, self.system)
        _apply_limits(limits, extra_address_space=self.reserve.size)
        self.reserve.take()
        self.python_guards = bool(policy.get("python_guards", True))
        trusted: dict[str, Any] = {name: self.make_tool(name) for name in message.get("tools", [])}
        tool = trusted.get("final_answer")
        trusted["final_answer"] = self.final_answer if tool is None else self.final_answer_through(tool)
        trusted["ToolError"] = ToolError
        trusted["PolicyViolation"] = self.guard_module.PolicyViolation
        self.trusted_names = trusted
        if self.python_guards:
            self.guard = self.guard_module.Guard(
                policy["allowed_imports"],
                policy["banned_builtins"],
                policy["allowed_dunders"],
                self.import_module,
            )
            extra = dict(trusted)
            if "eval" not in policy["banned_builtins"]:
                extra["eval"] = self.guarded_eval
            if "exec" not in policy["banned_builtins"]:
                extra["exec"] = self.guarded_exec
            if "compile" not in policy["banned_builtins"]:
                extra["compile"] = self.guarded_compile
            if "open" in policy["banned_builtins"] or policy.get("files") == "none":
                extra.pop("open", None)
            self.builtins = self.guard.builtins(extra)
        else:  # plain Python: only the process boundary, the limits and the supervisor hold
            self.builtins = {**vars(builtins), **trusted}
        self.stateless = bool(message.get("stateless"))
        self.output_limit = int(message.get("output_limit", 64_000))
        self.namespace = self.fresh_namespace()
        if self.python_guards:
            self.system.configure(
                files=policy.get("files", "workdir"),
                network=bool(policy.get("network")),
                subprocess=bool(policy.get("subprocess")),
                readable_roots=_library_roots(),
                protected_fds=self.private_fds(),
            )

    def restart_capture(self) -> None:
        """In a forked session's runner: pipes, a drain and a stream sender of its own (threads do
        not survive a fork, and the pipes are still the parent's)."""
        for capture in (self.stdout, self.stderr):
            capture.reopen()
        self._start_capture_threads()

    def _start_capture_threads(self) -> None:
        self.drain = Drain((self.stdout, self.stderr))
        self.streamer = Streamer(self.channel)
        self.stdout.sink = self.stderr.sink = self.streamer.offer

    def private_fds(self) -> frozenset[int]:
        """The runner's own descriptors (the channel, the capture pipes), which the code may not use."""
        return frozenset(
            (
                self.channel.reader.fileno(),
                self.channel.write_fd,
                self.stdout.fd,
                self.stderr.fd,
                self.stdout.read_fd,
                self.stderr.read_fd,
            )
        )

    def moved_to(self, workdir: str) -> None:
        """The session now lives in `workdir` (a fork's copy): files and protected descriptors follow."""
        self.workdir = os.path.realpath(workdir)
        self.system.workdir = self.workdir
        self.system.protected_fds = self.private_fds()

    def fresh_namespace(self) -> dict[str, Any]:
        return {"__builtins__": self.builtins, "__name__": "__main__", "__doc__": None}

    def restore_trusted_names(self) -> None:
        """`final_answer` and the tool stubs mean what the runner says in every run: a global the code
        bound to one of these names in an earlier run (`final_answer = print`) is dropped, and the
        builtins table and the namespace's link to it are put back."""
        for name in self.trusted_names:
            self.namespace.pop(name, None)
        self.builtins.update(self.trusted_names)
        self.namespace["__builtins__"] = self.builtins

    def final_answer_through(self, tool: Any) -> Any:
        """`final_answer` of a session with a tool of that name: the call, with whatever arguments
        it has (smolagents' `FinalAnswerTool` may take several), runs that tool in the parent, and
        what the tool returns is the final answer."""

        def final_answer(*args: Any, **kwargs: Any) -> None:
            self.final_answer(tool(*args, **kwargs))

        final_answer.__name__ = final_answer.__qualname__ = "final_answer"
        return final_answer

    def compile(self, source: str, filename: str, mode: str = "exec") -> Any:
        if self.python_guards:
            return self.guard.compile(source, filename, mode)
        return compile(source, filename, mode, dont_inherit=True)

    def compile_tree(self, tree: ast.AST, filename: str, mode: str) -> Any:
        if self.python_guards:
            return self.guard.compile_tree(tree, filename, mode)
        return compile(tree, filename, mode, dont_inherit=True)  # type: ignore[call-overload]  # a Module or an Expression

    def compile_cell(self, source: str, filename: str) -> tuple[Any, Any]:
        """The code of a run, and apart from it its last statement when that is an expression, whose
        value the reply carries (as a notebook's cell has a value). The source is parsed once and
        split as a tree (the nodes keep their lines and columns, so tracebacks point at the code as
        written). Where the split does not compile, the code compiles whole: it runs, without a value;
        and code that does not parse compiles whole, so its error names every problem.

        A source compiled before in this session is taken from `compiled` (code objects are
        immutable and the session's guard never changes), renamed to this cell: a snippet run
        again and again (a test call, a probe) skips the parse, the transform and the compile."""
        cached = self.compiled.get(source)
        if cached is not None:
            return _renamed(cached[0], filename), cached[1] and _renamed(cached[1], filename)
        code, last = self._compile_cell(source, filename)
        if len(source) <= COMPILED_SOURCE_CHARS:
            if len(self.compiled) >= COMPILED_CELLS:
                del self.compiled[next(iter(self.compiled))]  # the oldest
            self.compiled[source] = (code, last)
        return code, last

    def _compile_cell(self, source: str, filename: str) -> tuple[Any, Any]:
        try:
            tree = ast.parse(source, filename)
        except Exception:
            return self.compile(source, filename), None
        split = _split_last_expression(tree)
        if split is None:
            return self.compile_tree(tree, filename, "exec"), None
        try:
            return self.compile_tree(split[0], filename, "exec"), self.compile_tree(
                split[1], filename, "eval"
            )
        except Exception:  # compiled whole below: its error names every problem of the code
            return self.compile(source, filename), None

    # ------------------------------------------------------------------ running code

    def run(self, source: str, stream: Mapping[str, Any] | None = None) -> RunReply:
        started = _clock()
        self.cell += 1
        filename = f"<cell {self.cell}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        if self.stateless:
            self.namespace = self.fresh_namespace()
        self.restore_trusted_names()
        self.final, self.has_final = None, False
        with self.system.trusted():
            for capture in (self.stdout, self.stderr):
                capture.attach()
            self.drain.restart(self.output_limit)
            self.streamer.start(stream)
            before = _snapshot(self.workdir)
        error: RunError | None = None
        oom = False
        # The audit hook stays active from here on (see SystemGuard): describe() may run the code's
        # __str__, and its threads go on after the reply.
        self.system.active = self.python_guards
        last: Any = None
        value: Any = None
        exec_started: float | None = None
        exec_ended = 0.0
        try:
            with self.system.trusted():
                code, last = self.compile_cell(source, filename)
                os.chdir(self.workdir)
            exec_started = _clock()
            exec(code, self.namespace)
            if last is not None:
                value = eval(last, self.namespace)
            exec_ended = _clock()
        except FinalAnswerSignal:
            exec_ended = _clock()
        except BaseException as exc:  # everything the code raises becomes the result's error
            self.reserve.release()  # first: describing a MemoryError needs memory
            exec_ended = _clock()
            oom = isinstance(exc, MemoryError)
            error = bounds.bound_error(self.describe(exc, filename))
        self.reserve.release()
        _flush_streams()
        if self.channel.forked_child:
            os._exit(1 if error else 0)  # a fork of the code finished its copy of the snippet
        (stdout, stdout_omitted), (stderr, stderr_omitted) = self.drain.collect()
        self.streamer.finish()  # before the value's __repr__ runs: what it prints is not the code's output
        value_omitted = 0
        value_repr = value_error = None
        if last is not None and error is None and not self.has_final:
            # After the capture: what a __repr__ prints is not the code's output.
            value, value_repr, value_error, value_omitted = self.reply_value(value)
            if self.channel.forked_child:
                os._exit(0)
        else:
            value = None
        artifacts, artifacts_omitted = bounds.bound_artifacts(
            _changed_files(before, self._snapshot_trusted())
        )
        final, final_omitted = self.final, 0
        if self.has_final and isinstance(final, str):
            final, final_omitted = bounds.clip(final, self.output_limit)
        ran = 0.0 if exec_started is None else max(0.0, exec_ended - exec_started)  # None: did not compile
        return {
            "op": "reply",
            "stdout": stdout,
            "stderr": stderr,
            "stdout_omitted": stdout_omitted,
            "stderr_omitted": stderr_omitted,
            "truncated": bool(
                stdout_omitted or stderr_omitted or final_omitted or value_omitted or artifacts_omitted
            ),
            "error": error,
            "oom": oom,
            "final_answer": final,
            "has_final_answer": self.has_final,
            "value": value,
            "value_repr": value_repr,
            "value_error": value_error,
            "artifacts": artifacts,
            "artifacts_omitted": artifacts_omitted,
            "exec_seconds": ran,
            "runner_seconds": _clock() - started,
        }

    def reply_value(self, value: Any) -> tuple[Any, str | None, str | None, int]:
        """The last expression's value as the reply carries it: (its tagged form, None, None, 0) when
        the values codec carries it within the output limit; else (None, its repr() cut to head and
        tail, why it was not carried, the characters cut): what a notebook shows. A str is carried
        cut to the limit (the count of what was cut last). Never raises: the value's own `__repr__`
        may do anything, even call `final_answer`."""
        final = self.final, self.has_final
        try:
            if value is None:
                return None, None, None, 0
            if type(value) is str:
                text, cut = bounds.clip(value, self.output_limit)
                return text, None, None, cut
            try:
                encoded = values.encode(value, crossing="leave the sandbox")
            except values.Uncarriable as exc:
                why = str(exc)
            else:
                size = len(json.dumps(encoded, ensure_ascii=False))
                if size <= self.output_limit:
                    return encoded, None, None, 0
                why = (
                    f"value: its JSON is {size:,} characters, past the output limit of "
                    f"{self.output_limit:,} (a larger output_limit carries it)"
                )
            text, cut = bounds.clip(str.__str__(repr(value)), self.output_limit)
            return None, text, bounds.clipped(why, bounds.ERROR_MESSAGE_LIMIT), cut
        except BaseException:
            try:
                kind = bounds.clipped(str.__str__(type(value).__name__), 200)
            except BaseException:
                kind = "?"
            return None, f"<unprintable value of type {kind}>", f"value: its repr() of type {kind} raised", 0
        finally:
            self.final, self.has_final = final

    def _snapshot_trusted(self) -> dict[str, tuple[int, int]]:
        with self.system.trusted():
            return _snapshot(self.workdir)

    def describe(self, exc: BaseException, filename: str) -> dict[str, Any]:
        kind = type(exc).__name__
        if isinstance(exc, self.guard_module.PolicyViolation):
            kind = "PolicyViolation"
        try:  # str() and repr() may be the code's own methods: they can raise
            message = str(exc)
            if isinstance(exc, SystemExit):
                message = f"the code called exit({bounds.clipped(repr(exc.code), 200)}); the session goes on"
            elif isinstance(exc, KeyboardInterrupt):
                message = "KeyboardInterrupt raised by the code; the session goes on"
        except BaseException:
            message = "<unprintable exception>"
        try:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<cell ")]
            lines = traceback.format_exception_only(type(exc), exc)
            if kind == "PolicyViolation":
                lines = [f"PolicyViolation: {message}\n"]
            text = "".join(
                (["Traceback (most recent call last):\n"] + traceback.format_list(frames) if frames else [])
                + lines
            )
            line = frames[-1].lineno if frames else getattr(exc, "lineno", None)
        except BaseException:  # a hostile __str__ or __repr__ must not break the runner
            text, line = f"{kind}: <unprintable exception>\n", None
        return {
            "type": kind,
            "message": message,
            "traceback": text,
            "line": line if isinstance(line, int) else None,
        }

    # ------------------------------------------------------------------ what the code can call

    def import_module(self, name: str, fromlist: Any) -> Any:
        with self.system.trusted():
            return builtins.__import__(name, None, None, fromlist, 0)

    def final_answer(self, *args: Any, **kwargs: Any) -> None:
        """End this run and hand the value to the caller as the final answer.

        The value comes positionally or under any one keyword (`final_answer(answer=x)`, as
        smolagents' tool of that name is called). It crosses in the values codec's tagged form
        (`values.py`); one the codec cannot carry raises `TypeError` here, naming the part and its
        type. One whose tagged JSON is longer than the output limit becomes that JSON text, cut to
        head and tail (the result then says `truncated`)."""
        if len(args) + len(kwargs) > 1:
            raise TypeError("final_answer() takes one value: the answer")
        value = args[0] if args else next(iter(kwargs.values()), None)
        try:
            encoded = values.encode(value, path="answer", crossing="leave the sandbox")
        except values.Uncarriable as exc:
            raise TypeError(f"final_answer(): {exc}") from None
        if type(encoded) is not str:
            text = json.dumps(encoded, ensure_ascii=False)
            if len(text) > self.output_limit:
                encoded = text
        self.final, self.has_final = encoded, True
        raise FinalAnswerSignal

    def make_tool(self, name: str) -> Any:
        def call_tool(*args: Any, **kwargs: Any) -> Any:
            if self.streamer.active:  # what the code wrote before the call is streamed before it
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                except (OSError, ValueError, AttributeError):
                    pass
                with self.drain.lock:
                    for capture in self.drain.captures:
                        capture.drain()
                self.streamer.wait_sent()
            try:
                sent = values.encode(list(args), path="args", crossing="leave the sandbox")
                named = values.encode(kwargs, path="kwargs", crossing="leave the sandbox")
                reply = self.channel.call(name, sent, named, bounds.TOOL_MESSAGE_LIMIT)
            except values.Uncarriable as exc:
                raise TypeError(f"arguments of tool {name!r}: {exc}") from None
            except (TypeError, ValueError, RecursionError) as exc:
                raise TypeError(
                    f"arguments of tool {name!r} must be at most {bounds.TOOL_MESSAGE_LIMIT:,} bytes "
                    f"in the values codec's JSON: {exc}"
                ) from None
            if reply is None:
                raise SystemExit(0)
            if reply.get("error"):
                error = reply["error"]
                kind = bounds.clipped(str(error.get("type")), bounds.ERROR_TYPE_LIMIT)
                message = bounds.clipped(str(error.get("message")), bounds.ERROR_MESSAGE_LIMIT)
                raise tool_error_class(kind)(f"tool {name!r} failed: {kind}: {message}")
            try:  # numpy, pandas, PIL values arrive as such once the code imported them
                return values.decode(reply.get("value"), importer=sys.modules.get)
            except values.Malformed as exc:
                raise ToolError(f"tool {name!r} returned a value that could not be decoded: {exc}") from None

        call_tool.__name__ = call_tool.__qualname__ = name
        return call_tool

    def _compile_text(self, source: Any, mode: str) -> Any:
        if not isinstance(source, str):
            raise TypeError(f"{mode}() in the sandbox takes source text, not {type(source).__name__}")
        with self.system.trusted():
            return self.guard.compile(source, "<string>", mode)

    def _globals(self, scope: Any) -> dict[str, Any]:
        if scope is None:
            return self.namespace
        if not isinstance(scope, dict):
            raise TypeError("globals must be a dict")
        scope["__builtins__"] = dict(self.builtins)  # never the real builtins, nor the session's own table
        return scope

    def guarded_eval(self, source: Any, globals: Any = None, locals: Any = None) -> Any:
        return eval(self._compile_text(source, "eval"), self._globals(globals), locals)

    def guarded_exec(self, source: Any, globals: Any = None, locals: Any = None) -> None:
        exec(self._compile_text(source, "exec"), self._globals(globals), locals)

    def guarded_compile(self, source: Any, filename: Any = "<string>", mode: str = "exec", *args: Any) -> Any:
        if mode not in ("exec", "eval"):
            raise ValueError("compile() mode must be 'exec' or 'eval'")
        return self._compile_text(source, mode)


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    """`code` and every code object inside it (functions, classes, comprehensions) with `filename`."""
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


_STREAMS: list[io.TextIOWrapper] = []
"""The runner's own sys.stdout and sys.stderr (`_fresh_streams`, from the runner's start), kept from
run to run."""


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        open(fd, "wb", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )


def _stream_intact(stream: Any, ours: io.TextIOWrapper) -> bool:
    try:
        return (
            stream is ours
            and not ours.closed
            and ours.line_buffering
            and ours.encoding == "utf-8"
            and ours.errors == "backslashreplace"
        )
    except ValueError:  # detached from its buffer
        return False


def _flush_streams() -> None:
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            flushed = False  # what it still holds must not reach the next run's output
    # The code may have replaced, closed or reconfigured them (via an allowed module): then start
    # clean next time; else keep them (making two text streams per run is a tenth of a warm run).
    if flushed and _stream_intact(sys.stdout, _STREAMS[0]) and _stream_intact(sys.stderr, _STREAMS[1]):
        return
    _fresh_streams()


def _fresh_streams() -> None:
    _STREAMS[:] = [_text_stream(1), _text_stream(2)]
    sys.stdout, sys.stderr = _STREAMS


def _reply() -> Reply:
    return {"op": "reply"}


def _out_of_memory_reply() -> RunReply:
    message = "the code used up the memory limit, and its output could not be collected"
    return {
        "op": "reply",
        "stdout": "",
        "stderr": "",
        "stdout_omitted": 0,
        "stderr_omitted": 0,
        "truncated": False,
        "oom": True,
        "final_answer": None,
        "has_final_answer": False,
        "value": None,
        "artifacts": [],
        "artifacts_omitted": 0,
        "error": {"type": "MemoryError", "message": message, "traceback": None, "line": None},
    }


def _apply_limits(limits: Mapping[str, Any], extra_address_space: int = 0) -> None:
    import resource

    memory = limits.get("memory_mb", 0) * 1024 * 1024
    wanted = {
        "RLIMIT_AS": memory + extra_address_space if memory else 0,
        "RLIMIT_CPU": limits.get("cpu_seconds", 0),
        "RLIMIT_NPROC": limits.get("max_processes", 0),
        "RLIMIT_FSIZE": limits.get("max_file_mb", 0) * 1024 * 1024,
        "RLIMIT_NOFILE": limits.get("max_open_files", 0),
        "RLIMIT_CORE": 0,
    }
    for name, value in wanted.items():
        kind = getattr(resource, name, None)
        if kind is None or (value == 0 and name != "RLIMIT_CORE"):
            continue
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):
            pass


def _library_roots() -> list[str]:
    """Directories the code may read (not write): where the interpreter loads its modules from."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, HERE}
    roots.update(p for p in sys.path if p and os.path.isabs(p))
    return sorted(roots)


def _split_last_expression(tree: ast.Module) -> tuple[ast.Module, ast.Expression] | None:
    """A parsed cell as the statements before its last one and that statement as an expression, when
    it is one; else None. (Split as trees, not text: nothing is parsed twice.)"""
    node = tree.body[-1] if tree.body else None
    if not isinstance(node, ast.Expr):
        return None
    return ast.Module(body=tree.body[:-1], type_ignores=tree.type_ignores), ast.Expression(body=node.value)


def _snapshot(root: str) -> dict[str, tuple[int, int]]:
    """Regular files under `root` (symlinks are never followed): path -> (size, mtime)."""
    found: dict[str, tuple[int, int]] = {}
    stack = [root]
    while stack and len(found) < MAX_ARTIFACT_SCAN:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    found[os.path.relpath(entry.path, root)] = (info.st_size, info.st_mtime_ns)
            except OSError:
                continue
    return found


def _changed_files(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> list[dict[str, Any]]:
    return [
        {"path": path, "size": stat[0]} for path, stat in sorted(after.items()) if before.get(path) != stat
    ]


def _drop_privileges(uid: int, gid: int) -> None:
    if os.getuid() == 0 and uid:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)


def preload(path: str) -> None:
    """Import a trusted module file (``--preload``) under its name, before any session: a session
    that imports that name gets it from ``sys.modules``, already compiled and run."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def preimport() -> None:
    """Pay once, in a fork server (the host's, a shared container's session host), for every import
    a session would otherwise pay for itself; never runs user code."""
    guard = _load_sibling("guard")
    _load_sibling("audit")
    guard.make_transformer(frozenset(), frozenset())
    import resource  # noqa: F401  (used by the runner's limits)
    import sysconfig

    sysconfig.get_config_var("TZPATH")  # loads the config-vars cache the audit guard consults at init

    import RestrictedPython.Guards  # noqa: F401  (used by Guard.builtins)

    if sys.platform.startswith("linux"):
        import ctypes  # noqa: F401  (the runner becomes a subreaper through it)

    # What a program run as its own harness runs it (`bench humaneval`: fork, tempdir, reliability
    # guard) imports at once; loaded here they cost a session nothing. Loading grants nothing: a
    # guarded session still imports only what its policy allows.
    import faulthandler  # noqa: F401
    import shutil  # noqa: F401
    import site  # noqa: F401
    import subprocess  # noqa: F401
    import tempfile  # noqa: F401


def _take_channel() -> Channel:
    """Move stdin/stdout to private descriptors; fd 0 becomes /dev/null."""
    read_fd, write_fd = os.dup(0), os.dup(1)  # dup() makes them non-inheritable
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return Channel(read_fd, write_fd)


def _become_subreaper() -> bool:
    """Orphans of the code's processes (a `setsid` double fork) are re-parented to the runner rather
    than to init, so the supervisor finds every one of them in the runner's process tree (Linux)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
            return True
        except (OSError, AttributeError):
            pass
    return False


def main(argv: list[str]) -> None:
    uid = gid = 0
    subreaper = False
    preloads: list[str] = []
    args = iter(argv)
    for flag in args:
        if flag == "--sys-path":
            sys.path.append(next(args))
        elif flag == "--uid":
            uid = int(next(args))
        elif flag == "--gid":
            gid = int(next(args))
        elif flag == "--subreaper":
            subreaper = _become_subreaper()
        elif flag == "--preload":
            preloads.append(next(args))
    channel = _take_channel()
    try:
        for path in preloads:
            preload(path)
        _drop_privileges(uid, gid or uid)
        guard_module = _load_sibling("guard")
        audit_module = _load_sibling("audit")
        guard_module.make_transformer(
            frozenset(), frozenset()
        )  # import RestrictedPython before the first run
        runner = Runner(channel, guard_module, audit_module)
        runner.subreaper = subreaper
    except BaseException as exc:
        channel.send({"op": "fatal", "message": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(3) from None
    runner.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
