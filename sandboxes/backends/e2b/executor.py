"""The E2B backend: our runner inside an E2B microVM, driven through the `e2b` SDK (async).

Transport (the choice the design asks us to state): a **long-lived runner process** started with the
SDK's command API, not the code-interpreter's ``run_code``. The runtime directory is uploaded with the
files API, ``python3 -I runner.py`` is started with ``commands.run(background=True, stdin=True,
timeout=0)``; requests go in with ``send_stdin`` (one ``SendInput`` RPC each, awaited in order) and
replies come back on the command's stdout stream, whose chunks we re-assemble into lines. Why:

* the runner is the same file on every backend, so state, fd-level capture, the policy and its
  runtime guard, tool calls back into the parent, ``final_answer``, artifacts and results mean the
  same here as on the host and in Docker. ``run_code`` would run code in a Jupyter kernel: Python-level
  capture only, no channel for tool calls during a run, a different template, and a timeout that
  fires at about twice its value;
* ``timeout=0`` because the SDK kills even a background command when its timeout (default 60 s)
  ends; our own wall-clock timeout (the base class's) is what bounds a run.

Lifetime and failure: a session owns one sandbox. Its timeout is set at create and extended while the
session is used; it is killed on ``close()`` and on every error path. A run that times out kills the
runner's whole process group in the sandbox (envd's kill signals only the process it started), so the
code stops there too; the sandbox, its files and its installed packages stay, and a fresh runner is
started in it. When the sandbox is gone ("not found", 502, a broken stream) the worker reports
`WorkerExited`; the next run gets a new sandbox and ``state_lost`` — and if the loss was seen while
idle, that next run executes normally in the new sandbox.

Network: the sandbox is created with egress open so that the runtime's dependency and ``pip_packages``
can be installed (once per sandbox, as root, arguments quoted after ``--``); unless the policy allows
network, egress is then closed (``deny_out 0.0.0.0/0``) before any user code runs (with network on:
every IPv4 range that is not the public internet), and a failure to close it fails the open rather
than running the code with a network the policy forbids.

Fork (`fork()`, snapshots): the runner forks itself inside the sandbox; the copy's channel is
`runtime/forkrelay.py`, started as a command like the runner. The family of executors that share the
sandbox is counted on it (`_Sandbox.users`), and the last one to close kills it (docs/fork.md).

Concurrency: sessions share one event loop; each sandbox holds a slot of a capacity limiter shared by
all executors with the same API key (``max_concurrent_sandboxes``; the latest value set wins), since
E2B limits concurrent sandboxes per account. The SDK itself is asyncio-only (its command handles
are asyncio tasks), so this backend is too.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import os
import posixpath
import shlex
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Self, Unpack

import anyio

from ...egress.match import NOT_PUBLIC
from ...errors import BackendUnavailable, FileTooLarge, ForkError, SandboxFileError, WorkerStartError
from ...executor import KILL_TIMEOUT, Executor, ExecutorOptions
from ...models import ForkReport, RunUsage
from ...runtime import RUNTIME_DIR
from ...session import Session
from ...usage import UsageProbe, metrics_usage
from ...worker import CappedBytes, ForkPlan, Worker, WorkerExit, WorkerExited

REMOTE_RUNTIME = ".kodeagent/runtime"
"""Where the runtime goes in the sandbox, relative to the user's home (the files API's base)."""
DEFAULT_WORKDIR = "work"
RUNTIME_REQUIREMENT = "RestrictedPython>=8.0"
SEND_CHUNK = 1 << 20
STDERR_KEPT = 4000
SANDBOX_MARGIN = 10
"""Seconds the sandbox's lifetime exceeds the run timeout at least, so it cannot expire mid-run."""

PROCTOOLS = f"~/{REMOTE_RUNTIME}/proctools.py"
"""The runtime's process and file helpers (`sandboxes/runtime/proctools.py`), run as a script in the
sandbox: the launcher, the process-tree killer, and the no-follow file placing and fetching (envd's
files API follows links the code may have planted, so a transfer goes through a private staging file
under ~/.kodeagent that the script copies into place, or out of place, one O_NOFOLLOW component at a
time)."""

