"""The egress gateway's cost: connection set-up and download throughput through it against a direct
loopback connection, and opening a session with the network off against one with it on.

What is measured, each beside its baseline in the same run (alternating batches, so drift on a busy
machine hits both alike):
- connection set-up: connect, then one byte echoed back. Through the gateway (from a network-on
  host session, timed inside the sandbox): connect to the gateway's listener, ``CONNECT``, its
  ``200``, then the byte through the tunnel; direct: the same from this process to the same echo
  server on the host's loopback.
- download: `download_mb` MB read from a loopback server, through the gateway (with the session's
  `bytes_per_second` raised, so the gateway's own cost shows, and at the default limit, which is
  what a session gets) and direct. Throughput in MB/s (1 MB = 10^6 bytes) from the median time.
- session open: a session from the pool and a cold one (no pool), network off and on, alternately:
  network off must not pay for the gateway (it never attaches one).

The sessions allow ``127.0.0.1/32`` explicitly (this machine's loopback is otherwise refused).
"""

from __future__ import annotations

import argparse
import json
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console

from .common import fmt_ms, make_console, print_table, publish, ratio, script_main, summarize

MB = 1_000_000
BATCH = 20
"""Connection set-ups per batch; batches alternate between the gateway and direct."""
RAISED_RATE = 1 << 40
"""`NetworkPolicy.bytes_per_second` for the "raised" download: far above what loopback carries."""

CLIENT = """
import socket, time

def connect(port, via_gateway):
    if not via_gateway:
        return socket.create_connection(("127.0.0.1", port), 10)
    s = socket.create_connection(("127.0.0.1", 3128), 10)
    s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n".encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            raise OSError("the gateway closed the connection: " + head.decode(errors="replace"))
        head += chunk
    if b" 200 " not in head.split(b"\\r\\n")[0] + b" ":
        raise OSError("the gateway refused: " + head.decode(errors="replace")[:300])
    return s

def setups(port, n, via_gateway):
    out = []
    for _ in range(n):
        started = time.perf_counter()
        s = connect(port, via_gateway)
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise OSError("no echo")
        out.append(time.perf_counter() - started)
        s.close()
    return out

def download(port, via_gateway):
    started = time.perf_counter()
    s = connect(port, via_gateway)
    s.sendall(b"GET\\n")
    buffer = bytearray(1 << 20)
    got = 0
    while True:
        k = s.recv_into(buffer)
        if not k:
            break
        got += k
    s.close()
    return got, time.perf_counter() - started
"""
"""The client, the same code in the sandbox (through the gateway) and here (direct)."""


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data = self.request.recv(1)
        if data:
            self.request.sendall(data)


