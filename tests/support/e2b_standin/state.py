"""The stand-in's sandboxes: a directory and real local processes each, with a lifetime.

A sandbox here is a per-sandbox directory tree (``<root>/home/user`` is the user's home, as in the
E2B ``base`` template) and the processes started in it. Commands are real subprocesses of this
machine, each in its own session, with a minimal environment (never the test process's secrets).
What matters for the client is reproduced faithfully:

* the sandbox dies when its timeout passes (or when a test makes it vanish): every process is
  killed, open output streams end with an ``unavailable`` error, the files are gone, and further
  requests get the proxy's 502 "sandbox was not found";
* ``SendSignal`` signals only the process envd started, not its children (as the real envd);
* a command's stream deadline (``Connect-Timeout-Ms``) kills the command, as the real envd does
  for ``commands.run(timeout=60)``, background or not.
"""

from __future__ import annotations

import datetime
import math
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from sandboxes.usage import ProcessTree, descendants, parse_status_kib

from . import namespaces
from .connect import RpcError

ENVD_VERSION = "0.6.4"
HOME = "/home/user"
PYTHON_DIR = os.path.dirname(sys.executable)
BASE_PATH = os.pathsep.join([PYTHON_DIR, "/usr/local/bin", "/usr/bin", "/bin"])
PROFILE = f'export PATH="{PYTHON_DIR}:$PATH"\n'
"""The template's ``~/.profile``: the SDK runs commands with ``bash -l``, whose /etc/profile resets
PATH, so (as a template's image would) the profile puts first the ``python3`` of this interpreter,
which has RestrictedPython, like a template with the package preinstalled."""

METRICS_INTERVAL = 0.25
"""Seconds between metric samples (E2B: 5)."""
METRICS_KEPT = 2400
METRICS_CPU_COUNT = 2
METRICS_MEMORY_TOTAL = 512 << 20
METRICS_DISK_TOTAL = 1024 << 20

Event = tuple[str, Any]
"""("stdout" | "stderr", bytes), ("end", dict) or ("gone", message) sent to stream subscribers."""


@dataclass
class Process:
    pid: int
    tag: str | None
    config: dict[str, Any]
    proc: anyio.abc.Process
    subscribers: list[MemoryObjectSendStream[Event]] = field(default_factory=list)
    end: dict[str, Any] | None = None

    def publish(self, event: Event) -> None:
        for stream in list(self.subscribers):
            try:
                stream.send_nowait(event)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.subscribers.remove(stream)

    def signal(self, signum: int) -> None:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


@dataclass
class Sandbox:
    sandbox_id: str
    template_id: str
    api_key: str
    root: Path
    envs: dict[str, str]
    metadata: dict[str, str]
    access_token: str
    started_at: float
    end_at: float
    processes: dict[int, Process] = field(default_factory=dict)
    alive: bool = True
    network: dict[str, Any] = field(default_factory=dict)
    """Egress settings as last sent (create's ``allow_internet_access``, ``PUT .../network``); recorded,
    not enforced: the stand-in has no internet to give or take."""
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """The sandbox's metric samples, oldest first, as ``GET /sandboxes/{id}/metrics`` returns them."""
    cpu_ended: float = 0.0
    """CPU seconds of the sandbox's commands that have ended (their last reading)."""
    cpu_last: dict[int, float] = field(default_factory=dict)
    namespaces: tuple[int, int] | None = None
    """Descriptors of the sandbox's own network and IPC namespaces (`namespaces.py`), as its own VM
    would have; None where the stand-in may not make them (not root)."""

    @property
    def home(self) -> Path:
        return self.root / HOME.lstrip("/")

    def resolve(self, path: str) -> Path:
        """Map a path inside the sandbox to this machine; relative paths start at the home directory."""
        if not path:
            raise ValueError("empty path")
        inside = path if path.startswith("/") else f"{HOME}/{path}"
        normal = os.path.normpath(inside)
        return self.root / normal.lstrip("/")

    def sandbox_path(self, local: Path) -> str:
        return "/" + str(local.relative_to(self.root))

    def find(self, selector: Mapping[str, Any]) -> Process:
        if "pid" in selector:
            process = self.processes.get(int(selector["pid"]))
        elif "tag" in selector:
            process = next((p for p in self.processes.values() if p.tag == selector["tag"]), None)
        else:
            raise RpcError("invalid_argument", "process selector needs a pid or a tag")
        if process is None or process.end is not None:
            raise RpcError("not_found", f"process with {dict(selector)} not found")
        return process


