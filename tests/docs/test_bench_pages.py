"""The benchmark pages are the committed result files: every file on its page, every target's verdict."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import sys
from pathlib import Path

from support.snippets import ROOT

from .conftest import BuiltSite

# The hook as MkDocs loads it: a file by its path, not a package.
spec = importlib.util.spec_from_file_location("bench_pages", ROOT / "docs" / "hooks" / "bench_pages.py")
assert spec is not None and spec.loader is not None
bench_pages = importlib.util.module_from_spec(spec)
sys.modules["bench_pages"] = bench_pages  # its dataclasses look their module up
spec.loader.exec_module(bench_pages)

PAGES = ["benchmarks/humaneval.html", "benchmarks/latency.html", "benchmarks/backends.html"]


def text(page: str, built: BuiltSite) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", (built.directory / page).read_text()))


def test_every_result_file_is_dated_with_its_machine_and_command() -> None:
    results = bench_pages.load_results()
    assert len(results) >= 8
    for result in results:
        assert re.match(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", result.created), result.path.name
        assert result.data["machine"].get("described") and result.data.get("command"), result.path.name
        assert result.targets(), f"{result.path.name}: no target"


def test_every_result_and_target_is_on_a_page(built_site: BuiltSite) -> None:
    assert built_site.returncode == 0, built_site.log
    pages = " ".join(text(page, built_site) for page in PAGES)
    overview = text("benchmarks/index.html", built_site)
    for result in bench_pages.load_results():
        assert f"benchmarks/results/{result.path.name}" in pages
        for target in result.targets():
            assert target.name in overview and target.name in pages
    assert "NOT met" in overview  # what is not met is said, not left out


def test_a_bench_json_renders_as_the_bench_reports_it() -> None:
    result = next(r for r in bench_pages.load_results() if r.benchmark == "latency" and "rows" in r.data)
    table = bench_pages.report_text(result)
    warm = next(row for row in result.data["rows"] if row["name"] == "warm run")
    assert "Sandbox latency" in table and f"{warm['p50_ms']:.2f} ms" in table
    missed = [t for t in result.targets() if not t.met]
    assert {t.name for t in missed} == {
        f"host: {row['name']}: p50 <= {row['target_p50_ms']:g} ms"
        if "target_p50_ms" in row
        else "host: warm run p50 <= smolagents' LocalPythonExecutor p50"
        for row in result.data["rows"]
        if row.get("meets_target") is False
    }


def test_a_result_without_a_machine_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"benchmark": "latency", "created": "2026-01-01T00:00"}))
    try:
        bench_pages.load_results(tmp_path)
    except ValueError as error:
        assert "machine" in str(error)
    else:
        raise AssertionError("a result file without its machine was accepted")
