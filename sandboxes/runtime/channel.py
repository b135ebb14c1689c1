"""The runner's channel to the parent: JSON lines on two private descriptors, and the replies that
need nothing of a run (loaded by `runner.py` as ``_kodeagent_channel``; stdlib only).

Every message the runner sends starts with the channel's token, which the parent learns from the
init reply before any code runs; the code can reach the descriptors (with `os` allowed) but cannot
forge a message. One thread at a time reads the channel and files each message for whom it is (the
serve loop, or the thread waiting for its tool's result), so neither is ever taken for the other.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # the wire's types, for the type checker only: nothing is imported at run time
    from .protocol import Reply, RunReply, ToolCall, ToolResult


def private_json() -> Any:
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


json = private_json()
"""The runner's own json: the channel, final answers and values are written with it."""
RUN_ENDED = (
    "the run that made this call has ended, so the call was not executed; a tool can be called only "
    "while its run is in progress (join the threads that call tools before the code ends)"
)
"""Why a tool call made between runs is refused (the parent's refusal says the same: toolbridge)."""


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


def take_channel() -> Channel:
    """Move stdin/stdout to private descriptors; fd 0 becomes /dev/null."""
    read_fd, write_fd = os.dup(0), os.dup(1)  # dup() makes them non-inheritable
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return Channel(read_fd, write_fd)


def reply() -> Reply:
    return {"op": "reply"}


def out_of_memory_reply() -> RunReply:
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
        "artifacts": None,  # not looked at: the run's memory was used up
        "artifacts_omitted": 0,
        "error": {"type": "MemoryError", "message": message, "traceback": None, "line": None},
    }