class Registry:
    """All sandboxes of the stand-in. Lives on the server's event loop; tests reach it via the portal."""

    def __init__(self, base_dir: Path, task_group: anyio.abc.TaskGroup, max_sandboxes: int) -> None:
        self.base_dir = base_dir
        self.task_group = task_group
        self.max_sandboxes = max_sandboxes
        self.sandboxes: dict[str, Sandbox] = {}
        self.stats: dict[str, int] = {
            "created": 0,
            "killed": 0,
            "expired": 0,
            "vanished": 0,
            "peak_running": 0,
        }
        self.requests: dict[str, int] = {}
        self.metrics_interval = METRICS_INTERVAL

    def running(self, api_key: str | None = None) -> list[Sandbox]:
        return [s for s in self.sandboxes.values() if s.alive and (api_key is None or s.api_key == api_key)]

    def get_alive(self, sandbox_id: str) -> Sandbox | None:
        sandbox = self.sandboxes.get(sandbox_id)
        return sandbox if sandbox is not None and sandbox.alive else None

    async def create(
        self, api_key: str, template_id: str, timeout: float, envs: dict[str, str], metadata: dict[str, str]
    ) -> Sandbox:
        sandbox_id = "i" + secrets.token_hex(9)
        root = self.base_dir / sandbox_id
        home = root / HOME.lstrip("/")

        def make_tree() -> None:
            home.mkdir(parents=True)
            (home / ".profile").write_text(PROFILE)
            (root / "tmp").mkdir()

        await anyio.to_thread.run_sync(make_tree)
        separated = await anyio.to_thread.run_sync(namespaces.make)
        now = time.time()
        sandbox = Sandbox(
            sandbox_id=sandbox_id,
            template_id=template_id,
            api_key=api_key,
            root=root,
            envs=envs,
            metadata=metadata,
            access_token=secrets.token_urlsafe(24),
            started_at=now,
            end_at=now + timeout,
            namespaces=separated,
        )
        self.sandboxes[sandbox_id] = sandbox
        self.stats["created"] += 1
        self.stats["peak_running"] = max(self.stats["peak_running"], len(self.running()))
        self.task_group.start_soon(self._expire_when_due, sandbox)
        self.task_group.start_soon(self._sample_metrics, sandbox)
        return sandbox

    async def _sample_metrics(self, sandbox: Sandbox) -> None:
        """E2B's metrics: every `metrics_interval` seconds one sample of the whole sandbox, its CPU
        use over the interval just past (a percentage of all its cores) and the memory in use then.
        Here the sandbox is its commands' process trees, read from /proc (as the VM's own counters
        see every process in it); E2B samples every 5 s, the stand-in more often so that tests see
        samples within a run."""
        last_time, last_cpu = time.time(), self._sandbox_cpu(sandbox)
        while sandbox.alive:
            await anyio.sleep(self.metrics_interval)
            now, cpu = time.time(), self._sandbox_cpu(sandbox)
            percent = max(0.0, cpu - last_cpu) / max(now - last_time, 1e-6) / METRICS_CPU_COUNT * 100
            last_time, last_cpu = now, cpu
            sandbox.metrics.append(
                {
                    "timestamp": _iso(now),
                    "timestampUnix": int(now),
                    "cpuCount": METRICS_CPU_COUNT,
                    "cpuUsedPct": round(percent, 2),
                    "memUsed": self._sandbox_memory(sandbox),
                    "memTotal": METRICS_MEMORY_TOTAL,
                    "memCache": 0,
                    "diskUsed": 0,
                    "diskTotal": METRICS_DISK_TOTAL,
                }
            )
            del sandbox.metrics[:-METRICS_KEPT]

    @staticmethod
    def _sandbox_cpu(sandbox: Sandbox) -> float:
        live: dict[int, float] = {}
        for pid in list(sandbox.processes):
            reading = ProcessTree(pid).cpu()
            if reading is not None:
                live[pid] = reading.user + reading.system
        for pid, seconds in sandbox.cpu_last.items():
            if pid not in live:
                sandbox.cpu_ended += seconds
        total = sandbox.cpu_ended + sum(live.values())
        sandbox.cpu_last = live
        return total

    @staticmethod
    def _sandbox_memory(sandbox: Sandbox) -> int:
        used = 0
        for root in list(sandbox.processes):
            for pid in [root, *descendants(root)]:
                try:
                    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
                        used += parse_status_kib(handle.read(), "VmRSS") or 0
                except OSError:
                    continue
        return used

    def set_timeout(self, sandbox: Sandbox, timeout: float, *, only_extend: bool = False) -> None:
        end_at = time.time() + timeout
        if not only_extend or end_at > sandbox.end_at:
            sandbox.end_at = end_at

    async def _expire_when_due(self, sandbox: Sandbox) -> None:
        while sandbox.alive:
            remaining = sandbox.end_at - time.time()
            if remaining <= 0:
                self.stats["expired"] += 1
                await self.destroy(sandbox, reason="reached its timeout")
                return
            await anyio.sleep(min(remaining, 0.5))

    async def destroy(self, sandbox: Sandbox, *, reason: str) -> None:
        """The VM is gone: processes killed, streams broken, files deleted."""
        if not sandbox.alive:
            return
        sandbox.alive = False
        for process in sandbox.processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.publish(("gone", f"the connection to sandbox {sandbox.sandbox_id} ended ({reason})"))
        # A VM's end takes every process in it, also those in sessions of their own (a forked runner).
        await anyio.to_thread.run_sync(_kill_the_rest, sandbox.home)
        namespaces.close(sandbox.namespaces)
        sandbox.namespaces = None
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(sandbox.root, ignore_errors=True))

    async def start_process(self, sandbox: Sandbox, request: Mapping[str, Any]) -> tuple[Process, Any]:
        """Start a command; returns it and a subscription to its events (taken before any output)."""
        config = dict(request.get("process") or {})
        cmd = config.get("cmd")
        if not cmd:
            raise RpcError("invalid_argument", "process.cmd is required")
        if request.get("pty"):
            raise RpcError("unimplemented", "PTY processes are not supported by the stand-in")
        cwd = sandbox.resolve(config["cwd"]) if config.get("cwd") else sandbox.home
        if not cwd.is_dir():
            raise RpcError("invalid_argument", f"cwd '{config.get('cwd')}' does not exist")
        env = {
            "PATH": BASE_PATH,
            "HOME": str(sandbox.home),
            "USER": "user",
            "LANG": "C.UTF-8",
            "TMPDIR": str(sandbox.root / "tmp"),
        }
        env.update(sandbox.envs)
        env.update({str(k): str(v) for k, v in (config.get("envs") or {}).items()})
        proc = await anyio.open_process(
            namespaces.command(sandbox.namespaces, [cmd, *config.get("args", [])]),
            stdin=-1 if request.get("stdin") else -3,  # PIPE, or DEVNULL when stdin is off
            stdout=-1,
            stderr=-1,
            cwd=cwd,
            env=env,
            start_new_session=True,
            pass_fds=sandbox.namespaces or (),
        )
        process = Process(pid=proc.pid, tag=request.get("tag"), config=config, proc=proc)
        sandbox.processes[proc.pid] = process
        _, events = self.make_subscription(process)
        self.task_group.start_soon(self._pump, sandbox, process)
        return process, events

    async def _pump(self, sandbox: Sandbox, process: Process) -> None:
        done = {"stdout": anyio.Event(), "stderr": anyio.Event()}

        async def read(name: str, stream: anyio.abc.ByteReceiveStream | None) -> None:
            try:
                if stream is not None:
                    async for chunk in stream:
                        process.publish((name, chunk))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
            finally:
                done[name].set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, "stdout", process.proc.stdout)
            tg.start_soon(read, "stderr", process.proc.stderr)
            code = await process.proc.wait()
            # Descendants may hold the pipes open; do not wait for them longer than a moment.
            with anyio.move_on_after(0.2):
                for event in done.values():
                    await event.wait()
            tg.cancel_scope.cancel()
        if code < 0:
            end = {
                "exitCode": -1,
                "exited": False,
                "status": f"signal: {signal.Signals(-code).name[3:].lower()}",
            }
            if -code == signal.SIGKILL:
                end["status"] = "signal: killed"
        else:
            end = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
        if code != 0:
            end["error"] = end["status"]
        process.end = end
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            await process.proc.aclose()  # closes the pipes' transports while the loop still runs
        if sandbox.alive:
            process.publish(("end", end))
        sandbox.processes.pop(process.pid, None)

    @staticmethod
    def make_subscription(process: Process) -> tuple[Any, Any]:
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        process.subscribers.append(send)
        return send, receive


def _kill_the_rest(home: Path) -> None:
    """SIGKILL every process started in the sandbox whose home is `home` (found by its environment)."""
    marker = f"HOME={home}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if marker in handle.read().split(b"\0"):
                    os.kill(int(name), signal.SIGKILL)
        except OSError:
            continue


def _iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat().replace("+00:00", "Z")
