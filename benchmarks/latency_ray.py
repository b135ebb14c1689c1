"""The ray backend against the node's own backend run locally, measured in the same run on a local cluster.

    python -m benchmarks.latency_ray [--n 300] [--sessions 30] [--programs 96] [--json]

Starts a local Ray cluster (`ray.cluster_utils.Cluster`: a head node that takes no sandboxes and sandbox
nodes taking `--per-node` each, on this machine), and measures (medians and p95, milliseconds):

- warm run: `run("print(1)")` in an open session, ray (node_backend host) against a host session in
  this process, samples interleaved one by one so both see the same machine load. The difference of
  the medians is the per-run overhead of crossing the cluster (goal: p50 at most 2 ms more).
- run with a tool call: `print(f(1))`, the tool running in this process on both backends; on ray the
  call crosses the cluster twice more (the call event out, the answer in).
- session open from a warm node: `open()` of a new ray session once the node's agent runs and its
  pool is full: a new reservation (placement group, node lookup) or the one the last close left
  (`LINGER`), then one call to the agent, whose node-local session takes a worker from the node's
  pool. Baseline: a host session from the pool in this process.
- first session on a new node: `open()` on a node that just joined (the agent's worker process starts
  and imports `sandboxes`): the one-time cost per node and driver code version.
- throughput: P programs, each in a fresh session (open, run, close), as many at once as the cluster
  takes, with 1 sandbox node and then 2; baseline the host backend here at concurrency = CPUs. Two
  workloads: `cpu` (about 20 ms of arithmetic) and `wait` (a 50 ms sleep: I/O-like). Every node of a
  local cluster shares this machine's cores, so the cpu workload cannot go faster with more nodes
  here (CPU-bound: the table says so); the wait workload shows the capacity scaling across nodes.

Nothing is asserted; the target is reported as met or not.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio
from rich.console import Console

from .common import fmt_ms, fmt_ratio, make_console, print_table, publish, script_main, summarize

OVERHEAD_TARGET_MS = 2.0
WORKLOADS = {
    "cpu": "total = 0\nfor i in range(300_000):\n    total += i * i\nprint(total % 7)",
    "wait": "import time\ntime.sleep(0.05)\nprint(1)",
}
OBJECT_STORE_BYTES = 80 * 1024 * 1024


# ---------------------------------------------------------------------- a local cluster


class LocalCluster:
    """A local multi-node Ray cluster for the benchmark, removed with everything it started at the end."""

    def __init__(self, per_node: int) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.per_node = per_node
        head = {
            "num_cpus": 1,
            "resources": {"kodeagent_sandbox": 0},
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False,
        }
        self.cluster = Cluster(initialize_head=True, head_node_args=head, shutdown_at_exit=False)
        ray.init(address=self.cluster.address, logging_level=logging.WARNING, log_to_driver=False)

    def add_node(self) -> str:
        node = self.cluster.add_node(
            num_cpus=1, resources={"kodeagent_sandbox": self.per_node}, object_store_memory=OBJECT_STORE_BYTES
        )
        self.cluster.wait_for_nodes()
        return str(node.node_id)

    def shutdown(self) -> None:
        import ray

        from sandboxes.backends.ray.cluster import descendants, kill_leftovers, node_processes

        leftover = descendants(node_processes([self.cluster.head_node, *self.cluster.worker_nodes]))
        ray.shutdown()
        self.cluster.shutdown()
        kill_leftovers(leftover)  # Ray's per-node agents can outlive their raylet


# ---------------------------------------------------------------------- measurements


async def warm_runs(n: int, code: str, tools: dict[str, Any] | None = None) -> dict[str, list[float]]:
    """`code` run n times in a ray session and in a local host session, interleaved sample by sample."""
    from sandboxes import HostExecutor
    from sandboxes.backends.ray import RayExecutor

    samples: dict[str, list[float]] = {"ray": [], "host": []}
    async with (
        RayExecutor(node_backend="host", timeout=30, tools=tools) as remote,
        HostExecutor(timeout=30, tools=tools) as local,
    ):
        for _ in range(20):  # warm-up: imports, caches, first calls
            await remote.run(code)
            await local.run(code)
        for _ in range(n):
            for name, executor in (("ray", remote), ("host", local)):
                started = time.perf_counter()
                result = await executor.run(code)
                samples[name].append(time.perf_counter() - started)
                if not result.ok:
                    raise RuntimeError(f"{name} run failed: {result.error}")
    return samples


async def session_opens(sessions: int, linger: float, settle: float = 0.15) -> dict[str, list[float]]:
    """open() of ray sessions on warm nodes and of host sessions from the local pool, alternating; each
    sample after a pause, so the pools have refilled (steady use, not a burst). With `linger` 0 every
    ray session reserves anew (a placement group); otherwise it reuses the one the last close left."""
    from sandboxes import HostExecutor
    from sandboxes.backends.ray import RayExecutor
    from sandboxes.backends.ray import cluster as ray_backend

    ray_backend.LINGER = linger
    samples: dict[str, list[float]] = {"ray": [], "host": []}
    for _ in range(sessions + 3):
        for name, make in (
            ("ray", lambda: RayExecutor(node_backend="host", timeout=30)),
            ("host", lambda: HostExecutor(timeout=30)),
        ):
            await anyio.sleep(settle)
            executor = make()
            started = time.perf_counter()
            await executor.open()
            samples[name].append(time.perf_counter() - started)
            await executor.close()
    return {name: values[3:] for name, values in samples.items()}  # the first ones warm the pools


async def first_session_on(node_id: str) -> float:
    """open() of the first session placed on a node that just joined (its agent starts there).

    Sessions are opened and kept open until Ray places one on the new node; that one is timed."""
    from sandboxes.backends.ray import RayExecutor, capacity

    opened: list[RayExecutor] = []
    try:
        for _ in range(capacity()):
            session = RayExecutor(node_backend="host", timeout=30)
            started = time.perf_counter()
            await session.open()
            seconds = time.perf_counter() - started
            opened.append(session)
            if session.node_id == node_id:
                return seconds
    finally:
        for session in opened:
            await session.close()
    raise RuntimeError("no session landed on the new node")


async def throughput(backend: str, code: str, programs: int, concurrency: int) -> tuple[float, float]:
    """Seconds for `programs` fresh sessions (open, run, close), `concurrency` at a time, and the CPU
    seconds this process (the driver: its event loop and Ray's threads) spent meanwhile."""
    from sandboxes import open_executor
    from sandboxes.backends import backend_name

    options: dict[str, Any] = {"node_backend": "host"} if backend == "ray" else {}
    limiter = anyio.CapacityLimiter(concurrency)
    failures: list[str] = []

    async def one() -> None:
        async with limiter:
            async with open_executor(backend_name(backend), timeout=30, **options) as executor:
                result = await executor.run(code)
                if not result.ok:
                    failures.append(str(result.error))

    started, cpu = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as group:
        for _ in range(programs):
            group.start_soon(one)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if failures:
        raise RuntimeError(f"{len(failures)} programs failed, e.g. {failures[0]}")
    return seconds, cpu


# ---------------------------------------------------------------------- the benchmark


def run(
    *,
    n: int = 300,
    sessions: int = 30,
    programs: int = 96,
    per_node: int | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Start a local cluster, measure, shut it down; return the JSON-ready result."""
    from sandboxes.backends.ray import capacity

    console = console or make_console()
    cpus = os.cpu_count() or 1
    per_node = per_node or cpus

    def log(message: str) -> None:
        console.print(f"  {message}", markup=False, highlight=False, style="dim")

    log(f"starting a local Ray cluster: a head node and a sandbox node of {per_node}")
    started = time.perf_counter()
    cluster = LocalCluster(per_node)
    try:
        cluster.add_node()
        result: dict[str, Any] = {
            "cpus": cpus,
            "per_node": per_node,
            "cluster_start_s": time.perf_counter() - started,
            "rows": [],
            "throughput": [],
        }

        def pair(name: str, samples: dict[str, list[float]], baseline: str, target: bool = False) -> None:
            ray_stats, host_stats = summarize(samples["ray"]), summarize(samples["host"])
            overhead = ray_stats["p50_ms"] - host_stats["p50_ms"]
            entry = {
                "name": f"ray: {name}",
                **ray_stats,
                "overhead_p50_ms": overhead,
                "overhead_p95_ms": ray_stats["p95_ms"] - host_stats["p95_ms"],
                "baseline": baseline,
            }
            if target:
                entry["target"] = f"p50 <= host + {OVERHEAD_TARGET_MS:g} ms"
                entry["meets_target"] = overhead <= OVERHEAD_TARGET_MS
            result["rows"] += [entry, {"name": f"host: {baseline}", **host_stats}]

        log(f"warm runs ({n} each, interleaved)")
        pair("warm run", anyio.run(warm_runs, n, "print(1)"), "warm run", target=True)
        log(f"runs with a tool call ({max(n // 3, 10)} each)")
        tools = {"f": lambda x: x + 1}
        pair(
            "run with a tool call",
            anyio.run(warm_runs, max(n // 3, 10), "print(f(1))", tools),
            "run with a tool call",
        )
        from sandboxes.backends.ray import cluster as ray_backend

        linger = ray_backend.LINGER
        log(f"session opens ({sessions} each), a new reservation each")
        pair(
            "session open, warm node, new reservation",
            anyio.run(session_opens, sessions, 0.0),
            "session from the pool",
        )
        log(f"session opens ({sessions} each), reusing the last reservation")
        pair(
            "session open, warm node, reservation reused",
            anyio.run(session_opens, sessions, linger),
            "session from the pool",
        )

        for workload, code in WORKLOADS.items():
            log(f"throughput, {workload}: {programs} programs on the host backend, concurrency {cpus}")
            seconds, cpu = anyio.run(throughput, "host", code, programs, cpus)
            result["throughput"].append(
                {
                    "workload": workload,
                    "setup": "host backend, this process",
                    "capacity": cpus,
                    "programs": programs,
                    "seconds": seconds,
                    "driver_cpu_s": cpu,
                }
            )
        for nodes in (1, 2):
            if nodes == 2:
                log("adding a second sandbox node")
                node_id = cluster.add_node()
                first = anyio.run(first_session_on, node_id)
                result["rows"].append({"name": "ray: first session on a new node", **summarize([first])})
            total = capacity()
            for workload, code in WORKLOADS.items():
                log(f"throughput, {workload}: {programs} programs on {nodes} node(s), concurrency {total}")
                seconds, cpu = anyio.run(throughput, "ray", code, programs, total)
                result["throughput"].append(
                    {
                        "workload": workload,
                        "setup": f"ray, {nodes} sandbox node(s)",
                        "capacity": total,
                        "programs": programs,
                        "seconds": seconds,
                        "driver_cpu_s": cpu,
                    }
                )
        for entry in result["throughput"]:
            entry["programs_per_s"] = entry["programs"] / entry["seconds"]
            base = next(
                t
                for t in result["throughput"]
                if t["workload"] == entry["workload"] and t["setup"].startswith("host")
            )
            entry["vs_host"] = entry["programs_per_s"] / base["programs_per_s"]
    finally:
        cluster.shutdown()
    return result


def ray_latency_rows(n: int) -> list[dict[str, Any]]:
    """The latency rows of `kodeagent bench latency --backend ray`: warm run and session open on a local
    cluster of one sandbox node, each beside the host backend measured in the same run."""
    from sandboxes.backends.ray import cluster as raycluster

    cluster = LocalCluster(os.cpu_count() or 1)
    rows: list[dict[str, Any]] = []
    try:
        cluster.add_node()
        warm = anyio.run(warm_runs, n, "print(1)")
        host_p50 = summarize(warm["host"])["p50_ms"]
        rows.append(
            {
                "name": "warm run (node backend host)",
                **summarize(warm["ray"]),
                "baseline": "host warm run",
                "target_p50_ms": round(host_p50 + OVERHEAD_TARGET_MS, 2),
                "meets_target": summarize(warm["ray"])["p50_ms"] <= host_p50 + OVERHEAD_TARGET_MS,
            }
        )
        rows.append({"name": "host warm run", **summarize(warm["host"])})
        opens = anyio.run(session_opens, max(n // 10, 10), raycluster.LINGER)
        rows.append(
            {
                "name": "session open, warm node",
                **summarize(opens["ray"]),
                "baseline": "host session from the pool",
            }
        )
        rows.append({"name": "host session from the pool", **summarize(opens["host"])})
        from sandboxes.backends.ray import RayExecutor

        from .streaming import measure, stream_rows

        def make(**options: Any) -> RayExecutor:
            return RayExecutor(node_backend="host", **options)

        rows.extend(stream_rows("ray latency", anyio.run(measure, make, n)))
    finally:
        cluster.shutdown()
    return rows


def report(console: Console, result: dict[str, Any]) -> None:
    rows = []
    for entry in result["rows"]:
        comparison = ""
        if "overhead_p50_ms" in entry:
            comparison = (
                f"+{fmt_ms(entry['overhead_p50_ms'])} p50, +{fmt_ms(entry['overhead_p95_ms'])} p95 vs host"
            )
        target = ""
        if "target" in entry:
            target = f"{entry['target']}: {'met' if entry['meets_target'] else 'NOT met'}"
        rows.append(
            [
                entry["name"],
                str(entry["n"]),
                fmt_ms(entry["p50_ms"]),
                fmt_ms(entry["p95_ms"]),
                comparison,
                target,
            ]
        )
    note = (
        f"local cluster on {result['cpus']} cores: a head node (no sandboxes) and sandbox nodes of "
        f"{result['per_node']}, started in {result['cluster_start_s']:.1f} s; host rows: the same "
        "measurement on the host backend in this process, interleaved"
    )
    print_table(
        console,
        "Ray backend latency",
        ["measurement", "n", "p50", "p95", "comparison", "target"],
        rows,
        note,
        left=(0, 4, 5),
    )
    rows = [
        [
            t["workload"],
            t["setup"],
            str(t["capacity"]),
            str(t["programs"]),
            f"{t['seconds']:.2f} s",
            f"{t['programs_per_s']:.1f}/s",
            fmt_ratio(t["vs_host"]),
            fmt_ms(1000 * t["driver_cpu_s"] / t["programs"]),
        ]
        for t in result["throughput"]
    ]
    note = (
        "each program in a fresh session (open, run, close), as many at once as the capacity; every node "
        f"of this local cluster shares the same {result['cpus']} cores, so the cpu workload is CPU-bound "
        "here and more nodes cannot speed it up; the wait workload shows the capacity scaling; driver CPU: "
        "what this process spent per program (with the host backend it includes the sandboxes' own "
        "start-up and kill, which ray moves to the nodes)"
    )
    print_table(
        console,
        "Ray backend throughput",
        ["workload", "setup", "capacity", "programs", "wall", "throughput", "vs host", "driver CPU/program"],
        rows,
        note,
        left=(0, 1),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=300, help="warm runs measured per backend (default 300)")
    parser.add_argument("--sessions", type=int, default=30, help="session opens measured (default 30)")
    parser.add_argument("--programs", type=int, default=96, help="programs per throughput run (default 96)")
    parser.add_argument(
        "--per-node", type=int, default=None, help="sandboxes each node takes (default: CPUs)"
    )
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/latency_ray-<time>.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def execute(args: argparse.Namespace) -> int:
    console = make_console(args.json)
    result = run(
        n=args.n, sessions=args.sessions, programs=args.programs, per_node=args.per_node, console=console
    )
    publish("latency_ray", result, args, console, report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.latency_ray", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
