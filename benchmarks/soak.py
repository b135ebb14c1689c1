"""A soak: thousands of sessions through one process, to show that nothing is left behind.

    python -m benchmarks.soak [--backend host|docker] [--sessions N] [--concurrency 2] [--every 1000]

Each session is opened, given one or two runs and closed; `--concurrency` sessions are in flight at
once. One session in 20 each runs code that times out (a 0.5 s timeout on `while True: pass`),
kills its own worker (SIGKILL), hits the memory limit (`bytearray(400 MiB)` under a 256 MB limit),
floods 10 MB of output, or forks (`fork()`, a run in the child, the child closed); the rest are
ordinary runs. Every result
is checked against what it must be; a session that differs is an anomaly, printed at the end.

What is measured, in this (the driving) process, at the start, every `--every` sessions (a tenth
of them, at most 1,000) and at the end, each time after the sessions in flight have finished and `--settle` seconds have passed:
open descriptors (`/proc/self/fd`), threads (`threading.active_count()` and `/proc/self/task`),
descendant processes (and how many are zombies), processes of the host backend's private users
that are ours or orphaned (when root), resident memory (VmRSS), Python objects the collector tracks (`gc`), the temporary
directories the sessions made, and on Docker the containers labelled as this process's. Nothing is
garbage-collected first: a descriptor that waits for the collector to be released is a finding (the
Docker backend's attach sockets did, until its workers closed them at once).

The verdict compares the first checkpoint after warm-up (the one after `--every` sessions: by then
every configuration's fork server, warm pool and the Docker client's connections exist) with the
end. What is allowed to differ, and why (`GROWTH_ALLOWED`):
- descriptors +5: a pool refill can be in flight at a checkpoint (a socket pair and pipes);
- threads +4: anyio's worker threads come and go (each idles 10 s before it exits), and how
  many exist at a checkpoint depends on how many blocking calls overlapped in the last 10 s;
- processes, private-user processes, temporary directories and containers +2: one pool refill
  (a worker and its directory, or a container) may be on its way at a checkpoint;
- zombies +1; resident memory +10% (and at least 8 MB: the allocator keeps freed arenas);
  Python objects +10%.
A leak of one item per session, or per kind of session, grows far past these (by hundreds over
the run). Exits 1 when something grew or a result was wrong, 0 otherwise.

The temporary directories are counted in a private temporary directory the soak makes for itself
(as `TMPDIR`), so that other processes on the machine do not count.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio
from rich.console import Console

from sandboxes import BackendUnavailable, Limits, Policy, open_executor
from sandboxes.backends import backend_name
from sandboxes.executor import Executor

from .common import add_backend_option, make_console, parse_key_values, print_table, publish, script_main

DEFAULT_SESSIONS = {"host": 10_000, "docker": 1_000}
BACKENDS = tuple(DEFAULT_SESSIONS)
DEFAULT_SETTLE = {"host": 0.5, "docker": 2.0}

TIMEOUT = 20.0
"""Every run but the one meant to time out: long enough that a busy machine never times one out."""
SHORT_TIMEOUT = 0.5
FLOOD_BYTES = 10 * 2**20
MEMORY_POLICY = Policy(limits=Limits(memory_mb=256))
CRASH_POLICY = Policy(allowed_imports=["os", "signal"], subprocess=True)

CYCLE = 20
SPECIAL = {3: "timeout", 7: "crash", 11: "oom", 15: "flood", 19: "fork"}
"""Which session of every `CYCLE` does what; the others are ordinary runs."""
KINDS = ("plain", *SPECIAL.values())

RESOURCES: tuple[tuple[str, str], ...] = (
    ("fds", "descriptors"),
    ("threads", "threads"),
    ("tasks", "OS threads"),
    ("processes", "processes"),
    ("zombies", "zombies"),
    ("uid_processes", "private-user processes"),
    ("rss_mb", "RSS MB"),
    ("objects", "Python objects"),
    ("temp_dirs", "temp dirs"),
    ("containers", "containers"),
)
GROWTH_ALLOWED: dict[str, tuple[float, float]] = {
    "fds": (5, 0.0),
    "threads": (4, 0.0),
    "tasks": (4, 0.0),
    "processes": (2, 0.0),
    "zombies": (1, 0.0),
    "uid_processes": (2, 0.0),
    "rss_mb": (8.0, 0.10),
    "objects": (0, 0.10),
    "temp_dirs": (2, 0.0),
    "containers": (2, 0.0),
}
"""Per resource: (absolute, relative) growth allowed after warm-up; the larger of the two applies."""


def kind_of(index: int) -> str:
    """What session `index` does (the same on every run, so two soaks are comparable)."""
    return SPECIAL.get(index % CYCLE, "plain")


# ---------------------------------------------------------------------- the sessions


class Anomaly(Exception):
    """A result that is not what the session's kind must produce."""