FORKRELAY = f"~/{REMOTE_RUNTIME}/forkrelay.py"
"""The far end of a forked session's channel, and the kill of one session (`runtime/forkrelay.py`)."""
FORKS_DIR = ".kodeagent/forks"
"""Where forked sessions' working directories live, relative to the user's home."""

_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, anyio.CapacityLimiter]] = (
    weakref.WeakKeyDictionary()
)


def _sdk() -> Any:
    try:
        import e2b
    except ImportError as exc:
        raise BackendUnavailable("the e2b backend needs the e2b SDK: pip install 'kodeagent[e2b]'") from exc
    return e2b


def _limiter(api_key: str, limit: int) -> anyio.CapacityLimiter:
    per_loop = _limiters.setdefault(asyncio.get_running_loop(), {})
    limiter = per_loop.get(api_key)
    if limiter is None:
        limiter = per_loop[api_key] = anyio.CapacityLimiter(limit)
    elif limiter.total_tokens != limit:
        limiter.total_tokens = limit
    return limiter


class _Sandbox:
    """One sandbox: the SDK object, its concurrency slot and its lifetime."""

    def __init__(
        self, sandbox: Any, limiter: anyio.CapacityLimiter, lifetime: int, run_timeout: float
    ) -> None:
        self.sandbox = sandbox
        self.limiter = limiter
        self.lifetime = lifetime
        # Extend before what is left could be shorter than a run (plus a margin), and at the latest
        # halfway through the lifetime; a run that starts therefore never meets the sandbox's end.
        self.extend_after = min(lifetime / 2, lifetime - run_timeout - SANDBOX_MARGIN / 2)
        self.extended_at = time.monotonic()
        self.gone = False
        self.killed = False
        self.users = 1
        """Executors whose sessions live in this sandbox: its first and those forked from it
        (`E2BExecutor.fork`); only the last one's close kills the sandbox."""
        self.forks_dir: str | None = None  # absolute, made at the first fork

    @property
    def sandbox_id(self) -> str:
        return str(self.sandbox.sandbox_id)

    async def keep_alive(self) -> None:
        """Push the sandbox's end back while the session is in use (a no-op most of the time)."""
        if time.monotonic() - self.extended_at < self.extend_after:
            return
        asked_at = time.monotonic()
        try:
            await self.sandbox.set_timeout(self.lifetime)
        except _sdk().NotFoundException:
            self.gone = True  # the API no longer knows the sandbox: the send that follows fails too
        except Exception:
            pass  # transient (rate limit, network): tried again on the next send; never fails a run
        else:
            self.extended_at = asked_at

    async def kill(self) -> None:
        """Kill the sandbox (best effort, bounded) and give its slot back. Idempotent."""
        if self.killed:
            return
        self.killed = True
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_TIMEOUT):
                await self.sandbox.kill()
        except Exception:
            pass  # gone already, or unreachable: E2B ends it at its timeout
        finally:
            self.limiter.release_on_behalf_of(self)


