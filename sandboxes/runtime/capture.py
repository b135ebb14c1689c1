"""What the code writes, captured and streamed (loaded by `runner.py`; stdlib only).

`Capture` is one output stream (fd 1 or 2) behind a pipe, `Drain` the thread that empties the pipes
while the code writes, `Streamer` the thread that sends a streamed run's output over the channel;
`fresh_streams` and `flush_streams` keep `sys.stdout` and `sys.stderr` text streams on fd 1 and 2.
Writing never blocks or fails for the code, and nothing the runner holds grows past its bounds.
"""

from __future__ import annotations

import _thread
import codecs
import fcntl
import io
import os
import select
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: nothing is imported at run time
    from .channel import Channel
    from .protocol import OutputMessage

PIPE_BYTES = 1 << 20
READ_BYTES = 1 << 20


bounds = sys.modules["_kodeagent_siblings"].load("bounds")  # loaded by the entry point first
omission_marker = bounds.omission_marker


class Capture:
    """One output stream (fd 1 or 2) drained from a pipe; head and tail kept, the middle counted.

    The target descriptor is the write end of a pipe that the runner's drain thread empties as the
    code writes, so a program may print any amount without an error and without the sandbox holding
    more than `limit` characters: the first half is kept, then a rolling last half, and every
    character in between is counted. (A file would hit RLIMIT_FSIZE or grow without bound.)
    """

    def __init__(self, target_fd: int, name: str) -> None:
        self.target_fd = target_fd
        self.name = name
        self.limit = 64_000
        self.sink: Any = None
        """Called with (name, text) for every decoded piece (the stream of a streamed run)."""
        self.open_pipe()

    def open_pipe(self) -> None:
        """A new pipe behind the target descriptor (at start, and in a forked session's runner)."""
        self.read_fd, self.fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        try:  # a larger pipe: fewer wake-ups of the drain thread under a flood of output
            fcntl.fcntl(self.fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
        except OSError:
            pass
        self.clear()
        self.attach()

    def reopen(self) -> None:
        """Leave the pipe shared with the runner this one was forked from, for a pipe of its own."""
        for fd in (self.read_fd, self.fd):
            os.close(fd)
        self.open_pipe()

    def attach(self) -> None:
        """(Re)point the target descriptor at the pipe, even if the code closed or moved it."""
        os.dup2(self.fd, self.target_fd)

    def clear(self, limit: int | None = None) -> None:
        """Forget what was captured (call with the drain lock held, or before the drain runs)."""
        if limit is not None:
            self.limit = limit
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.head: list[str] = []
        self.head_size = 0
        self.tail: list[str] = []
        self.tail_size = 0
        self.total = 0

    def drain(self) -> int:
        """Read what is in the pipe now, without blocking; the number of bytes read."""
        read = 0
        while True:
            try:
                chunk = os.read(self.read_fd, READ_BYTES)
            except OSError:  # BlockingIOError: empty for now
                return read
            if not chunk:
                return read
            read += len(chunk)
            self.add(self.decoder.decode(chunk))

    def add(self, text: str) -> None:
        if self.sink is not None and text:
            self.sink(self.name, text)
        self.total += len(text)
        half = self.limit // 2
        if self.head_size < half:
            taken = text[: half - self.head_size]
            self.head.append(taken)
            self.head_size += len(taken)
            text = text[len(taken) :]
        if text:
            self.tail.append(text)
            self.tail_size += len(text)
            if self.tail_size > 2 * half:  # amortised: join and cut only when twice the need
                kept = "".join(self.tail)[-half:]
                self.tail, self.tail_size = [kept], len(kept)

    def collect(self) -> tuple[str, int]:
        """The captured text (head, marker, tail when cut) and how many characters were left out."""
        self.add(self.decoder.decode(b"", final=True))
        head = "".join(self.head)
        if self.total <= self.limit:
            return head + "".join(self.tail), 0
        tail = "".join(self.tail)[-(self.limit // 2) :]
        omitted = self.total - len(head) - len(tail)
        return head + omission_marker(omitted) + tail, omitted


class Drain:
    """The thread that empties the capture pipes while the code writes (and between runs).

    `lock` orders it with the main thread: a collect drains what is left under the lock, so no chunk
    read before the collect can land after it.

    It does not wake at every write: a Python thread woken by a write must take the interpreter's lock
    from the code that wrote, and that hand-off cost a warm `print(1)` more than the rest of the
    capture. The pipe holds what a run writes (`PIPE_BYTES`) until the collect reads it, so the thread
    only looks every `RUN_SECONDS` during a run (`IDLE_SECONDS` between runs, for background threads'
    output), and follows every write only while output floods (a look found at least `FLOOD_BYTES`)
    or while a streamed run's output must go out as it is written (`restart(prompt=True)`). A writer
    therefore never waits more than one look's interval for room.
    """

    RUN_SECONDS = 0.005
    IDLE_SECONDS = 0.25
    FLOOD_BYTES = 16 << 10

    def __init__(self, captures: tuple[Capture, ...]) -> None:
        self.captures = captures
        self.lock = threading.Lock()
        self.running = False
        self.prompt = False
        self.wake = threading.Event()
        # A bare thread, not a `threading.Thread`: every session starts one, and in a just-forked
        # process the threading module's bookkeeping (and its wait for the thread to start) cost
        # about 0.4 ms of CPU more. It needs none of it: it never ends, is never joined, and the
        # code's `threading.enumerate()` is left to show the code's own threads.
        _thread.start_new_thread(self._loop, ())

    def _loop(self) -> None:
        poller = select.poll()
        for capture in self.captures:
            poller.register(capture.read_fd, select.POLLIN)
        flooding = False
        while True:
            try:
                if flooding or self.prompt:
                    poller.poll(int(self.IDLE_SECONDS * 1000))  # bounded: a change of mode is seen
                else:
                    self.wake.wait(self.RUN_SECONDS if self.running else self.IDLE_SECONDS)
                    self.wake.clear()
                with self.lock:
                    read = sum(capture.drain() for capture in self.captures)
                flooding = read >= self.FLOOD_BYTES
            except Exception:  # never let the drain stop: a writer would then block for ever
                time.sleep(0.01)

    def restart(self, limit: int, prompt: bool = False, running: bool = True) -> None:
        """Drop what was written before this run (a background thread's output) and start counting;
        `prompt`: hand on every write as it comes (a streamed run). `running=False` only drops it
        (the looks stay at the idle interval)."""
        with self.lock:
            for capture in self.captures:
                capture.drain()
                capture.clear(limit)
            self.running, self.prompt = running, prompt
        if prompt:
            self.wake.set()

    def collect(self) -> list[tuple[str, int]]:
        with self.lock:
            for capture in self.captures:
                capture.drain()
            self.running = self.prompt = False
            return [capture.collect() for capture in self.captures]


class Streamer:
    """Sends a streamed run's output over the channel while the code runs, from a thread of its own.

    The drain thread hands it every decoded piece (`offer`) and never waits for the channel: pieces go
    to a buffer of at most `bounds.STREAM_BUFFER_CHARS` characters, within a token bucket of the run's
    budget; what does not fit is dropped and counted, and the count rides on the stream's next message
    (or on a final notice with empty text). So a slow parent never makes the code's writes wait, and a
    long loop keeps showing its latest output as the budget refills. `finish` waits until the sender
    has written everything of the run, so the reply always comes last.
    """

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.cond = threading.Condition()
        self.active = False
        self.sending = False
        self.queue: list[list[Any]] = []  # [stream, [texts], chars, dropped before it]
        self.queued = 0
        self.dropped = {"stdout": 0, "stderr": 0}
        self.bucket: Any = None
        self.thread: threading.Thread | None = None
        """Started by the first streamed run (a session that never streams, most of them, pays for no
        thread); `start` is called with the audit hook trusting the runner."""

    def start(self, options: Mapping[str, Any] | None) -> None:
        if not options:
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="kodeagent-stream", daemon=True)
            self.thread.start()
        with self.cond:
            self.queue, self.queued = [], 0
            self.dropped = {"stdout": 0, "stderr": 0}
            self.bucket = bounds.TokenBucket(
                int(options.get("chars", 0)), float(options.get("chars_per_second", 0)), time.monotonic()
            )
            self.active = True

    def offer(self, stream: str, text: str) -> None:
        with self.cond:
            if not self.active:
                return
            room = max(0, bounds.STREAM_BUFFER_CHARS - self.queued)
            granted = self.bucket.take(min(len(text), room), time.monotonic())
            if granted:
                kept = text[:granted]
                last = self.queue[-1] if self.queue else None
                if last is not None and last[0] == stream and not self.dropped[stream]:
                    last[1].append(kept)
                    last[2] += granted
                else:
                    self.queue.append([stream, [kept], granted, self.dropped[stream]])
                    self.dropped[stream] = 0
                self.queued += granted
                self.cond.notify_all()
            self.dropped[stream] += len(text) - granted

    def wait_sent(self) -> None:
        """Until the sender wrote what it holds (before a tool call, so the stream stays in order)."""
        with self.cond:
            while self.active and (self.queue or self.sending):
                self.cond.wait()

    def finish(self) -> None:
        """End the run's stream: wait for the sender, then send the counts still to report."""
        with self.cond:
            if not self.active:
                return
            self.active = False
            while self.queue or self.sending:
                self.cond.wait()
            notices = [(name, count) for name, count in self.dropped.items() if count]
            self.dropped = {"stdout": 0, "stderr": 0}
        for name, count in notices:
            self.channel.send({"op": "output", "stream": name, "text": "", "dropped": count})

    def _loop(self) -> None:
        step = bounds.STREAM_MESSAGE_CHARS
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                batch, self.queue, self.queued = self.queue, [], 0
                self.sending = True
            try:
                for stream, texts, _, dropped in batch:
                    text = "".join(texts)
                    for start in range(0, len(text), step):
                        message: OutputMessage = {
                            "op": "output",
                            "stream": stream,
                            "text": text[start : start + step],
                            "dropped": dropped if start == 0 else 0,
                        }
                        self.channel.send(message)
            except Exception:  # the channel broke: the main loop finds out and ends
                pass
            finally:
                with self.cond:
                    self.sending = False
                    self.cond.notify_all()


STREAMS: list[io.TextIOWrapper] = []
"""The runner's own sys.stdout and sys.stderr (`fresh_streams`, from the runner's start), kept from
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


def flush_streams() -> None:
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            flushed = False  # what it still holds must not reach the next run's output
    # The code may have replaced, closed or reconfigured them (via an allowed module): then start
    # clean next time; else keep them (making two text streams per run is a tenth of a warm run).
    if flushed and _stream_intact(sys.stdout, STREAMS[0]) and _stream_intact(sys.stderr, STREAMS[1]):
        return
    fresh_streams()


def fresh_streams() -> None:
    STREAMS[:] = [_text_stream(1), _text_stream(2)]
    sys.stdout, sys.stderr = STREAMS
