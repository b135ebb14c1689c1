"""How fast a watched run's output reaches the caller: rows for `bench latency`, on any backend.

- first chunk, write to arrival: the code stamps `time.monotonic()` and prints the stamp, a line every
  20 ms (so each line is a chunk of its own); the parent notes when each chunk arrives. The sandbox
  and the parent read the same monotonic clock on every backend measured here (one machine: host,
  Docker, the E2B stand-in, a local Ray cluster). Target: p50 within 50 ms.
- 10 MB flood: 10,000 writes of 1,000 characters with a budget that drops nothing: the run's wall
  time (p50/p95 over a few runs), the chunks and megabytes a second that reached the caller.

Nothing is asserted; rows say whether the target was met.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from sandboxes import Executor, OutputEvent, Policy, ResultEvent

from .common import summarize

FIRST_CHUNK_TARGET_MS = 50.0
LINES_PER_RUN = 25
FLOOD_CHARS = 10_000_000
FLOOD = "import sys\nfor _ in range(10_000):\n    sys.stdout.write('x' * 1_000)\n"
FLOOD_BUDGET: dict[str, int] = {"chars": 2 * FLOOD_CHARS, "chars_per_second": 10**9, "buffer": 1_000_000}
POLICY = Policy(allowed_imports=["time", "sys"])


async def first_chunk_latencies(executor: Executor, n: int) -> list[float]:
    """Seconds from a write in the sandbox to its chunk's arrival here, `n` samples."""
    code = (
        "import time\n"
        f"for _ in range({LINES_PER_RUN}):\n"
        "    time.sleep(0.02)\n"
        "    print(repr(time.monotonic()))\n"
    )
    samples: list[float] = []
    while len(samples) < n:
        async with executor.stream(code) as events:
            async for event in events:
                if isinstance(event, OutputEvent):
                    arrived = time.monotonic()
                    for line in event.text.splitlines():
                        samples.append(arrived - float(line))
                elif isinstance(event, ResultEvent) and not event.result.ok:
                    raise RuntimeError(f"the stamping run failed: {event.result.error}")
    return samples[:n]


async def flood(executor: Executor, runs: int) -> dict[str, Any]:
    """Stream a 10 MB flood `runs` times: wall times, and chunk and byte rates of what arrived."""
    durations: list[float] = []
    chunk_rates: list[float] = []
    byte_rates: list[float] = []
    fractions: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        chunks = chars = 0
        async with executor.stream(FLOOD, **FLOOD_BUDGET) as events:
            async for event in events:
                if isinstance(event, OutputEvent) and event.text:
                    chunks += 1
                    chars += len(event.text)
        elapsed = time.perf_counter() - started
        durations.append(elapsed)
        chunk_rates.append(chunks / elapsed)
        byte_rates.append(chars / elapsed / 1e6)
        fractions.append(chars / FLOOD_CHARS)
    return {
        "durations": durations,
        "chunks_per_s": statistics.median(chunk_rates),
        "mb_per_s": statistics.median(byte_rates),
        "streamed_fraction": statistics.median(fractions),
    }


async def measure(
    make_executor: Callable[..., Executor], n: int = 200, flood_runs: int = 5
) -> dict[str, Any]:
    """Both measurements in one session of `make_executor(policy=..., timeout=...)`."""
    async with make_executor(policy=POLICY, timeout=60) as executor:
        await first_chunk_latencies(executor, 10)  # warm-up
        latencies = await first_chunk_latencies(executor, n)
        flooded = await flood(executor, flood_runs)
    return {"first": latencies, "flood": flooded}


def stream_rows(benchmark: str, measured: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of `bench latency` for one backend's `measure()`."""
    first = summarize(measured["first"])
    flooded = measured["flood"]
    return [
        {
            "benchmark": benchmark,
            "name": "stream: first chunk, write to arrival",
            **first,
            "target_p50_ms": FIRST_CHUNK_TARGET_MS,
            "meets_target": first["p50_ms"] <= FIRST_CHUNK_TARGET_MS,
        },
        {
            "benchmark": benchmark,
            "name": (
                f"stream: 10 MB flood ({flooded['chunks_per_s']:,.0f} chunks/s, "
                f"{flooded['mb_per_s']:.0f} MB/s, {flooded['streamed_fraction']:.0%} streamed)"
            ),
            **summarize(flooded["durations"]),
            "chunks_per_s": flooded["chunks_per_s"],
            "mb_per_s": flooded["mb_per_s"],
            "streamed_fraction": flooded["streamed_fraction"],
        },
    ]
