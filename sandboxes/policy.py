"""`Policy`: what sandboxed code may do, and the static check that runs in the parent before any code does.

The static check is the first of several layers. It is fast and its messages tell the model exactly
what is not allowed and what is, but it cannot see through values (`random._os`, `'{0.__class__}'`):
the runtime guard in the runner (`runtime/guard.py`) enforces the same policy while the code runs.
"""

from __future__ import annotations

import ast
import functools
import traceback
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .egress.policy import NetworkPolicy
from .models import ExecutionError
from .runtime.guard import (
    DEFAULT_ALLOWED_DUNDERS,
    DEFAULT_BANNED_BUILTINS,
    FRAME_ATTRIBUTES,
    module_allowed,
)
from .runtime.protocol import INVALID_CODE, POLICY_VIOLATION, SYNTAX_ERROR, PolicyConfig

DEFAULT_ALLOWED_IMPORTS: tuple[str, ...] = (
    "math",
    "cmath",
    "decimal",
    "fractions",
    "numbers",
    "random",
    "statistics",
    "json",
    "re",
    "string",
    "textwrap",
    "unicodedata",
    "difflib",
    "collections",
    "collections.abc",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "array",
    "copy",
    "dataclasses",
    "enum",
    "typing",
    "abc",
    "contextlib",
    "datetime",
    "time",
    "calendar",
    "zoneinfo",
    "hashlib",
    "base64",
    "binascii",
    "uuid",
    "csv",
    "io",
    "pprint",
)
"""Pure-computation modules of the standard library. Nothing here reaches processes or the network."""

MAX_CODE_BYTES_DEFAULT = 1_000_000


