"""The program that runs inside every sandbox (host process, container, microVM).

It is started as ``python3 -I runner.py [--sys-path DIR]... [--uid N --gid N] [--subreaper]`` (or
forked from `forkserver.py`, which calls `main` with the same flags) and talks to the parent over its
original stdin (requests) and stdout (replies), one JSON object per line, each reply starting with
the channel token (the parent refuses a line that does not, before parsing it). Before any user code
runs it moves that channel to private descriptors and points fd 0 at /dev/null and fd 1/2 at pipes
that a drain thread empties (head and tail kept, the middle counted), so everything the code (or a C
extension, or a child process) writes is captured, writing never fails, and nothing it writes can
reach the channel. ``--subreaper`` makes orphans of the code's processes children of the runner, so a
kill finds all of them (`proctools.kill_process_tree`).

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
    {"op": "define", "variables": {name: value}}  -> {"op": "reply", "error": None | "why not"}
                                                  (values in the codec's tagged form; all or none bound)
    {"op": "fork", "workdir": DIR, "channel": "fd"}  -> a new session's runner (`sessionfork.py`)
    during a run:  {"op": "tool_call", "id", "run": N, "name", "args", "kwargs"}
                                           <- {"op": "tool_result", "id", "value" | "error"}
                   (a call made between runs is refused here, unsent: it belongs to a run that ended)
    during a run with "stream": {"chars", "chars_per_second"}:
                   {"op": "output", "stream": "stdout"|"stderr", "text", "dropped"}  (no answer)
    on a startup failure: {"op": "fatal", "message": "..."}, then exit

Values (final answers, the last expression's value, tool arguments and results, variables sent in)
cross in the tagged JSON form of `values.py`, never pickle. Only the stdlib and RestrictedPython are
needed.

This file is the entry point and the `Runner`, which serves the requests and runs the cells; the rest
of the runtime is loaded beside it by path under private names (`siblings.py`): the channel
(`channel.py`), resource limits (`limits.py`), the tool-call side (`tools.py`), compiled cells
(`cells.py`), the files a run wrote (`artifacts.py`), output capture (`capture.py`), the process's
start (`startup.py`), the guard (`guard.py`, `audit.py`) and a fork of the session (`sessionfork.py`).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import linecache
import os
import sys
import time
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # the wire's types, for the type checker only: the runner imports nothing at run time
    from .protocol import ArtifactEntry, DefineReply, InitReply, InitRequest, RunError, RunReply

HERE = os.path.dirname(os.path.abspath(__file__))


def _siblings() -> Any:
    """`siblings.py`, the runtime's one loader, loaded by path here and nowhere else: the fork server
    and the session host load this file and take it from here (``runner.siblings``), and a runner
    forked from them finds the one its parent loaded."""
    name = "_kodeagent_siblings"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "siblings.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


_clock = time.perf_counter
"""Bound once at import: a run's timings (`exec_seconds`) are read with the runner's own reference."""

siblings = _siblings()
channel = siblings.load("channel")
json = channel.json  # the runner's own copy (`channel.private_json`): final answers are written with it
bounds = siblings.load("bounds")
values = siblings.load("values")
limits = siblings.load("limits")
tools = siblings.load("tools")
cells = siblings.load("cells")
artifacts = siblings.load("artifacts")
capture = siblings.load("capture")
startup = siblings.load("startup")
sessionfork = siblings.load("sessionfork")
if TYPE_CHECKING:
    from .channel import Channel
else:
    Channel = channel.Channel  # the class itself: a trusted preload may wrap its methods
Capture, Drain, Streamer = capture.Capture, capture.Drain, capture.Streamer
preload, preimport = startup.preload, startup.preimport


class Runner:
    def __init__(self, channel: Channel, guard_module: Any, audit_module: Any) -> None:
        self.channel = channel
        self.guard_module = guard_module
        self.system = audit_module.SystemGuard()
        self.system.install()
        self.stdout = Capture(1, "stdout")
        self.stderr = Capture(2, "stderr")
        self._start_capture_threads()
        capture.fresh_streams()
        sys.__stdout__, sys.__stderr__ = capture.STREAMS  # type: ignore[misc]  # the originals point at the channel
        self.initialised = False
        self.python_guards = True
        self.guard: Any = None
        self.builtins: dict[str, Any] = {}
        self.trusted_names: dict[str, Any] = {}
        self.namespace: dict[str, Any] = {}
        self.stateless = False
        self.output_limit = 64_000
        self.cell = 0
        self.cells = cells.CompiledCells(self.compile, self.compile_tree)
        self.final: Any = None
        self.has_final = False
        self.workdir = os.path.realpath(os.getcwd())
        self.closing_listing: dict[str, tuple[int, int]] | None = None
        """The last run's listing of the working directory after it ran (None: none to trust)."""
        self.empty_stamp: tuple[int, int, int] | None = None
        """The working directory's `artifacts.empty_stamp` from a listing that found it empty: while
        it reads the same, the directory is still empty and a listing need not scan it."""
        self.reserve = limits.MemoryReserve(0, self.system)
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
                    reply = self.run(
                        message.get("code", ""),
                        message.get("stream"),
                        message.get("artifacts") is not False,
                        message.get("artifacts_from_last") is True,
                    )
                except MemoryError:  # even the reserve did not suffice: a reply that needs next to nothing
                    self.reserve.release()
                    reply = channel.out_of_memory_reply()
                self.channel.end_run()
                self.streamer.finish()  # (already finished, but for a run that raised)
                self.channel.send(reply)
                self.reserve.take()
            elif op == "reset":
                self.namespace = self.fresh_namespace()  # finalizers of the old one run confined
                self.channel.send(channel.reply())
            elif op == "define" and self.initialised:
                self.channel.send(self.define(message.get("variables")))
            elif op == "fork" and self.initialised:
                with self.system.trusted():
                    forked = sessionfork.fork(self, message, self.subreaper)
                if forked is not None:  # a refusal; a fork (or the new session's runner) has answered
                    self.channel.send(forked)
            elif op == "warmup" and not self.initialised:
                self.warm_up(message.get("python_guards") is not False)
                self.channel.send(channel.reply())
            else:
                self.channel.send({"op": "fatal", "message": f"unknown request {op!r}"})

    def warm_up(self, python_guards: bool = True) -> None:
        """Before any session: touch what a session will use, so a pooled worker answers its first
        requests at full speed (a fork's copy-on-write pages, lazily built caches). Applies no limit,
        sets no environment and leaves nothing behind; only allowed before `init`.

        `python_guards` False (the ``warmup`` request of a worker whose session will run plain
        Python): the plain compile instead of RestrictedPython's, which such a session never calls
        (in a just-forked process that compile cost more than the rest of the warm-up)."""
        source = "def f(n):\n    return [i * i for i in range(n)]\nprint(f(3), 'x'.upper())"
        if python_guards:
            guard = self.guard_module.Guard(["math"], (), (), self.import_module)
            code, names = guard.compile(source, "<warm-up>"), guard.builtins({})
        else:
            code, names = compile(source, "<warm-up>", "exec", dont_inherit=True), dict(vars(builtins))
        exec(code, {"__builtins__": names, "__name__": "__warmup__"})
        capture.flush_streams()
        artifacts.snapshot(self.workdir)
        self.drain.collect()
        self.drain.restart(self.output_limit, running=False)

    def init(self, message: InitRequest) -> None:
        policy = message["policy"]
        self.initialised = True
        os.environ.clear()
        os.environ.update(message.get("env", {}))
        self.offer_temporary_directory()
        wanted = policy.get("limits", {})
        if wanted.get("memory_mb"):
            self.reserve = limits.MemoryReserve(limits.RESERVE_BYTES, self.system)
        limits.apply_limits(wanted, extra_address_space=self.reserve.size)
        self.reserve.read_limit()
        self.reserve.take()
        self.python_guards = bool(policy.get("python_guards", True))
        trusted: dict[str, Any] = {name: self.make_tool(name) for name in message.get("tools", [])}
        tool = trusted.get("final_answer")
        trusted["final_answer"] = self.final_answer if tool is None else self.final_answer_through(tool)
        trusted["ToolError"] = tools.ToolError
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

    def define(self, variables: Any) -> DefineReply:
        """Bind the variables the parent sent (`DefineRequest`), all or none: each name one the code
        could bind and the runner does not rebind (`guard.variable_name_problem`), the values
        decoded by the codec, every bound checked before what it costs is taken. A numpy, pandas or
        PIL value is made as such when its module is loaded or the code may import it; else it
        stays the codec's `EncodedValue`. Nothing of the code runs here."""
        if type(variables) is not dict:
            return {"op": "reply", "error": "the variables must be one JSON object of names to values"}
        for name in variables:
            problem = self.guard_module.variable_name_problem(name, self.trusted_names)
            if problem is not None:
                return {"op": "reply", "error": bounds.clipped(problem, bounds.ERROR_MESSAGE_LIMIT)}
        try:
            with self.system.trusted():
                decoded = values.decode(variables, importer=self.value_module)
        except (values.Malformed, MemoryError) as exc:
            why = "the session's memory limit" if isinstance(exc, MemoryError) else str(exc)
            message = f"the variables could not be decoded: {why}"
            return {"op": "reply", "error": bounds.clipped(message, bounds.ERROR_MESSAGE_LIMIT)}
        self.namespace.update(decoded)
        return {"op": "reply", "error": None}

    def value_module(self, name: str) -> Any:
        """numpy, pandas or PIL for a value sent in: the loaded module, or imported now when the
        session's code could import it itself; None (the value stays encoded) when it could not."""
        loaded = sys.modules.get(name)
        if loaded is not None or (self.python_guards and not self.guard.module_allowed(name)):
            return loaded
        return importlib.import_module(name)

    def restart_capture(self) -> None:
        """In a forked session's runner: pipes, a drain and a stream sender of its own (threads do
        not survive a fork, and the pipes are still the parent's)."""
        for pipe in (self.stdout, self.stderr):
            pipe.reopen()
        self._start_capture_threads()

    def _start_capture_threads(self) -> None:
        self.drain = Drain((self.stdout, self.stderr))
        self.streamer = Streamer(self.channel)
        self.stdout.sink = self.stderr.sink = self.streamer.offer

    def own_threads(self) -> int:
        """How many of this process's threads are the runner's: the main one, the drain and, once a
        run streamed, the stream sender."""
        return 2 + (self.streamer.thread is not None)

    def private_fds(self) -> frozenset[int]:
        """The runner's own descriptors (the channel, the capture pipes, the reserve's reading of the
        process's size), which the code may not use."""
        own = {
            self.channel.reader.fileno(),
            self.channel.write_fd,
            self.stdout.fd,
            self.stderr.fd,
            self.stdout.read_fd,
            self.stderr.read_fd,
        }
        if self.reserve.size_fd is not None:
            own.add(self.reserve.size_fd)
        return frozenset(own)

    def offer_temporary_directory(self) -> None:
        """``TMPDIR`` is the working directory when the caller set none and ``/tmp`` is not this
        session's to write (bubblewrap's private ``/tmp`` belongs to root: sessions of one fork
        server, each its own uid, must not share a writable place). So `tempfile`, and any program
        the code starts, writes where the session may, at once: without it `tempfile` probes
        ``/tmp``, ``/var/tmp`` and ``/usr/tmp`` before it falls back to the working directory, and
        other programs fail."""
        if "TMPDIR" in os.environ or os.access("/tmp", os.W_OK | os.X_OK):
            return
        os.environ["TMPDIR"] = self.workdir
        _forget_temporary_directory()

    def moved_to(self, workdir: str) -> None:
        """The session now lives in `workdir` (a fork's copy): files, protected descriptors and a
        ``TMPDIR`` that named the old directory follow."""
        previous, self.workdir = self.workdir, os.path.realpath(workdir)
        if os.environ.get("TMPDIR") == previous:
            os.environ["TMPDIR"] = self.workdir
            _forget_temporary_directory(cached=previous)
        self.closing_listing = self.empty_stamp = None
        self.reserve.reopen()
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

    # ------------------------------------------------------------------ running code

    def run(
        self,
        source: str,
        stream: Mapping[str, Any] | None = None,
        track_files: bool = True,
        from_last: bool = False,
    ) -> RunReply:
        """Run one cell. `track_files` False (the request's ``"artifacts": false``): the working
        directory is not looked at, and the reply's ``artifacts`` is None (not looked at), never [].
        `from_last` (``artifacts_from_last``): the last run's closing listing, where there is one, is
        this run's opening listing."""
        started = _clock()
        self.cell += 1
        filename = f"<cell {self.cell}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        if self.stateless:
            self.namespace = self.fresh_namespace()
        self.restore_trusted_names()
        self.final, self.has_final = None, False
        with self.system.trusted():
            for pipe in (self.stdout, self.stderr):
                pipe.attach()
            # before the stream starts: what a background thread wrote before this run is not its
            self.drain.restart(self.output_limit, prompt=bool(stream))
            self.streamer.start(stream)
            closing, self.closing_listing = self.closing_listing, None
            if not track_files:
                before = None
            elif from_last and closing is not None:
                before = closing
            else:
                before = self._listing()
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
                code, last = self.cells.get(source, filename)
                os.chdir(self.workdir)
            exec_started = _clock()
            exec(code, self.namespace)
            if last is not None:
                value = eval(last, self.namespace)
            exec_ended = _clock()
        except tools.FinalAnswerSignal:
            exec_ended = _clock()
        except BaseException as exc:  # everything the code raises becomes the result's error
            if isinstance(exc, MemoryError):
                self.reserve.release()  # first: describing a MemoryError needs memory
            else:
                self.reserve.release_unless_room()
            exec_ended = _clock()
            oom = isinstance(exc, MemoryError)
            error = bounds.bound_error(self.describe(exc, filename))
        self.reserve.release_unless_room()
        capture.flush_streams()
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
        written: list[dict[str, Any]] | None = None
        written_omitted = 0
        if before is not None:
            with self.system.trusted():
                after = self._listing()
            written, written_omitted = bounds.bound_artifacts(artifacts.changed_files(before, after))
            self.closing_listing = after
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
                stdout_omitted or stderr_omitted or final_omitted or value_omitted or written_omitted
            ),
            "error": error,
            "oom": oom,
            "final_answer": final,
            "has_final_answer": self.has_final,
            "value": value,
            "value_repr": value_repr,
            "value_error": value_error,
            "artifacts": cast("list[ArtifactEntry] | None", written),
            "artifacts_omitted": written_omitted,
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

    def _listing(self) -> dict[str, tuple[int, int]]:
        """The working directory's files (`artifacts.snapshot`), without a scan while it is provably
        still empty (`empty_stamp`). Call it trusted."""
        stamp = self.empty_stamp
        if stamp is not None and artifacts.unchanged(self.workdir, stamp):
            return {}
        stamp = artifacts.empty_stamp(self.workdir)  # before the scan: a change during it shows
        listing, bare = artifacts.scan(self.workdir)
        self.empty_stamp = stamp if bare else None  # a subdirectory's changes do not show in ours
        return listing

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
        raise tools.FinalAnswerSignal

    def make_tool(self, name: str) -> Any:
        return tools.stub(name, self.channel, self.before_tool_call)

    def before_tool_call(self) -> None:
        """What the code wrote before a tool call is streamed before the call."""
        if not self.streamer.active:
            return
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        with self.drain.lock:
            for stream in self.drain.captures:
                stream.drain()
        self.streamer.wait_sent()

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


def _forget_temporary_directory(cached: str | None = None) -> None:
    """Make a loaded `tempfile` read ``TMPDIR`` again on its next use (it caches the directory);
    with `cached`, only when that is the directory it holds (not one the code chose)."""
    module: Any = sys.modules.get("tempfile")
    if module is not None and (cached is None or module.tempdir == cached):
        module.tempdir = None


def _library_roots() -> list[str]:
    """Directories the code may read (not write): where the interpreter loads its modules from."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, HERE}
    roots.update(p for p in sys.path if p and os.path.isabs(p))
    return sorted(roots)


def main(argv: list[str]) -> None:
    """Start a runner with the flags of this module's docstring and serve until the channel ends."""
    startup.main(argv, Runner)


if __name__ == "__main__":
    main(sys.argv[1:])
