"""MkDocs hook: the benchmark pages are generated from the committed result files.

`benchmarks/results/*.json` are `kodeagent bench` results (the JSON it writes, plus a `command` and
`notes`, and the machine described), or figures transcribed from an earlier run whose JSON was not
kept (a `table` of the text it printed and its `targets`). On a page,

- `<!-- bench-results: NAME -->` becomes every result of benchmark NAME, newest first: its date, the
  machine, the command, the notes, the table (the bench's own `report()` of the JSON, so the page
  reads as the terminal did) and each target, met or not;
- `<!-- bench-targets -->` becomes one table of every target of every result.

The figures on the site then cannot drift from the files: no number is typed into a page.
"""

from __future__ import annotations

import importlib
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_MARKER = re.compile(r"<!-- bench-results: *([a-z_]+) *-->")
TARGETS_MARKER = "<!-- bench-targets -->"
# The module whose report() renders a benchmark's JSON, where it is not `benchmarks.<benchmark>`.
REPORTERS = {"ray": "latency_ray"}
# Names for targets whose JSON key says too little.
LABELS = {"rest_speedup": "the harness's slot-seconds over ours, on the programs neither side timed out"}


@dataclass(frozen=True)
class Target:
    name: str
    met: bool
    measured: str = ""


@dataclass(frozen=True)
class Result:
    path: Path
    data: dict[str, Any]

    @property
    def benchmark(self) -> str:
        return str(self.data["benchmark"])

    @property
    def created(self) -> str:
        return str(self.data["created"])

    def targets(self) -> list[Target]:
        if "targets" in self.data:
            return [
                Target(t["name"], bool(t["met"]), str(t.get("measured", ""))) for t in self.data["targets"]
            ]
        return list(_walk_targets(self.data))


def load_results(directory: Path = RESULTS) -> list[Result]:
    """Every committed result, newest first; a file without a benchmark, a date or a machine fails."""
    results = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        missing = [key for key in ("benchmark", "created", "machine") if key not in data]
        if missing:
            raise ValueError(f"{path.name}: a result file needs {missing}")
        results.append(Result(path, data))
    return sorted(results, key=lambda r: r.created, reverse=True)


def _walk_targets(node: Any, label: str = "") -> Any:
    """Targets inside a bench JSON: any object that says whether it met its target."""
    if isinstance(node, dict):
        met = node.get("meets_target", node.get("target_met"))
        if isinstance(met, bool):
            yield Target(_target_name(node, label), met, _measured(node))
        for key, value in node.items():
            yield from _walk_targets(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from _walk_targets(item, label)


def _target_name(node: dict[str, Any], label: str) -> str:
    if "warm_over_smolagents_p50" in node:
        return f"{node.get('backend', 'host')}: warm run p50 <= smolagents' LocalPythonExecutor p50"
    name = str(node.get("name") or LABELS.get(label, label))
    if node.get("backend"):
        name = f"{node['backend']}: {name}"
    bounds = []
    if isinstance(node.get("target_p50_ms"), int | float):
        bounds.append(f"p50 <= {node['target_p50_ms']:g} ms")
    for key in ("target_speedup", "target"):
        if isinstance(node.get(key), int | float):
            bounds.append(f">= {node[key]:g}x")
    return f"{name}: {', '.join(bounds)}" if bounds else name


def _measured(node: dict[str, Any]) -> str:
    if "warm_over_smolagents_p50" in node:
        return f"{node['warm_over_smolagents_p50']:.2f}x smolagents' p50"
    if "ratio" in node:
        return f"{node['ratio']:.2f}x"
    if "speedup_p50" in node and "target_speedup" in node:
        return f"{node['speedup_p50']:.2f}x"
    if "p50_ms" in node:
        return f"p50 {node['p50_ms']:.2f} ms"
    return ""


def report_text(result: Result) -> str:
    """The table the bench printed: its own report() of the JSON, or the transcribed text."""
    if "table" in result.data:
        return str(result.data["table"])
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from rich.console import Console

    module = importlib.import_module(f"benchmarks.{REPORTERS.get(result.benchmark, result.benchmark)}")
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=False, color_system=None, highlight=False)
    module.report(console, result.data)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).strip("\n")


def _machine(machine: dict[str, Any]) -> str:
    if "described" in machine:
        return str(machine["described"])
    return ", ".join(f"{k} {v}" for k, v in machine.items())


def render_results(results: list[Result], benchmark: str) -> str:
    chosen = [r for r in results if r.benchmark == benchmark]
    if not chosen:
        raise ValueError(f"no result file in benchmarks/results/ for benchmark {benchmark!r}")
    parts = []
    for result in chosen:
        data = result.data
        lines = [
            f"### {result.created[:16].replace('T', ' ')} UTC",
            "",
            f"- **machine**: {_machine(data['machine'])}",
            f"- **command**: `{data.get('command', 'kodeagent bench ' + result.benchmark)}`",
            f"- **file**: `benchmarks/results/{result.path.name}`"
            + (f" ({data['source']})" if "transcribed" in str(data.get("source", "")) else ""),
            "",
        ]
        if table := report_text(result):
            lines += ["```text", table, "```", ""]
        targets = result.targets()
        if targets:
            lines += ["| target | measured | |", "|---|---|---|"]
            lines += [f"| {t.name} | {t.measured} | {'met' if t.met else '**NOT met**'} |" for t in targets]
            lines.append("")
        if data.get("notes"):
            lines += [str(data["notes"]), ""]
        parts.append("\n".join(lines))
    return "\n".join(parts)


def render_targets(results: list[Result]) -> str:
    lines = ["| date | benchmark | target | measured | |", "|---|---|---|---|---|"]
    for result in results:
        for t in result.targets():
            verdict = "met" if t.met else "**NOT met**"
            lines.append(
                f"| {result.created[:10]} | {result.benchmark} | {t.name} | {t.measured} | {verdict} |"
            )
    return "\n".join(lines)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "<!-- bench-" not in markdown:
        return markdown
    results = load_results()
    markdown = markdown.replace(TARGETS_MARKER, render_targets(results))
    return RESULTS_MARKER.sub(lambda m: render_results(results, m.group(1)), markdown)