class Limits(BaseModel):
    """Resource limits of the worker process (rlimits; containers add their own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_mb: int = Field(2048, ge=64, description="Address-space limit of the worker.")
    cpu_seconds: int = Field(600, ge=1, description="CPU time of the whole session, a backstop to `timeout`.")
    max_processes: int = Field(64, ge=1, description="Processes and threads of the worker's user.")
    max_file_mb: int = Field(256, ge=1, description="Largest file the code may write.")
    max_open_files: int = Field(256, ge=16)


class Policy(BaseModel):
    """What the code may do. The defaults are strict: pure computation and files in the working directory.

    Attributes:
        allowed_imports: module patterns: ``"pkg"`` allows exactly `pkg`, ``"pkg.*"`` allows `pkg` and
            every submodule, ``"*"`` allows everything (then only the other layers protect you).
        allow_builtins: names from `banned_builtins` to allow again, e.g. ``["eval"]``. An allowed
            `eval`/`exec`/`compile` compiles its string through the same runtime guard.
        banned_builtins: builtins the code may not name.
        allowed_dunders: the ``__dunder__`` attributes the code may use (``__init__``, ``__name__``...).
        files: ``"workdir"`` (read and write inside the working directory only), ``"none"``, or ``"any"``.
        network: ``False`` (no network), ``True`` (the public internet only, through the egress
            gateway: never this machine, private or link-local ranges, or another session), or a
            `NetworkPolicy` with allow and deny rules (what reaches a private address or this
            machine must be allowed there explicitly).
        subprocess: allow starting processes (only meaningful if an allowed module can).
        limits: resource limits of the worker.
        max_code_bytes: larger snippets are refused before they are parsed.
        python_guards: ``False`` runs the code as plain Python: no static check, no RestrictedPython
            guard, no audit hook, so every import, `os.fork`, signals and the real builtins work and
            the other fields but `limits` and `max_code_bytes` have no effect. Only the boundary around
            the process (bubblewrap namespaces, the container, the microVM), the rlimits, the
            timeout and the output caps then hold, so a session with it is refused where that
            boundary is the bare host ``process`` level. The code can also forge its own result (it
            can reach the runner); the parent still bounds it. Meant for running programs exactly
            as their own harness would (`kodeagent bench humaneval`), not for agents.
    """

    # Hidden inputs: a network policy's secrets must not appear in a validation error.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    allowed_imports: tuple[str, ...] = DEFAULT_ALLOWED_IMPORTS
    allow_builtins: tuple[str, ...] = ()
    banned_builtins: tuple[str, ...] = DEFAULT_BANNED_BUILTINS
    allowed_dunders: tuple[str, ...] = DEFAULT_ALLOWED_DUNDERS
    files: Literal["workdir", "none", "any"] = "workdir"
    network: bool | NetworkPolicy = False
    subprocess: bool = False
    limits: Limits = Limits()
    max_code_bytes: int = Field(MAX_CODE_BYTES_DEFAULT, ge=1)
    python_guards: bool = True

    @field_validator("allowed_imports", "allow_builtins", "banned_builtins", "allowed_dunders", mode="before")
    @classmethod
    def _as_tuple(cls, value: Iterable[str] | str) -> tuple[str, ...]:
        if isinstance(value, str):
            raise ValueError("give a list of names, not a single string")
        return tuple(value)

    @field_validator("allowed_imports")
    @classmethod
    def _check_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            base = pattern[:-2] if pattern.endswith(".*") else pattern
            if pattern != "*" and not all(part.isidentifier() for part in base.split(".")):
                raise ValueError(f"{pattern!r} is not a module pattern; use 'pkg' or 'pkg.*'")
        return patterns

    @property
    def network_policy(self) -> NetworkPolicy | None:
        """The rules of a network-on policy (``network=True``: the default public-only rules), or None."""
        if isinstance(self.network, NetworkPolicy):
            return self.network
        return NetworkPolicy() if self.network else None

    @property
    def effective_banned_builtins(self) -> frozenset[str]:
        return frozenset(self.banned_builtins) - frozenset(self.allow_builtins)

    def runtime_config(self) -> PolicyConfig:
        """The part of the policy the runner enforces, as JSON."""
        limits = self.limits
        return {
            "allowed_imports": list(self.allowed_imports),
            "banned_builtins": sorted(self.effective_banned_builtins),
            "allowed_dunders": list(self.allowed_dunders),
            "files": self.files,
            "network": self.network_policy is not None,
            "subprocess": self.subprocess,
            "limits": {
                "memory_mb": limits.memory_mb,
                "cpu_seconds": limits.cpu_seconds,
                "max_processes": limits.max_processes,
                "max_file_mb": limits.max_file_mb,
                "max_open_files": limits.max_open_files,
            },
            "python_guards": self.python_guards,
        }

    def check(self, code: str, extra_names: Iterable[str] = ()) -> ExecutionError | None:
        """Statically check `code`; return the first violation (or syntax error), or None.

        Without `python_guards` nothing is checked here: the runner compiles the code as it is.
        The verdicts of recent snippets are cached (the policy is frozen, so a verdict holds for as
        long as the same code meets the same policy and names): a snippet run again skips the parse."""
        if not self.python_guards:
            return None
        names = frozenset(extra_names)
        if len(code) > CHECKED_SOURCE_CHARS:
            return self._check(code, names)
        verdict = _cached_check(self, code, names)
        return None if verdict is None else verdict.model_copy()

    def _check(self, code: str, extra_names: frozenset[str]) -> ExecutionError | None:
        try:
            tree = ast.parse(code, filename="<code>")
        except SyntaxError as exc:
            return ExecutionError(
                type=SYNTAX_ERROR,
                message=f"{exc.msg} (line {exc.lineno}, column {exc.offset})",
                traceback=syntax_error_text(exc),
                line=exc.lineno,
                column=exc.offset,
            )
        except (ValueError, RecursionError, MemoryError) as exc:
            why = str(exc) or (
                "it is nested too deeply"
                if isinstance(exc, RecursionError | MemoryError)
                else type(exc).__name__
            )
            return ExecutionError(type=INVALID_CODE, message=f"the code cannot be parsed: {why}")
        checker = _StaticChecker(self, extra_names)
        checker.check(tree)
        violation = checker.violation
        if violation is not None and checker.node is not None:
            message = violation.message.removesuffix(f" (line {violation.line})")
            violation.traceback = _pointed(code, checker.node, f"{violation.type}: {message}")
        return violation


CHECKED_SOURCE_CHARS = 16_000
"""Verdicts are cached for snippets up to this size (the ones that are run again), 256 of them."""


@functools.lru_cache(maxsize=256)
def _cached_check(policy: Policy, code: str, extra_names: frozenset[str]) -> ExecutionError | None:
    return policy._check(code, extra_names)


SHOWN_LINE_CHARS = 160
"""How much of the offending source line an error's text shows (a window around the column)."""


