"""A run's source as the runner executes it: parsed once, its last expression split off, compiled,
and kept for the next run of the same source (loaded by `runner.py` as ``_kodeagent_cells``; stdlib
only). How each tree is compiled (guarded or plain) is the runner's: it passes its compilers in."""

from __future__ import annotations

import ast
import types
from collections.abc import Callable
from typing import Any

COMPILED_CELLS = 64
COMPILED_SOURCE_CHARS = 16_000
"""The compiled-cell cache keeps the last 64 sources of up to 16,000 characters: small snippets are
the ones run again; a cache of large ones would hold memory under the session's limit."""

Cell = tuple[Any, Any]
"""A compiled cell: the code of its statements, and the code of its last expression (or None)."""


def split_last_expression(tree: ast.Module) -> tuple[ast.Module, ast.Expression] | None:
    """A parsed cell as the statements before its last one and that statement as an expression, when
    it is one; else None. (Split as trees, not text: nothing is parsed twice.)"""
    node = tree.body[-1] if tree.body else None
    if not isinstance(node, ast.Expr):
        return None
    return ast.Module(body=tree.body[:-1], type_ignores=tree.type_ignores), ast.Expression(body=node.value)


def renamed(code: types.CodeType, filename: str) -> types.CodeType:
    """`code` and every code object inside it (functions, classes, comprehensions) with `filename`."""
    consts = tuple(renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


class CompiledCells:
    """The code of a run, and apart from it its last statement when that is an expression, whose
    value the reply carries (as a notebook's cell has a value). The source is parsed once and split
    as a tree (the nodes keep their lines and columns, so tracebacks point at the code as written).
    Where the split does not compile, the code compiles whole: it runs, without a value; and code
    that does not parse compiles whole, so its error names every problem.

    A source compiled before in this session is taken from the cache (code objects are immutable
    and the session's guard never changes), renamed to this cell: a snippet run again and again (a
    test call, a probe) skips the parse, the transform and the compile."""

    def __init__(
        self,
        compile_source: Callable[[str, str, str], Any],
        compile_tree: Callable[[ast.AST, str, str], Any],
    ) -> None:
        self.compile_source = compile_source
        self.compile_tree = compile_tree
        self.cells: dict[str, Cell] = {}
        """Source -> its compiled cell, oldest first, at most `COMPILED_CELLS`."""

    def get(self, source: str, filename: str) -> Cell:
        cached = self.cells.get(source)
        if cached is not None:
            return renamed(cached[0], filename), cached[1] and renamed(cached[1], filename)
        cell = self._compile(source, filename)
        if len(source) <= COMPILED_SOURCE_CHARS:
            if len(self.cells) >= COMPILED_CELLS:
                del self.cells[next(iter(self.cells))]  # the oldest
            self.cells[source] = cell
        return cell

    def _compile(self, source: str, filename: str) -> Cell:
        try:
            tree = ast.parse(source, filename)
        except Exception:
            return self.compile_source(source, filename, "exec"), None
        split = split_last_expression(tree)
        if split is None:
            return self.compile_tree(tree, filename, "exec"), None
        try:
            return self.compile_tree(split[0], filename, "exec"), self.compile_tree(
                split[1], filename, "eval"
            )
        except Exception:  # compiled whole below: its error names every problem of the code
            return self.compile_source(source, filename, "exec"), None