def _sender(size: int) -> type[socketserver.BaseRequestHandler]:
    chunk = b"\0" * (1 << 20)

    class Send(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(16)
            left = size
            while left > 0:
                sent = self.request.send(chunk[: min(left, len(chunk))])
                left -= sent

    return Send


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def _serve(handler: type[socketserver.BaseRequestHandler]) -> tuple[_Server, int]:
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def _direct() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(CLIENT, namespace)  # noqa: S102 - our own client code, the same the sandbox runs
    return namespace


async def _define(executor: Any) -> None:
    result = await executor.run(CLIENT)
    if not result.ok:
        raise RuntimeError(f"the sandbox refused the client: {result.error}")


async def _in_sandbox(executor: Any, call: str) -> Any:
    result = await executor.run(f"import json\nprint(json.dumps({call}))")
    if not result.ok:
        raise RuntimeError(f"the sandbox's client failed: {result.error}")
    return json.loads(result.stdout)


async def measure(
    connections: int, download_mb: float, downloads: int, opens: int, log: Callable[[str], None]
) -> dict[str, list[float]]:
    """Every sample, in seconds, by row name."""
    from sandboxes import HostExecutor, NetworkPolicy, Policy

    size = int(download_mb * MB)
    echo, echo_port = _serve(_Echo)
    sender, sender_port = _serve(_sender(size))
    direct = _direct()
    samples: dict[str, list[float]] = {}

    def policy(rate: int | None = None) -> Policy:
        limits = {} if rate is None else {"bytes_per_second": rate}
        rules = NetworkPolicy(allow=["127.0.0.1/32"], **limits)
        return Policy(network=rules, allowed_imports=["socket", "time", "json"])

    try:
        async with HostExecutor(policy=policy(RAISED_RATE), timeout=300) as raised:
            await _define(raised)
            log(f"connection set-up x{connections}, through the gateway and direct, in batches of {BATCH}")
            await _in_sandbox(raised, f"setups({echo_port}, 3, True)")  # warm-up
            direct["setups"](echo_port, 3, False)
            for done in range(0, connections, BATCH):
                n = min(BATCH, connections - done)
                samples.setdefault("set-up via gateway", []).extend(
                    await _in_sandbox(raised, f"setups({echo_port}, {n}, True)")
                )
                samples.setdefault("set-up direct", []).extend(direct["setups"](echo_port, n, False))
            async with HostExecutor(policy=policy(), timeout=300) as limited:
                await _define(limited)
                log(
                    f"{download_mb:g} MB download x{downloads}: gateway (raised limit, default limit), direct"
                )
                for _ in range(downloads):
                    for name, target in (("raised", raised), ("default", limited)):
                        got, seconds = await _in_sandbox(target, f"download({sender_port}, True)")
                        if got != size:
                            raise RuntimeError(f"the download through the gateway got {got} of {size} bytes")
                        samples.setdefault(f"download via gateway ({name} limit)", []).append(seconds)
                    got, seconds = direct["download"](sender_port, False)
                    if got != size:
                        raise RuntimeError(f"the direct download got {got} of {size} bytes")
                    samples.setdefault("download direct", []).append(seconds)
    finally:
        echo.shutdown()
        sender.shutdown()
        echo.server_close()
        sender.server_close()
    log(f"session open x{opens}: from the pool and cold, network off and on, alternately")
    samples.update(await _opens(opens))
    return samples


async def _open_once(pool: bool, network: bool) -> float:
    from sandboxes import HostExecutor, Policy

    executor = HostExecutor(timeout=10, pool=pool, policy=Policy(network=network))
    started = time.perf_counter()
    await executor.open()
    elapsed = time.perf_counter() - started
    await executor.close()
    return elapsed


async def _opens(n: int) -> dict[str, list[float]]:
    import anyio

    from sandboxes.backends.host import executor as host

    samples: dict[str, list[float]] = {}
    for index in range(n + 1):
        for pool in (True, False):
            for network in (False, True):
                while host.refilling():  # a pooled open is a pool hit, not a wait for the refill
                    await anyio.sleep(0.005)
                await anyio.sleep(0.05)
                seconds = await _open_once(pool, network)
                if index:  # the first of each starts its pool or fork server
                    name = f"open {'from the pool' if pool else 'cold'}, network {'on' if network else 'off'}"
                    samples.setdefault(name, []).append(seconds)
    return samples


PAIRS = (
    ("set-up via gateway", "set-up direct"),
    ("download via gateway (raised limit)", "download direct"),
    ("download via gateway (default limit)", "download direct"),
    ("open from the pool, network on", "open from the pool, network off"),
    ("open cold, network on", "open cold, network off"),
)
"""Each measured row and the baseline it is compared with."""


def run(
    *,
    connections: int = 500,
    download_mb: float = 100,
    downloads: int = 5,
    opens: int = 20,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure; return the JSON-ready result (rows with p50/p95, each beside its baseline)."""
    import anyio

    console = console or make_console()

    def log(message: str) -> None:
        console.print(f"  measuring {message}", markup=False, highlight=False, style="dim")

    from sandboxes.egress.service import unavailable

    problem = unavailable()
    if problem is not None:
        return {"rows": [], "unavailable": {"egress": problem}}
    samples = anyio.run(measure, connections, download_mb, downloads, opens, log)
    size = int(download_mb * MB)
    rows: dict[str, dict[str, Any]] = {}
    for name, values in samples.items():
        entry: dict[str, Any] = {"benchmark": "egress", "name": name, **summarize(values)}
        if name.startswith("download"):
            entry["mb_per_s_p50"] = size / MB / (entry["p50_ms"] / 1000)
        rows[name] = entry
    for name, baseline in PAIRS:
        if name in rows and baseline in rows:
            rows[name]["baseline"] = baseline
            rows[name]["over_baseline_p50"] = ratio(rows[name]["p50_ms"], rows[baseline]["p50_ms"])
            rows[name]["over_baseline_p95"] = ratio(rows[name]["p95_ms"], rows[baseline]["p95_ms"])
    return {"download_bytes": size, "rows": list(rows.values()), "unavailable": {}}


def report(console: Console, result: dict[str, Any]) -> None:
    lines = []
    for entry in result["rows"]:
        comparison = ""
        if "baseline" in entry:
            comparison = (
                f"{entry['over_baseline_p50']:.2f}x the time of {entry['baseline']} "
                f"(p95 {entry['over_baseline_p95']:.2f}x)"
            )
        speed = f"{entry['mb_per_s_p50']:,.0f} MB/s" if "mb_per_s_p50" in entry else ""
        lines.append(
            [
                entry["name"],
                str(entry["n"]),
                fmt_ms(entry["p50_ms"]),
                fmt_ms(entry["p95_ms"]),
                speed,
                comparison,
            ]
        )
    for what, reason in result["unavailable"].items():
        lines.append([f"{what}: unavailable", "", "", "", "", reason[:200]])
    print_table(
        console,
        "Egress gateway",
        ["measurement", "n", "p50", "p95", "throughput", "comparison"],
        lines,
        "comparison: p50 (and p95) time over the baseline's, measured alternately in the same run; "
        f"downloads of {result.get('download_bytes', 0) / MB:g} MB from a server on this machine's loopback",
        left=(0, 5),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connections", type=int, default=500, help="connection set-ups of each (default 500)"
    )
    parser.add_argument("--download-mb", type=float, default=100, help="size of each download (default 100)")
    parser.add_argument("--downloads", type=int, default=5, help="downloads of each kind (default 5)")
    parser.add_argument("--opens", type=int, default=20, help="session opens of each kind (default 20)")
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/egress-<time>.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def execute(args: argparse.Namespace) -> int:
    """Run from parsed arguments; exit 0 when the measurements were taken, 2 when they cannot be here."""
    console = make_console(args.json)
    result = run(
        connections=args.connections,
        download_mb=args.download_mb,
        downloads=args.downloads,
        opens=args.opens,
        console=console,
    )
    publish("egress", result, args, console, report)
    return 2 if result["unavailable"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.egress", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
