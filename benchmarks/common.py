"""What every benchmark shares: statistics, result files, and output that suits where it goes.

Why these helpers exist:
- Speed is reported as medians and p95 (means hide the tail that agents feel), computed one way for
  every benchmark so that numbers in different tables mean the same thing.
- Every run writes a JSON result file (under `results/`, git-ignored, unless a path is given) with the
  machine it ran on, so a number can always be traced back to its run.
- On a terminal we draw rich tables and progress bars; piped into a file or CI log we print plain,
  aligned text without escape codes or box characters. With `--json` the JSON goes to stdout alone
  and everything meant for humans goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

RESULTS_DIR = Path("results")


# ---------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(seconds: Sequence[float]) -> dict[str, float | int]:
    """n, p50, p95, mean, min and max of durations given in seconds, reported in milliseconds."""
    if not seconds:
        return {
            "n": 0,
            "p50_ms": math.nan,
            "p95_ms": math.nan,
            "mean_ms": math.nan,
            "min_ms": math.nan,
            "max_ms": math.nan,
        }
    return {
        "n": len(seconds),
        "p50_ms": percentile(seconds, 50) * 1000,
        "p95_ms": percentile(seconds, 95) * 1000,
        "mean_ms": sum(seconds) / len(seconds) * 1000,
        "min_ms": min(seconds) * 1000,
        "max_ms": max(seconds) * 1000,
    }


def median_round(keys: Sequence[float]) -> int:
    """The index of the round a multi-round result shows, from each round's key (a speed-up, a wall
    time, a floor's rate): the median's, the lower middle of an even count, so always a round that
    happened."""
    return list(keys).index(statistics.median_low(keys))


def ratio(slow: float, fast: float) -> float:
    """How many times `fast` is faster than `slow` (nan when undefined)."""
    if not (fast > 0) or math.isnan(slow):
        return math.nan
    return slow / fast


def fmt_ms(value: float) -> str:
    """Milliseconds with a precision that suits their size."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if value < 10:
        return f"{value:.2f} ms"
    if value < 1000:
        return f"{value:.1f} ms"
    return f"{value / 1000:.2f} s"


def fmt_ratio(value: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.1f}x"


# ---------------------------------------------------------------------- result files


def machine_info() -> dict[str, Any]:
    """Where a result was measured: enough to tell two machines apart, nothing secret."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def write_result(name: str, data: dict[str, Any], path: str | Path | None = None) -> Path:
    """Write `data` (plus timestamp and machine) as JSON; default `results/<name>-<UTC time>.json`."""
    now = _dt.datetime.now(_dt.UTC)
    if path is None:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{name}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "created": now.isoformat(timespec="seconds"),
        "machine": machine_info(),
        **data,
    }
    path.write_text(json.dumps(document, indent=2, default=_json_default, allow_nan=True) + "\n")
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def to_json(data: Any) -> str:
    """JSON for stdout: NaN becomes null so that strict parsers accept it."""
    return json.dumps(_nan_to_none(data), indent=2, default=_json_default)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_to_none(v) for v in value]
    return value


# ---------------------------------------------------------------------- options


def add_backend_option(parser: argparse.ArgumentParser, example: str) -> None:
    """The repeatable ``-o KEY=VALUE`` flag of a benchmark that opens sessions (read it with
    `parse_key_values`); `example` shows one in the help."""
    parser.add_argument(
        "-o",
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"option of the backend, e.g. {example} (JSON values; repeatable)",
    )


def parse_key_values(values: Sequence[str]) -> dict[str, Any]:
    """`["isolation=process", "pool_size=4"]` -> {"isolation": "process", "pool_size": 4}.

    Values are parsed as JSON when they are valid JSON (numbers, booleans, lists), else kept as text.
    Raises ValueError for an item that is not KEY=VALUE.
    """
    options: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"{item!r} is not KEY=VALUE")
        try:
            options[key.strip()] = json.loads(raw)
        except ValueError:
            options[key.strip()] = raw
    return options


# ---------------------------------------------------------------------- output


def make_console(json_mode: bool = False) -> Console:
    """The console for human output: stderr when stdout carries JSON, stdout otherwise."""
    return Console(stderr=json_mode, highlight=False, soft_wrap=True)


def print_table(
    console: Console,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    note: str | None = None,
    left: Sequence[int] = (0,),
) -> None:
    """A rich table on a terminal; plain aligned columns otherwise (logs, pipes, CI).

    Columns whose index is in `left` are left-aligned (text); the others right-aligned (numbers).
    """
    cells = [[str(c) for c in row] for row in rows]
    if console.is_terminal:
        from rich.table import Table

        table = Table(title=title, title_justify="left", caption=note, caption_justify="left")
        for index, column in enumerate(columns):
            table.add_column(column, justify="left" if index in left else "right")
        for row in cells:
            table.add_row(*row)
        console.print(table)
        return
    widths = [max([len(columns[i]), *(len(r[i]) for r in cells)]) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i in left else v.rjust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )

    out = [
        title,
        line(columns).rstrip(),
        "  ".join("-" * w for w in widths),
        *(line(r).rstrip() for r in cells),
    ]
    if note:
        out.append(note)
    console.print("\n".join(out), markup=False, highlight=False)


@contextlib.contextmanager
def progress(console: Console, description: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n=1)`. A rich progress bar on a terminal; on a pipe, a line at start and end."""
    if console.is_terminal:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        ) as bar:
            task = bar.add_task(description, total=total)

            def advance_bar(n: int = 1) -> None:
                bar.advance(task, n)

            yield advance_bar
        return
    started = time.perf_counter()
    done = 0

    def advance(n: int = 1) -> None:
        nonlocal done
        done += n

    console.print(f"{description}: {total} ...", markup=False, highlight=False)
    yield advance
    console.print(
        f"{description}: {done}/{total} done in {time.perf_counter() - started:.2f} s",
        markup=False,
        highlight=False,
    )


def publish(
    name: str,
    result: dict[str, Any],
    args: Any,
    console: Console,
    report: Callable[[Console, dict[str, Any]], None],
) -> None:
    """Write the result file, then print either the JSON (``--json``) or the report and the file's path."""
    path = write_result(name, result, args.output)
    result["result_file"] = str(path)
    if args.json:
        print(to_json(result))
    else:
        report(console, result)
        console.print(f"result: {path}", markup=False, highlight=False)


def script_main(
    module_doc: str | None,
    prog: str,
    add_arguments: Callable[[Any], None],
    execute: Callable[[Any], int],
    argv: Sequence[str] | None,
) -> int:
    """The `python -m benchmarks.X` entry point: the same arguments as `kodeagent bench X`."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=(module_doc or "").split("\n")[0])
    add_arguments(parser)
    return execute(parser.parse_args(argv))


async def time_async(action: Callable[[], Any], n: int) -> list[float]:
    """Seconds each of `n` sequential awaits of `action()` took."""
    durations = []
    for _ in range(n):
        started = time.perf_counter()
        await action()
        durations.append(time.perf_counter() - started)
    return durations
