"""No import cycle inside `sandboxes`: the module-level imports of its modules (those under
``if TYPE_CHECKING:`` too, since a cycle only a type checker follows still says a name is in the wrong
place) form a graph without cycles. Imports inside functions are left out: they are how a backend's
SDK is imported on demand."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "sandboxes"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(body: list[ast.stmt], package: str, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in body:
        if isinstance(node, ast.If):
            found |= _imports(node.body, package, modules) | _imports(node.orelse, package, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in modules:
                    found.add(submodule)
                elif target in modules:
                    found.add(target)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph[name] = _imports(ast.parse(path.read_text(), str(path)).body, package, set(paths)) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_sandboxes_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "sandboxes.backends.docker.probe" in graph and "sandboxes.usage" in graph
    assert cycles(graph) == []