class MetricsProbe(UsageProbe):
    """`usage.UsageProbe` from the sandbox's metrics (`AsyncSandbox.get_metrics`): samples of the
    whole microVM every few seconds (CPU percentage over the interval, memory in use), so the figures
    are approximate and of the session's scope: CPU is what the samples inside the run show (the
    last part of a run, after the latest sample, is not in it yet), memory the highest sample."""

    LOOK_BACK = 10
    """Seconds of samples before the run asked for too, for the interval of the first one inside it."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.started = 0.0
        self.wall_started = 0.0

    async def start(self) -> None:
        self.started = time.time()
        self.wall_started = time.perf_counter()

    async def stop(self) -> RunUsage | None:
        wall = time.perf_counter() - self.wall_started
        ended = time.time()
        since = datetime.datetime.fromtimestamp(self.started - self.LOOK_BACK, datetime.UTC)
        try:
            samples = await self.sandbox.get_metrics(start=since)
        except Exception:  # no metrics (an old template, the API unreachable): the result goes without
            return None
        return metrics_usage(list(samples or []), self.started, ended, wall)


class E2BWorker(Worker):
    """The runner process in a sandbox, reached through the SDK's command stdin and stdout."""

    isolation = "e2b-microvm"

    def __init__(self, session: _Sandbox) -> None:
        self.session = session
        self._line_in, self._lines = anyio.create_memory_object_stream[bytes](math.inf)
        self._pending: list[str] = []
        self._pending_size = 0
        self._stderr = ""
        self._detail = "the runner is still running"
        self._killed = False
        self.ended = False
        self.handle: Any = None
        self._watcher: asyncio.Task[None] | None = None
        self.workdir = DEFAULT_WORKDIR
        self._spare: asyncio.Task[E2BForkWorker] | None = None  # the relay of this session's next fork

    def usage_probe(self) -> MetricsProbe:
        return MetricsProbe(self.session.sandbox)

    # SDK callbacks: they must never raise (an exception silently stops the handle's callbacks).
    def _on_stdout(self, chunk: str) -> None:
        try:
            if "\n" not in chunk:
                self._pending.append(chunk)
                self._pending_size += len(chunk)
                if self._pending_size > self.line_limit:
                    self._refuse_long_line()
                return
            head, *middle, tail = chunk.split("\n")
            first = "".join(self._pending) + head
            for line in (first, *middle):
                if len(line) > self.line_limit:
                    self._refuse_long_line()
                    return
                self._line_in.send_nowait(line.encode() + b"\n")
            self._pending = [tail] if tail else []
            self._pending_size = len(tail)
        except Exception:  # closed stream after a kill: nothing to deliver to
            pass

    def _refuse_long_line(self) -> None:
        self._detail = f"the runner sent a protocol line longer than {self.line_limit:,} bytes"
        self._pending, self._pending_size = [], 0
        self._line_in.close()

    def _on_stderr(self, chunk: str) -> None:
        self._stderr = (self._stderr + chunk)[-STDERR_KEPT:]

    async def start(self, command: str, envs: dict[str, str]) -> None:
        self.handle = await self.session.sandbox.commands.run(
            command,
            background=True,
            stdin=True,
            timeout=0,
            envs=envs,
            on_stdout=self._on_stdout,
            on_stderr=self._on_stderr,
        )
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        e2b = _sdk()
        try:
            await self.handle.wait()
            self._detail = "the runner exited"
        except e2b.CommandExitException as exc:
            self._detail = f"the runner exited with code {exc.exit_code}"
        except e2b.SandboxNotRunningException as exc:
            self.session.gone = True
            self._detail = f"the E2B sandbox is gone ({exc})"
        except Exception as exc:
            self.session.gone = not await self._sandbox_running()
            self._detail = f"lost the connection to the runner ({type(exc).__name__}: {exc})"
        finally:
            self.ended = True
            if self._stderr.strip():
                self._detail += f"; its stderr ended with: {self._stderr.strip()[-500:]}"
            self._line_in.close()

    async def send(self, data: bytes) -> None:
        if self.ended or self._killed:
            raise WorkerExited(self._detail)
        await self.session.keep_alive()
        try:
            for start in range(0, len(data), SEND_CHUNK):
                await self.session.sandbox.commands.send_stdin(
                    self.handle.pid, data[start : start + SEND_CHUNK]
                )
        except Exception as exc:  # not found, 502, a broken connection: the runner is unreachable
            self._detail = f"could not reach the runner in the E2B sandbox ({type(exc).__name__}: {exc})"
            self.session.gone = self.session.gone or not await self._sandbox_running()
            raise WorkerExited(self._detail) from exc

    async def alive(self) -> bool:
        """Known without a round trip: the output stream ends when the runner or the sandbox does."""
        return not (self.ended or self._killed or self.session.gone)

    async def receive_line(self) -> bytes:
        try:
            return await self._lines.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise WorkerExited(self._detail) from None

    async def _sandbox_running(self) -> bool:
        try:
            with anyio.move_on_after(10):
                return bool(await self.session.sandbox.is_running())
        except Exception:
            pass
        return False

    def _kill_command(self) -> str:
        pid = int(self.handle.pid)
        return (
            f"python3 -I {PROCTOOLS} kill-tree {pid} 2>/dev/null; "
            f"kill -KILL -- -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null; true"
        )

    async def kill(self) -> None:
        """Kill the runner and its process group in the sandbox; the sandbox itself stays."""
        if self._killed:
            return
        self._killed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_TIMEOUT):
            if self.handle is not None and not self.ended and not self.session.gone:
                try:
                    await self.session.sandbox.commands.run(
                        self._kill_command(), timeout=KILL_TIMEOUT, request_timeout=KILL_TIMEOUT
                    )
                except Exception:
                    self.session.gone = not await self._sandbox_running()
            if self._watcher is not None and not self.session.gone:
                with anyio.move_on_after(2):
                    await asyncio.wait([self._watcher])
        await self.detach()

    async def detach(self) -> None:
        """Stop listening to the runner without touching it (the sandbox is about to be killed)."""
        self._killed = True
        self._drop_spare()
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
        if self.handle is not None and not self.ended:
            try:
                await self.handle.disconnect()
            except Exception:
                pass
        if self._detail == "the runner is still running":
            self._detail = "the runner was killed"
        self._line_in.close()

    async def exit_info(self) -> WorkerExit:
        return WorkerExit(detail=self._detail)

    # ------------------------------------------------------------------ fork (runtime/sessionfork.py)

    async def prepare_fork(self) -> ForkPlan:
        if not await self.alive():
            raise ForkError("this session's runner or its E2B sandbox is gone")
        session = self.session
        if session.forks_dir is None:
            result = await session.sandbox.commands.run(
                f"mkdir -p -- {FORKS_DIR} && chmod 0700 -- {FORKS_DIR} && cd -- {FORKS_DIR} && pwd",
                timeout=KILL_TIMEOUT,
                request_timeout=KILL_TIMEOUT,
            )
            session.forks_dir = str(result.stdout).strip()
        # The runner makes it (it must not exist): the same absolute path for it and the files API.
        return ForkPlan(posixpath.join(session.forks_dir, os.urandom(8).hex()), "listen")

    async def hand_over(self, plan: ForkPlan) -> None:
        path, secret = plan.answer.get("path"), plan.answer.get("secret")
        if not isinstance(path, str) or not isinstance(secret, str) or not secret.isalnum() or "\n" in path:
            raise ForkError(f"the runner's fork_channel answer is malformed: {str(plan.answer)[:200]}")
        try:
            relay = plan.state["relay"] = await self._take_relay()
            # Where to connect and the secret go on its stdin, never on a command line.
            await relay.send(f"{path} {secret}\n".encode())
        except WorkerExited as exc:
            raise ForkError(f"the fork's relay did not start in the E2B sandbox ({exc})") from exc
        except Exception as exc:
            raise ForkError(f"could not start the fork's relay in the E2B sandbox: {exc}") from exc

    def forked(self, plan: ForkPlan, pid: int) -> E2BForkWorker:
        relay: E2BForkWorker = plan.state.pop("relay")
        relay.runner_pid = pid
        relay.workdir = plan.workdir
        self._spare_soon()
        return relay

    async def _new_relay(self) -> E2BForkWorker:
        relay = E2BForkWorker(self.session)
        await relay.start(f"exec python3 -I -S {FORKRELAY} relay", {})
        return relay

    async def _take_relay(self) -> E2BForkWorker:
        """The spare relay started after this session's previous fork (starting a command is most of
        a fork's cost), if it is still there; else a new one. It waits for its first line."""
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                relay = await spare
            except Exception:
                relay = None
            if relay is not None:
                if await relay.alive():
                    return relay
                await relay.kill()
        return await self._new_relay()

    def _spare_soon(self) -> None:
        if self._spare is None and not self._killed and not self.session.gone:
            self._spare = asyncio.get_running_loop().create_task(self._new_relay())

    def _drop_spare(self) -> None:
        """End the spare relay (in the background; at once if the sandbox is being killed anyway)."""
        spare, self._spare = self._spare, None
        if spare is None:
            return
        if self.session.users <= 1 and spare.done():
            return  # the sandbox goes with this session: its end takes the relay
        spare.add_done_callback(_kill_spare)

    async def abandon_fork(self, plan: ForkPlan) -> None:
        relay = plan.state.pop("relay", None)
        if relay is not None:  # the runner removed the directory itself; the relay goes
            await relay.kill()

    def _remote(self, path: str) -> str:
        return posixpath.join(self.workdir, path)

    async def _transfer_script(self, action: str, path: str, *args: str) -> None:
        e2b = _sdk()
        command = " ".join(["python3", "-I", PROCTOOLS, action, *(shlex.quote(a) for a in args)])
        try:
            await self.session.sandbox.commands.run(command, timeout=60, request_timeout=60)
        except e2b.CommandExitException as exc:
            if exc.exit_code == 2:
                raise SandboxFileError(f"{path!r} does not exist in the working directory") from None
            if exc.exit_code == 3:
                raise SandboxFileError(
                    f"{path!r} goes through a symlink or is not a regular file in the sandbox; refused"
                ) from None
            raise SandboxFileError(f"could not transfer {path!r} in the E2B sandbox: {exc}") from exc

    def _transfer_name(self) -> str:
        return posixpath.join(posixpath.dirname(REMOTE_RUNTIME), f"transfer-{os.urandom(8).hex()}")

    async def write_file(self, path: str, data: bytes) -> None:
        staged = self._transfer_name()
        try:
            await self.session.sandbox.files.write(staged, data)
        except Exception as exc:
            raise SandboxFileError(f"could not write {path!r} in the E2B sandbox: {exc}") from exc
        try:
            await self._transfer_script("place", path, staged, self.workdir, path)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self.session.sandbox.files.remove(staged)
                except Exception:
                    pass  # already moved into place

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        """Copied (no link followed, at most `max_bytes` + 1 bytes) to a staged file, then streamed out
        of the files API and counted as it arrives: the staged file is within the code's reach, so
        neither its size nor envd's is taken on trust; the stream is closed at the cap."""
        staged = self._transfer_name()
        await self._transfer_script("fetch", path, self.workdir, path, staged, str(max_bytes + 1))
        gathered = CappedBytes(path, max_bytes)
        try:
            stream = await self.session.sandbox.files.read(staged, format="stream")
            try:
                async for chunk in stream:
                    gathered.add(chunk)
            finally:  # mid-body at the cap: the connection goes, the rest is never read
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
            return gathered.value()
        except FileTooLarge:
            raise
        except Exception as exc:
            raise SandboxFileError(f"could not read {path!r} from the E2B sandbox: {exc}") from exc
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self.session.sandbox.files.remove(staged)
                except Exception:
                    pass


