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


def module_imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports: every import statement, those under
    TYPE_CHECKING and those inside functions too (a cycle of types is still a cycle to a reader)."""
    root = ROOT / package
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in root.rglob("*.py")
    }
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                submodules = {f"{target}.{alias.name}" for alias in node.names} & modules.keys()
                found.update(submodules or {target})
        edges[name] = {target for target in found if target in modules and target != name}
    return edges


@pytest.mark.parametrize("package", ["kodeagent"])
def test_the_modules_of_a_package_form_no_cycle(package: str) -> None:
    edges = module_imports(package)
    edges.pop(package, None)  # the package's __init__ imports its modules to export their names
    cycles = []
    for start in sorted(edges):
        stack = [(start, [start])]
        while stack:
            name, path = stack.pop()
            for target in sorted(edges.get(name, ())):
                if target == start:
                    cycles.append(" -> ".join([*path, start]))
                elif target not in path:
                    stack.append((target, [*path, target]))
    assert not cycles, f"import cycles in {package}: {cycles[:5]}"
