"""The house has floors and the arrows point one way: `kodeagent_cli` -> `benchmarks` -> `kodeagent`
-> `sandboxes`. Checked on the source (every import statement, lazy ones inside functions included),
so a cycle cannot hide behind an import that only runs in one command."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
OURS = ("sandboxes", "kodeagent", "benchmarks", "kodeagent_cli")
MAY_IMPORT = {
    "sandboxes": set(),
    "kodeagent": {"sandboxes"},
    "benchmarks": {"sandboxes", "kodeagent"},
    "kodeagent_cli": {"sandboxes", "kodeagent", "benchmarks"},
}
NEVER = {"sandboxes": {"litellm"}}  # the platform knows nothing about models


def imported_top_levels(package: str) -> dict[str, set[str]]:
    """Top-level module name -> the files of `package` that import it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package", OURS)
def test_a_package_imports_only_the_floors_below_it(package: str) -> None:
    imported = imported_top_levels(package)
    wrong = {name: sorted(files) for name, files in imported.items() if name in OURS and name != package}
    wrong = {name: files for name, files in wrong.items() if name not in MAY_IMPORT[package]}
    assert not wrong, f"{package} imports a floor above it or beside it: {wrong}"
    banned = {name: sorted(imported[name]) for name in NEVER.get(package, set()) if name in imported}
    assert not banned, f"{package} must not import {banned}"


def test_the_floors_form_no_cycle() -> None:
    edges = {
        package: {name for name in imported_top_levels(package) if name in OURS} - {package}
        for package in OURS
    }
    for package, targets in edges.items():
        for target in targets:
            assert package not in edges[target], f"{package} and {target} import each other"