class E2BForkWorker(E2BWorker):
    """A session forked inside its parent's sandbox: its runner is a grandchild of the forked one,
    reached through `forkrelay.py` (started as a command, as the runner is), whose stdin and stdout
    are this worker's channel. Its kill ends its own runner's process group and tree and removes its
    working directory (``forkrelay.py end``); the sandbox stays for the rest of the family."""

    def __init__(self, session: _Sandbox) -> None:
        super().__init__(session)
        self.runner_pid: int | None = None  # None until the runner forked: then only the relay goes

    def usage_probe(self) -> None:  # type: ignore[override]
        # The sandbox's metrics cover the whole microVM, so every session of the family.
        return None

    async def kill(self) -> None:
        if not self._killed and self.ended and self.runner_pid is not None and not self.session.gone:
            # The relay ended (its runner did): what the runner started and its copy may remain.
            with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_TIMEOUT):
                try:
                    await self.session.sandbox.commands.run(
                        self._kill_command(), timeout=KILL_TIMEOUT, request_timeout=KILL_TIMEOUT
                    )
                except Exception:
                    pass
        await super().kill()

    def _kill_command(self) -> str:
        relay = int(self.handle.pid)
        end = ""
        if self.runner_pid is not None:
            end = f"python3 -I -S {FORKRELAY} end {self.runner_pid} {shlex.quote(self.workdir)} 2>/dev/null; "
        return f"{end}kill -KILL {relay} 2>/dev/null; true"

    async def detach(self) -> None:
        # A fork's runner stays in a sandbox that others use: closing means killing it.
        if not self._killed and self.session.users > 1 and not self.session.gone:
            await self.kill()
            return
        await super().detach()