def _expect(condition: bool, what: str, result: Any) -> None:
    if not condition:
        error = getattr(result, "error", None)
        detail = f"{error.type}: {error.message}"[:160] if error is not None else "no error"
        raise Anomaly(f"{what} (ok={getattr(result, 'ok', None)}, {detail})")


def _executor(backend: str, kind: str, options: dict[str, Any]) -> Executor:
    if kind == "timeout":
        return open_executor(backend_name(backend), timeout=SHORT_TIMEOUT, **options)
    if kind == "crash":
        return open_executor(backend_name(backend), timeout=TIMEOUT, policy=CRASH_POLICY, **options)
    if kind == "oom":
        return open_executor(backend_name(backend), timeout=TIMEOUT, policy=MEMORY_POLICY, **options)
    return open_executor(backend_name(backend), timeout=TIMEOUT, **options)


async def _after(executor: Executor, what: str) -> None:
    """The session must still work after whatever the first run did to it."""
    result = await executor.run("print('after')")
    _expect(result.ok and result.stdout == "after\n", f"the run after {what} did not work", result)


async def one_session(backend: str, index: int, options: dict[str, Any] | None = None) -> None:
    """Open, run, check and close one session; raises `Anomaly` (or anything the sandbox raised).

    `options` go to every executor (e.g. the Docker image)."""
    kind = kind_of(index)
    async with _executor(backend, kind, options or {}) as executor:
        if kind == "plain":
            result = await executor.run(f"x = {index}")
            _expect(result.ok and result.stdout == "", "an assignment failed", result)
            if index % 2:
                result = await executor.run("print(x * 2)")
                _expect(result.ok and result.stdout == f"{index * 2}\n", "state was not kept", result)
        elif kind == "timeout":
            result = await executor.run("while True:\n    pass")
            _expect(result.timed_out and result.state_lost and not result.ok, "no timeout", result)
            _expect(result.error is not None and result.error.type == "Timeout", "not a Timeout", result)
            await _after(executor, "a timeout")
        elif kind == "crash":
            result = await executor.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
            _expect(result.state_lost and not result.ok, "the crash did not lose the state", result)
            _expect(result.error is not None and result.error.type == "WorkerCrashed", "no crash", result)
            await _after(executor, "a crash")
        elif kind == "oom":
            result = await executor.run(f"x = bytearray({400 * 2**20})")
            _expect(result.oom and not result.ok and result.error is not None, "no memory error", result)
            if backend == "host":  # the host runner keeps a reserve: the session survives the error
                kept = result.error is not None and result.error.type == "MemoryError"
                _expect(kept and not result.state_lost, "the session did not survive", result)
            await _after(executor, "the memory limit")
        elif kind == "flood":
            result = await executor.run(f"print('x' * {FLOOD_BYTES})")
            _expect(result.ok and result.truncated, "the flood was not truncated", result)
            _expect(len(result.stdout) < 2 * executor.output_limit, "the flood was kept", result)
        elif kind == "fork":
            result = await executor.run(f"x = {index}")
            _expect(result.ok, "an assignment failed", result)
            async with await executor.fork() as child:
                result = await child.run("x += 1\nprint(x)")
                _expect(result.ok and result.stdout == f"{index + 1}\n", "the fork differs", result)
            result = await executor.run("print(x)")
            _expect(result.ok and result.stdout == f"{index}\n", "the fork changed its parent", result)


# ---------------------------------------------------------------------- what is measured