def syntax_error_text(exc: SyntaxError, filename: str = "<code>") -> str:
    """The text CPython prints for `exc`: where, the offending line with a caret under the problem,
    then the error; a long line shows only a window of it around the caret."""
    text, offset, end = exc.text, exc.offset, exc.end_offset
    if text is not None and offset is not None and len(text) > SHOWN_LINE_CHARS:
        start = max(0, min(offset - 1 - SHOWN_LINE_CHARS // 2, len(text) - SHOWN_LINE_CHARS))
        prefix = "..." if start else ""
        shown = text[start : start + SHOWN_LINE_CHARS]
        suffix = "..." if start + SHOWN_LINE_CHARS < len(text.rstrip("\n")) else ""
        shift = len(prefix) - start
        offset += shift
        if end:
            end = max(offset, min(end + shift, len(prefix) + len(shown) + 1))
        text = prefix + shown.rstrip("\n") + suffix + "\n"
    shown_exc = type(exc)(exc.msg, (filename, exc.lineno, offset, text, exc.end_lineno, end))
    return "".join(traceback.format_exception_only(type(exc), shown_exc))


def _pointed(code: str, node: ast.AST, last_line: str) -> str | None:
    """CPython's layout for an error at `node` (file and line, the source line, carets under the
    node), ending with `last_line`; None when the node has no position."""
    line = getattr(node, "lineno", None)
    column = getattr(node, "col_offset", None)
    if not isinstance(line, int) or not isinstance(column, int):
        return None
    lines = code.splitlines()
    if not 0 < line <= len(lines):
        return None
    text = lines[line - 1]
    encoded = text.encode("utf-8", "surrogatepass")
    # ast columns count UTF-8 bytes; SyntaxError's count characters from 1
    start = len(encoded[:column].decode("utf-8", "ignore")) + 1
    end_column = getattr(node, "end_col_offset", None)
    end = start + 1
    if getattr(node, "end_lineno", None) == line and isinstance(end_column, int):
        end = max(start + 1, len(encoded[:end_column].decode("utf-8", "ignore")) + 1)
    pointer = syntax_error_text(SyntaxError("", ("<code>", line, start, text + "\n", line, end)))
    return pointer[: pointer.rindex("SyntaxError")] + last_line + "\n"


def prepare_code(
    code: str | bytes, policy: Policy, extra_names: Iterable[str] = ()
) -> tuple[str | None, ExecutionError | None]:
    """Decode and statically check code: `(text, None)` when it may run, `(None, error)` when not."""
    size = len(code)
    if size > policy.max_code_bytes:
        return None, ExecutionError(
            type=INVALID_CODE,
            message=f"the code is {size:,} bytes; the limit is {policy.max_code_bytes:,} "
            "(Policy.max_code_bytes). Send it in smaller pieces or write data to a file.",
        )
    if isinstance(code, bytes):
        try:
            code = code.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, ExecutionError(
                type=INVALID_CODE, message=f"the code is not valid UTF-8 (byte {exc.start}): {exc.reason}"
            )
    if not isinstance(code, str):
        raise TypeError(f"code must be str or bytes, not {type(code).__name__}")
    if "\x00" in code:
        line = code.count("\n", 0, code.index("\x00")) + 1
        return None, ExecutionError(
            type=INVALID_CODE, message=f"the code contains a NUL byte (line {line})", line=line
        )
    return code, policy.check(code, extra_names)


class _StaticChecker(ast.NodeVisitor):
    """Finds the first thing (in source order) the policy forbids.

    Driven by `ast.walk` (iterative: no recursion limit, and several times faster than the
    recursive `NodeVisitor`, which matters because this runs in the parent for up to
    `max_code_bytes` of code); each ``visit_X`` looks at one node, never at its children.
    """

    def __init__(self, policy: Policy, extra_names: frozenset[str]) -> None:
        self.policy = policy
        self.banned = policy.effective_banned_builtins - extra_names
        self.dunders = frozenset(policy.allowed_dunders)
        self.violation: ExecutionError | None = None
        self.node: ast.AST | None = None
        """Where `violation` is (the source line its text shows)."""

    def check(self, tree: ast.AST) -> None:
        methods: dict[type, Callable[[Any], None] | None] = {}  # None: this kind has no visit method
        for node in ast.walk(tree):
            kind = type(node)
            try:
                method = methods[kind]
            except KeyError:
                method = methods[kind] = getattr(self, "visit_" + kind.__name__, None)
            if method is not None:
                method(node)

    def fail(self, node: ast.AST, message: str) -> None:
        line = getattr(node, "lineno", None)
        column = getattr(node, "col_offset", None)
        if self.violation is not None and (self.violation.line or 0, self.violation.column or 0) <= (
            line or 0,
            column or 0,
        ):
            return  # keep the earliest
        where = f" (line {line})" if line else ""
        self.node = node
        self.violation = ExecutionError(
            type=POLICY_VIOLATION, message=message + where, line=line, column=column
        )

    def check_module(self, node: ast.AST, name: str) -> None:
        if not module_allowed(name, self.policy.allowed_imports):
            allowed = ", ".join(self.policy.allowed_imports) or "none"
            self.fail(node, f"import of '{name}' is not allowed. Allowed imports: {allowed}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_module(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.fail(node, "relative imports are not available in the sandbox; import modules by full name")
        elif node.module:
            self.check_module(node, node.module)
            if any(alias.name == "*" for alias in node.names):
                self.fail(node, f"'from {node.module} import *' is not allowed; import the names you need")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.banned:
            self.fail(node, f"the builtin '{node.id}' is not allowed")
        elif _is_dunder(node.id) and node.id not in self.dunders:
            self.fail(node, f"the name '{node.id}' is not allowed")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _is_dunder(node.attr) and node.attr not in self.dunders:
            self.fail(node, f"access to the attribute '{node.attr}' is not allowed")
        elif node.attr in FRAME_ATTRIBUTES:
            self.fail(node, f"access to the attribute '{node.attr}' (interpreter internals) is not allowed")

    def visit_Call(self, node: ast.Call) -> None:
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "delattr", "hasattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name = node.args[1].value
            if (name.startswith("__") and name not in self.dunders) or name in FRAME_ATTRIBUTES:
                self.fail(node, f"{node.func.id}() of the attribute '{name}' is not allowed")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(k.arg == "metaclass" for k in node.keywords):
            self.fail(node, "metaclasses are not allowed")


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")