class E2BOptions(ExecutorOptions, total=False):
    """Every option `E2BExecutor` takes (all by keyword), typed for ``open_executor("e2b", ...)``:
    the common ones and the executor's own (its docstring says what each does)."""

    template: str
    pip_packages: Sequence[str]
    api_key: str | None
    sandbox_timeout: int
    max_concurrent_sandboxes: int
    install_timeout: float
    api_url: str | None
    sandbox_url: str | None
    domain: str | None
    request_timeout: float


class E2BExecutor(Executor):
    """Runs code in an E2B sandbox (a Firecracker microVM in E2B's cloud), one sandbox per session.

    Args (besides the common `ExecutorOptions`):
        template: the E2B template to start; it needs ``python3`` (``"base"`` has it).
        pip_packages: requirement specifiers (``"pandas>=2"``) installed once per sandbox with pip,
            passed as separate, quoted arguments after ``--`` (never interpreted by a shell).
        api_key: the E2B API key; defaults to the ``E2B_API_KEY`` environment variable.
        sandbox_timeout: seconds the sandbox lives without use; extended while the session is used.
        max_concurrent_sandboxes: sandboxes alive at once for this API key, across all executors in
            this event loop; creating one more waits for a slot.
        install_timeout: seconds allowed for installing packages.
        api_url, sandbox_url, domain, request_timeout: passed to the SDK (e.g. a self-hosted E2B or
            the test stand-in).
        workdir: the code's working directory in the sandbox, relative to the user's home
            (default ``"work"``).
    """

    backend = "e2b"

    def __init__(
        self,
        *,
        template: str = "base",
        pip_packages: Sequence[str] = (),
        api_key: str | None = None,
        sandbox_timeout: int = 300,
        max_concurrent_sandboxes: int = 20,
        install_timeout: float = 600.0,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        domain: str | None = None,
        request_timeout: float = 30.0,
        **options: Unpack[ExecutorOptions],
    ) -> None:
        super().__init__(**options)
        _sdk()
        key = api_key or os.environ.get("E2B_API_KEY")
        if not key:
            raise BackendUnavailable(
                "the e2b backend needs an E2B API key: set E2B_API_KEY (create one at "
                "https://e2b.dev/dashboard?tab=keys) or pass api_key=..."
            )
        self.api_key = key
        self.template = template
        self.pip_packages = _checked_packages(pip_packages)
        if sandbox_timeout < 1 or max_concurrent_sandboxes < 1:
            raise ValueError("sandbox_timeout and max_concurrent_sandboxes must be at least 1")
        # The sandbox must outlive the longest run by a margin, or it could expire mid-run.
        self.sandbox_timeout = max(int(sandbox_timeout), math.ceil(self.timeout) + SANDBOX_MARGIN)
        self.max_concurrent_sandboxes = int(max_concurrent_sandboxes)
        self.install_timeout = float(install_timeout)
        self.remote_workdir = _checked_workdir(self.workdir or DEFAULT_WORKDIR)
        self._connection: dict[str, Any] = {"api_key": key, "request_timeout": request_timeout}
        for name, value in (("api_url", api_url), ("sandbox_url", sandbox_url), ("domain", domain)):
            if value is not None:
                self._connection[name] = value
        self._sandbox: _Sandbox | None = None

    @property
    def sandbox_id(self) -> str | None:
        """The id of the session's current sandbox (None before open or after it was lost)."""
        return self._sandbox.sandbox_id if self._sandbox else None

    # ----------------------------------------------------------------- the backend's hooks

    async def _close_backend(self) -> None:
        # The sandbox outlives the runners started in it (a timeout restarts only the runner), and
        # is shared with this executor's forks: the family's last close kills it.
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.users -= 1
            if sandbox.users <= 0 or sandbox.gone:
                await sandbox.kill()

    # ----------------------------------------------------------------- fork: one sandbox, a family

    def _forked_executor(self) -> Self:
        child = super()._forked_executor()
        child._sandbox = None  # set by `_open_on_fork`: the child's session lives in this sandbox
        return child

    def _open_on_fork(self, forked: Session, report: ForkReport) -> None:
        """As `Executor`'s: the child's runner is a fork inside the parent's (or the snapshot's)
        sandbox, which they then share (see docs/fork.md, E2B); the sandbox is killed when the last
        of them closes."""
        super()._open_on_fork(forked, report)
        self._adopt()

    def _adopt(self) -> None:
        session = self._current
        worker = getattr(session, "worker", None)
        if self._sandbox is None and isinstance(worker, E2BWorker):
            self._sandbox = worker.session
            worker.session.users += 1

    async def _new_session(self) -> Session:
        rules = self.policy.network_policy
        if rules is not None and (rules.allow or rules.deny or rules.secrets):
            raise BackendUnavailable(
                "the e2b backend does not map NetworkPolicy allow/deny rules or secrets onto E2B's network "
                "options yet; use Policy(network=True) (the public internet only) there, or the host or "
                "docker backend"
            )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise BackendUnavailable(
                "the e2b SDK runs only on asyncio; use anyio's asyncio backend"
            ) from None
        if self._sandbox is not None and (self._sandbox.gone or self._sandbox.killed):
            await self._close_backend()
        for attempt in (1, 2):
            if self._sandbox is None:
                self._sandbox = await self._new_sandbox()
            worker = E2BWorker(self._sandbox)
            worker.workdir = self.remote_workdir
            try:
                await worker.start(self._runner_command(), self.env)
                break
            except Exception as exc:
                await self._close_backend()  # the sandbox may be gone; a new one is tried once
                if attempt == 2:
                    raise WorkerStartError(f"could not start the runner in the E2B sandbox: {exc}") from exc
        return await self._runner_session(worker, release=_detach)

    def _runner_command(self) -> str:
        # Started by bash in the working directory: the launcher makes the runner the leader of a
        # process group (so that a kill reaches everything the code started) without a fork, keeping
        # the pid envd knows.
        runner = f"~/{REMOTE_RUNTIME}/runner.py"
        workdir = shlex.quote(self.remote_workdir)
        return f"mkdir -p -- {workdir} && cd -- {workdir} && exec python3 -I {PROCTOOLS} launch {runner}"

    async def _new_sandbox(self) -> _Sandbox:
        e2b = _sdk()
        limiter = _limiter(self.api_key, self.max_concurrent_sandboxes)
        session = _Sandbox(None, limiter, self.sandbox_timeout, self.timeout)
        await limiter.acquire_on_behalf_of(session)
        session.extended_at = time.monotonic()
        try:
            session.sandbox = await e2b.AsyncSandbox.create(
                self.template,
                timeout=self.sandbox_timeout,
                envs=self.env,
                metadata={"created_by": "kodeagent"},
                # Open while we install the runtime's and the caller's packages; closed right after
                # unless the policy allows network (see `_prepare`).
                allow_internet_access=True,
                **self._connection,
            )
        except BaseException as exc:
            limiter.release_on_behalf_of(session)
            if isinstance(exc, e2b.AuthenticationException):
                raise BackendUnavailable(f"E2B rejected the API key; check E2B_API_KEY ({exc})") from exc
            if isinstance(exc, Exception):
                raise WorkerStartError(
                    f"could not create an E2B sandbox from {self.template!r}: {exc}"
                ) from exc
            raise
        try:
            await self._prepare(session.sandbox)
        except BaseException:
            await session.kill()
            raise
        return session

    async def _prepare(self, sandbox: Any) -> None:
        """Upload the runtime and install what it and the caller need (once per sandbox)."""
        files = [{"path": f"{REMOTE_RUNTIME}/{name}", "data": data} for name, data in await _runtime_files()]
        await sandbox.files.write_files(files)
        check = "python3 -c 'import RestrictedPython' 2>/dev/null"
        install = _pip_command([RUNTIME_REQUIREMENT, *self.pip_packages])
        command = install if self.pip_packages else f"{check} || {install}"
        e2b = _sdk()
        try:
            await sandbox.commands.run(
                command,
                user="root",
                # The sandbox is ours alone: pip may install next to a distribution's Python (PEP 668).
                envs={"PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_ROOT_USER_ACTION": "ignore"},
                timeout=self.install_timeout,
                request_timeout=self.install_timeout,
            )
        except e2b.CommandExitException as exc:
            output = (exc.stderr or exc.stdout or "").strip()[-2000:]
            raise WorkerStartError(
                f"installing packages in the E2B sandbox failed (exit {exc.exit_code}); check the "
                f"names in pip_packages {list(self.pip_packages)!r}. pip said:\n{output}"
            ) from exc
        # Without network: no egress at all. With it: E2B's own network (not this machine's), minus
        # every range that is not the public internet (E2B's egress rules take IPv4 ranges).
        closed = ["0.0.0.0/0"] if self.policy.network_policy is None else list(E2B_NOT_PUBLIC)
        try:
            await sandbox.update_network({"deny_out": closed})
        except Exception as exc:  # fail closed: the policy says no network, or the public internet only
            raise WorkerStartError(
                f"could not restrict the E2B sandbox's network as the policy requires ({exc}); "
                "use Policy(network=True) only if the code may reach the internet"
            ) from exc