def _proc_table() -> dict[int, tuple[int, str, int | None]]:
    """Every process: pid -> (parent pid, state letter, owner uid)."""
    table: dict[int, tuple[int, str, int | None]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            uid: int | None = entry.stat().st_uid
        except (OSError, IndexError):
            continue  # it ended while we looked
        table[int(entry.name)] = (int(fields[1]), fields[0].decode(), uid)
    return table


def _descendants(table: dict[int, tuple[int, str, int | None]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _private_uids() -> range | None:
    """The uids the host backend gives its workers from this process (None unless root)."""
    if os.getuid() != 0:
        return None
    from sandboxes.backends.host.process import PRIVATE_USERS

    return PRIVATE_USERS.block()


def _private_user_processes(
    table: dict[int, tuple[int, str, int | None]], mine: set[int], uids: range
) -> int:
    """Processes of our private users that are ours: descendants, or orphans (re-parented to init,
    e.g. a `setsid` child that outlived its worker). Another process never holds our block of uids
    (`host.reap.UidBlocks`)."""
    return sum(1 for pid, (ppid, _, uid) in table.items() if uid in uids and (pid in mine or ppid == 1))


def _temp_dirs(scratch: str | None) -> int:
    """Directories the sessions made: `kodeagent-*` in our temporary directory, and every session
    directory under this process's fork servers' bases (wherever those were made)."""
    count = 0
    bases: set[str] = set()
    if scratch is not None:
        with contextlib.suppress(OSError):
            for entry in os.scandir(scratch):
                if entry.name.startswith("kodeagent-"):
                    count += 1
                    if entry.name.startswith("kodeagent-sessions-"):
                        bases.add(entry.path)
    with contextlib.suppress(ImportError):
        from sandboxes.backends.host import process as hostprocess

        servers = getattr(hostprocess, "_FORK_SERVERS", {})
        bases.update(server.base for server in list(servers.values()))
    for base in bases:
        with contextlib.suppress(OSError):
            count += sum(1 for _ in os.scandir(base))
    return count


def _containers(backend: str) -> int | None:
    if backend != "docker":
        return None
    from sandboxes.backends.docker.container import client
    from sandboxes.images.cleanup import owner_label
    from sandboxes.images.common import LABEL_OWNER

    found = client().containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner_label()}"})
    return len(found)


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(backend: str, scratch: str | None) -> dict[str, Any]:
    """One checkpoint's readings of this process (see the module docs)."""
    table = _proc_table()
    mine = _descendants(table, os.getpid())
    uids = _private_uids()
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "tasks": len(os.listdir("/proc/self/task")),
        "processes": len(mine),
        "zombies": sum(1 for pid in mine if table[pid][1] == "Z"),
        "uid_processes": None if uids is None else _private_user_processes(table, set(mine), uids),
        "rss_mb": round(_rss_mb(), 1),
        "objects": len(gc.get_objects()),
        "temp_dirs": _temp_dirs(scratch),
        "containers": _containers(backend),
    }


def use_private_tempdir() -> str:
    """Make a temporary directory of our own this process's `TMPDIR` (for the sessions' directories),
    removed at exit.

    Traversable by others (0711) as /tmp is, so that a session's private user can reach its
    directory inside it. Not undone before exit: the fork servers keep their bases inside it, and
    the removal is registered before the backends are imported, so that it runs after their own
    exit handlers have stopped them (exit handlers run last-registered first)."""
    scratch = tempfile.mkdtemp(prefix="soak-")
    os.chmod(scratch, 0o711)
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    return scratch


# ---------------------------------------------------------------------- the soak


def verdicts(checkpoints: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per resource: growth from the first checkpoint after warm-up to the last, against what is
    allowed (the start row, before any session, is not the baseline: pools and servers start then)."""
    if len(checkpoints) < 3:
        raise ValueError("a verdict needs the start, a checkpoint after warm-up and the end")
    baseline, end = checkpoints[1], checkpoints[-1]
    out = []
    for key, label in RESOURCES:
        if baseline.get(key) is None or end.get(key) is None:
            continue
        absolute, relative = GROWTH_ALLOWED[key]
        allowed = max(absolute, relative * baseline[key])
        if isinstance(baseline[key], int):
            allowed = int(allowed)  # a count: a fraction of an item is not allowed
        growth = end[key] - baseline[key]
        out.append(
            {
                "resource": key,
                "label": label,
                "baseline": baseline[key],
                "end": end[key],
                "peak": max(c[key] for c in checkpoints[1:]),
                "growth": round(growth, 1),
                "allowed": round(allowed, 1),
                "grew": growth > allowed,
            }
        )
    return out


async def soak(
    backend: str = "host",
    sessions: int | None = None,
    concurrency: int = 2,
    every: int | None = None,
    settle: float | None = None,
    scratch: str | None = None,
    options: dict[str, Any] | None = None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the soak; return the JSON-ready result (checkpoints, verdicts, anomalies, rates).

    `scratch`: the private temporary directory the sessions' directories go to, if one was made
    (`use_private_tempdir`); `options`: for every executor. Raises `BackendUnavailable` (at the
    first session that says so) when the backend cannot work here."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    total = DEFAULT_SESSIONS[backend] if sessions is None else sessions
    if every is None:
        every = min(1000, max(1, total // 10))
    if total < 2 * every or every < 1:
        raise ValueError(f"--sessions ({total}) must be at least twice --every ({every}): warm-up, then soak")
    if concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    pause = DEFAULT_SETTLE[backend] if settle is None else settle
    kinds: Counter[str] = Counter()
    anomalies: list[dict[str, Any]] = []
    anomaly_count = 0
    checkpoints: list[dict[str, Any]] = []
    unavailable: list[BackendUnavailable] = []
    started = time.perf_counter()

    def checkpoint(done: int, interval_s: float, interval_n: int) -> None:
        row = {
            "sessions": done,
            "elapsed_s": round(time.perf_counter() - started, 1),
            "sessions_per_s": round(interval_n / interval_s, 1) if interval_s > 0 and interval_n else None,
            **measure(backend, scratch),
        }
        checkpoints.append(row)
        if on_checkpoint is not None:
            on_checkpoint(row)

    async def worker(indices: Iterator[int]) -> None:
        nonlocal anomaly_count
        for index in indices:
            if unavailable:
                return
            kind = kind_of(index)
            kinds[kind] += 1
            try:
                await one_session(backend, index, options)
            except BackendUnavailable as exc:  # not a finding about sessions: nothing here can run
                unavailable.append(exc)
                return
            except Exception as exc:  # noqa: BLE001 - any failure of a session is an anomaly, counted
                anomaly_count += 1
                if len(anomalies) < 50:
                    anomalies.append(
                        {"session": index, "kind": kind, "problem": f"{type(exc).__name__}: {exc}"}
                    )

    checkpoint(0, 0.0, 0)
    done = 0
    while done < total:
        batch = min(every, total - done)
        indices = iter(range(done, done + batch))
        batch_started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for _ in range(concurrency):
                group.start_soon(worker, indices)
        if unavailable:
            raise unavailable[0]
        batch_s = time.perf_counter() - batch_started
        done += batch
        await anyio.sleep(pause)
        checkpoint(done, batch_s, batch)
    wall = time.perf_counter() - started
    checks = verdicts(checkpoints)
    return {
        "backend": backend,
        "sessions": total,
        "concurrency": concurrency,
        "every": every,
        "settle_s": pause,
        "options": options or {},
        "tempdir": scratch,
        "mix": {str(k): v for k, v in SPECIAL.items()} | {"cycle": CYCLE},
        "kinds": dict(kinds),
        "checkpoints": checkpoints,
        "verdicts": checks,
        "grew": [v["resource"] for v in checks if v["grew"]],
        "anomaly_count": anomaly_count,
        "anomalies": anomalies,
        "wall_s": round(wall, 1),
        "sessions_per_s": round(total / wall, 1),
        "ok": anomaly_count == 0 and not any(v["grew"] for v in checks),
    }


# ---------------------------------------------------------------------- output


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def checkpoint_line(row: dict[str, Any]) -> str:
    """One checkpoint as a line, for the log while the soak runs."""
    parts = [f"{row['sessions']:>6} sessions", f"{row['elapsed_s']:>7.1f} s"]
    if row.get("sessions_per_s") is not None:
        parts.append(f"{row['sessions_per_s']:.1f}/s")
    parts += [f"{key}={row[key]}" for key, _ in RESOURCES if row.get(key) is not None]
    return "  ".join(parts)


def report(console: Console, result: dict[str, Any]) -> None:
    keys = [k for k, _ in RESOURCES if any(c.get(k) is not None for c in result["checkpoints"])]
    labels = dict(RESOURCES)
    rows = [
        [
            str(c["sessions"]),
            f"{c['elapsed_s']:.1f}",
            _cell(c.get("sessions_per_s")),
            *(_cell(c.get(k)) for k in keys),
        ]
        for c in result["checkpoints"]
    ]
    print_table(
        console,
        f"Soak: {result['sessions']} sessions on {result['backend']}, {result['concurrency']} at a time",
        ["sessions", "s", "sessions/s", *(labels[k] for k in keys)],
        rows,
        f"measured after the sessions in flight ended and {result['settle_s']} s passed; "
        f"mix per {CYCLE} sessions: {', '.join(f'1 {v}' for v in SPECIAL.values())}, the rest ordinary "
        f"({', '.join(f'{k} {n}' for k, n in sorted(result['kinds'].items()))})",
    )
    verdict_rows = [
        [
            v["label"],
            _cell(v["baseline"]),
            _cell(v["end"]),
            _cell(v["peak"]),
            f"{v['growth']:+g}",
            f"+{v['allowed']:g}",
            "GREW" if v["grew"] else "ok",
        ]
        for v in result["verdicts"]
    ]
    print_table(
        console,
        f"Growth after warm-up (from {result['every']} sessions to the end)",
        ["resource", "after warm-up", "end", "peak", "growth", "allowed", "verdict"],
        verdict_rows,
        left=(0, 6),
    )
    console.print(
        f"{result['sessions']} sessions in {result['wall_s']:.1f} s: {result['sessions_per_s']:.1f} sessions/s; "
        f"{result['anomaly_count']} anomalies",
        markup=False,
        highlight=False,
    )
    shown = result["anomalies"][:20]
    for anomaly in shown:
        console.print(
            f"  anomaly: session {anomaly['session']} ({anomaly['kind']}): {anomaly['problem']}",
            markup=False,
            highlight=False,
        )
    if result["anomaly_count"] > len(shown):
        console.print(f"  ... and {result['anomaly_count'] - len(shown)} more", markup=False, highlight=False)
    verdict = "nothing grew" if not result["grew"] else "GREW: " + ", ".join(result["grew"])
    console.print(f"verdict: {verdict}", markup=False, highlight=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="host", choices=BACKENDS, help="backend to soak (default host)")
    parser.add_argument(
        "--sessions", type=int, help="sessions to open, run and close (default 10,000 host, 1,000 docker)"
    )
    parser.add_argument("--concurrency", type=int, default=2, help="sessions in flight at once (default 2)")
    parser.add_argument(
        "--every",
        type=int,
        help="sessions between checkpoints (default a tenth of --sessions, at most 1,000)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        help="seconds to wait before each checkpoint's readings (default 0.5 host, 2 docker)",
    )
    parser.add_argument(
        "--image", help="docker: the sandbox image (default the backend's, kodeagent-sandbox:py)"
    )
    add_backend_option(parser, "sessions_per_container=100")
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/soak-<time>.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def execute(args: argparse.Namespace) -> int:
    """Run from parsed arguments; exit 1 when something grew or a result was wrong, 2 for bad
    options, 3 when the backend is unavailable here."""
    console = make_console(args.json)

    def log(row: dict[str, Any]) -> None:
        console.print(f"  {checkpoint_line(row)}", markup=False, highlight=False, style="dim")

    try:
        options: dict[str, Any] = parse_key_values(args.backend_option)
    except ValueError as exc:
        console.print(f"--backend-option: {exc}", markup=False, highlight=False)
        return 2
    if args.image:
        if args.backend != "docker":
            console.print("error: --image is for --backend docker", markup=False, highlight=False)
            return 2
        options["image"] = args.image
    scratch = use_private_tempdir()
    try:
        result = anyio.run(
            lambda: soak(
                args.backend, args.sessions, args.concurrency, args.every, args.settle, scratch, options, log
            )
        )
    except ValueError as exc:
        console.print(f"error: {exc}", markup=False, highlight=False)
        return 2
    except BackendUnavailable as exc:
        console.print(f"{args.backend} is unavailable here: {exc}", markup=False, highlight=False)
        return 3
    publish("soak", result, args, console, report)
    return 0 if result["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.soak", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