E2B_NOT_PUBLIC = tuple(net for net, _ in NOT_PUBLIC if ":" not in net)
"""What a network-on E2B sandbox may not reach: every IPv4 range that is not the public internet."""


def _pip_command(requirements: Iterable[str]) -> str:
    args = ["python3", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input", "--"]
    return " ".join(shlex.quote(arg) for arg in [*args, *requirements])


def _checked_packages(packages: Sequence[str]) -> tuple[str, ...]:
    if isinstance(packages, str):
        raise TypeError("pip_packages must be a list of requirement strings, e.g. ['pandas>=2']")
    checked = []
    for package in packages:
        if not isinstance(package, str) or not package.strip():
            raise ValueError(f"pip_packages entries must be non-empty strings, got {package!r}")
        if package.lstrip().startswith("-") or any(c in package for c in "\x00\n\r"):
            raise ValueError(
                f"pip_packages entry {package!r} is not a requirement specifier; give names like "
                "'pandas' or 'pandas>=2' (pip options are not accepted)"
            )
        checked.append(package.strip())
    return tuple(checked)


def _checked_workdir(workdir: str) -> str:
    if not workdir or any(c in workdir for c in "\x00\n\r"):
        raise ValueError(f"invalid workdir {workdir!r}")
    return workdir


_runtime_cache: list[tuple[str, bytes]] | None = None


async def _runtime_files() -> list[tuple[str, bytes]]:
    """The runtime directory's Python files, read once per process (without blocking the loop)."""
    global _runtime_cache
    if _runtime_cache is None:

        def read() -> list[tuple[str, bytes]]:
            return [(p.name, p.read_bytes()) for p in sorted(RUNTIME_DIR.glob("*.py"))]

        _runtime_cache = await anyio.to_thread.run_sync(read)
    return _runtime_cache


_ending: set[asyncio.Task[None]] = set()
"""Kills of spare relays under way (held here so that the loop does not drop them)."""


def _kill_spare(spare: asyncio.Task[E2BForkWorker]) -> None:
    if spare.cancelled() or spare.exception() is not None:
        return
    task = asyncio.get_running_loop().create_task(spare.result().kill())
    _ending.add(task)
    task.add_done_callback(_ending.discard)


async def _detach(worker: Worker) -> None:
    # A normal close: the executor kills the whole sandbox right after (`_close_backend`), which stops
    # the runner with it, so there is no need to wait for a kill inside the sandbox first; unless
    # forks of the family still use the sandbox: then this runner is killed in it.
    if isinstance(worker, E2BWorker) and worker.session.users <= 1:
        await worker.detach()
    else:
        await worker.kill()
