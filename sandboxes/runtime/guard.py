"""The runtime guard: RestrictedPython under our own policy.

The code is compiled by RestrictedPython with `SandboxTransformer`, which rewrites every attribute
access into `_getattr_(obj, name)`, every subscript into `_getitem_`, every attribute/item store into
`_write_(obj)...`, and so on. The functions in `Guard` decide, while the code runs, what those may
return: no dunders beyond a small safe list, no frame/code/traceback/generator internals, no module
that the import allowlist does not cover (so `random._os`, `typing.sys` and `queue.threading` fail
even though `random`, `typing` and `queue` are allowed), no format-string attribute tricks.

Rules that hold however a value was reached (attribute, `from x import y`, an item, a library call):
names are checked as exact `str` (a `str` subclass can lie to `startswith` and `==`); the code holds
read-only proxies of modules, never modules (library code such as `functools.update_wrapper` would
otherwise modify a module the runner and the audit hook use); classes of modules are read-only;
`str.format`/`format_map` are replaced by guarded versions wherever they are fetched; and a module
outside the allowlist cannot be used even if the code got hold of it.

This file runs inside the sandbox (it is shipped next to `runner.py`) and in the parent (the static
checker shares `module_allowed` and the name lists). It needs only the stdlib and RestrictedPython.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import operator
import string
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

DEFAULT_BANNED_BUILTINS: tuple[str, ...] = (
    "exec",
    "eval",
    "compile",
    "__import__",
    "breakpoint",
    "input",
    "globals",
    "locals",
    "vars",
    "help",
    "exit",
    "quit",
    "memoryview",
    "open_code",
    "__build_class__",
    "__loader__",
    "__spec__",
    "__builtins__",
    "copyright",
    "credits",
    "license",
)
"""Builtins the code may not name. `allow_builtins` can bring back any of them by name."""

_BINARY_OPERATORS = (
    "add",
    "sub",
    "mul",
    "matmul",
    "truediv",
    "floordiv",
    "mod",
    "divmod",
    "pow",
    "lshift",
    "rshift",
    "and",
    "or",
    "xor",
)
"""The binary operators of the data model, each with `__op__`, `__rop__` and (but divmod) `__iop__`."""

DEFAULT_ALLOWED_DUNDERS: tuple[str, ...] = (
    "__init__",
    "__post_init__",
    "__new__",
    "__name__",
    "__qualname__",
    "__doc__",
    "__module__",
    "__version__",
    "__class__",
    "__slots__",
    "__all__",
    "__annotations__",
    "__match_args__",
    "__repr__",
    "__str__",
    "__format__",
    "__hash__",
    "__bool__",
    "__len__",
    "__iter__",
    "__next__",
    "__reversed__",
    "__contains__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__missing__",
    "__call__",
    "__enter__",
    "__exit__",
    "__aenter__",
    "__aexit__",
    "__aiter__",
    "__anext__",
    "__await__",
    "__length_hint__",
    "__bytes__",
    "__copy__",
    "__deepcopy__",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    *(f"__{op}__" for op in _BINARY_OPERATORS),
    *(f"__r{op}__" for op in _BINARY_OPERATORS),
    *(f"__i{op}__" for op in _BINARY_OPERATORS if op != "divmod"),  # there is no in-place divmod
    "__neg__",
    "__pos__",
    "__abs__",
    "__invert__",
    "__int__",
    "__float__",
    "__complex__",
    "__index__",
    "__round__",
    "__trunc__",
    "__floor__",
    "__ceil__",
    "__cause__",
    "__context__",
    "__suppress_context__",
)
"""Dunders that ordinary classes define and use: the whole numeric protocol (every binary operator
with its reflected and in-place forms, unary operators, conversions, rounding), containers,
iterators, context managers and their async forms, `copy`. Defining one only runs the class's own
code when the interpreter or a library applies that operation to its instances; reading one off a
value gives a bound method of that value.

Everything that walks the object graph (`__globals__`, `__subclasses__`, `__dict__`, `__mro__`,
`__bases__`, `__code__`, `__builtins__`, `__reduce__`, `__getattribute__`...) is absent on purpose.
So are the hooks into attribute and class machinery, which would run the code from inside it:

- `__get__`/`__set__`/`__delete__`: read off a descriptor the code reaches, `d.__set__(obj, v)` and
  `d.__delete__(obj)` write an attribute without passing `_write_`, the one check that refuses
  writes to modules and to classes of modules; defined, they make every read or write of the
  attribute (the guard's own `getattr` included) call the code with the instance and its owner class.
- `__set_name__`: `type()` calls it with the class being built, for every value in its namespace,
  also when library code builds the class from the code's values (`dataclasses.make_dataclass`
  makes a class of the module `types`): the code would be handed, half built, classes it did not
  define.
- `__init_subclass__`: runs whenever anything subclasses the class, with the new class; library code
  that builds subclasses (`dataclass(slots=True)` makes a second class and calls it again) would
  call the code with classes it did not make, mid-construction.
- `__class_getitem__`: `K[x]` on a class would run the code's function where the guard's
  `_getitem_` reads an item (its result is still checked). No known escape: it stays out with the
  other class hooks because no ordinary class needs it (generic classes get it from
  `typing.Generic`).
"""

FRAME_ATTRIBUTES: frozenset[str] = frozenset(
    {
        "tb_frame",
        "tb_next",
        "f_back",
        "f_builtins",
        "f_code",
        "f_generator",
        "f_globals",
        "f_locals",
        "f_trace",
        "co_code",
        "gi_frame",
        "gi_code",
        "gi_yieldfrom",
        "cr_frame",
        "cr_code",
        "cr_await",
        "cr_origin",
        "ag_frame",
        "ag_code",
        "ag_await",
        "mro",
    }
)
"""Attributes that lead from ordinary values to interpreter internals (frames, code, tracebacks); the
one list the static check, this guard and the audit hook's check of generated code all refuse."""

UNSAFE_CALLABLES: tuple[tuple[str, str], ...] = (
    ("operator", "attrgetter"),
    ("operator", "methodcaller"),
    ("string", "Formatter"),
    ("types", "FunctionType"),
    ("types", "CodeType"),
    ("types", "LambdaType"),
    ("functools", "singledispatchmethod"),
    ("os", "mknod"),
    ("os", "mkfifo"),
    ("os", "chroot"),
)
"""Values of allowed modules that would do unguarded attribute access or build code objects, and
`os` functions that raise no audit event, so the file guard cannot see their path (`mknod` makes
device nodes as root; `chroot` changes what every checked path means)."""

IMPLICIT_IMPORTS: frozenset[str] = frozenset({"_strptime"})
"""Private stdlib helpers that C code of allowed modules imports by itself, through the `__import__`
of the calling code's builtins (`datetime.datetime.strptime`, `time.strptime`)."""

GUARD_NAMES = frozenset(
    {
        "_getattr_",
        "_getitem_",
        "_getiter_",
        "_write_",
        "_apply_",
        "_inplacevar_",
        "_unpack_sequence_",
        "_iter_unpack_sequence_",
        "_print_",
        "_print",
        "__metaclass__",
    }
)


_STR_FORMAT = str.format
_STR_FORMAT_MAP = str.format_map


class PolicyViolation(Exception):
    """Raised inside the sandbox when the code does something the policy forbids."""


def module_allowed(name: str, patterns: Iterable[str]) -> bool:
    """True if module `name` matches a pattern: ``pkg`` exactly, ``pkg.*`` (pkg and below) or ``*``.

    `__future__` is always allowed: ``from __future__ import annotations`` is a compiler directive."""
    if name == "__future__":
        return True
    for pattern in patterns:
        if pattern == "*" or pattern == name:
            return True
        if pattern.endswith(".*"):
            base = pattern[:-2]
            if name == base or name.startswith(base + "."):
                return True
    return False


RUNNER_NAMES = frozenset({"final_answer", "ToolError", "PolicyViolation"})
"""Names the runner binds in every run, beside the session's tools: a variable of one would vanish."""


def variable_name_problem(name: Any, taken: Iterable[str] = ()) -> str | None:
    """Why `name` cannot be a variable sent into a session, or None. A variable is a name the code
    could bind itself that the runner does not rebind: an identifier, not a keyword, not starting
    with ``_`` (the guard's hooks, dunders such as ``__builtins__``, private names), not one of
    `RUNNER_NAMES` nor of `taken` (the session's tools)."""
    if type(name) is not str or not name.isidentifier() or keyword.iskeyword(name):
        return f"the variable name {plain_repr(name)} is not a Python identifier"
    if name.startswith("_"):
        return f"the variable name {name!r} starts with '_': such names are the sandbox's"
    if name in RUNNER_NAMES or name in taken:
        return f"the variable name {name!r} is taken by the sandbox (its tools, {', '.join(sorted(RUNNER_NAMES))})"
    return None


def plain_repr(value: Any) -> str:
    """A short repr of a value that may be anything, read without running any of its own code."""
    if type(value) in (str, int, float, bool) or value is None:
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    return f"of type {type(value).__name__}"


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _mangle(class_name: str, name: str) -> str:
    """Private name mangling as the compiler does it: `__x` in `class _K` is `_K__x`."""
    if not name.startswith("__") or name.endswith("__") or "." in name:
        return name
    stripped = class_name.lstrip("_")
    return f"_{stripped}{name}" if stripped else name


def plain_str(value: Any, what: str = "attribute name") -> str:
    """`value` as an exact `str`. A `str` subclass can override `startswith`, `__eq__` and `__hash__`
    to slip past every check while CPython uses its real characters; checks only ever see copies."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if what == "attribute name":  # CPython's own words, as getattr(obj, 1) says them
        raise TypeError(f"attribute name must be string, not '{type(value).__name__}'")
    raise TypeError(f"{what} must be a string, not {type(value).__name__}")


def make_transformer(allowed_dunders: frozenset[str], allowed_calls: frozenset[str]) -> type:
    """A RestrictedPython transformer class for our policy.

    Differences from RestrictedPython's default: single-underscore names and attributes are allowed
    (the runtime guard checks module privates), `print` stays the real function (output is captured
    at the fd level), `nonlocal` is allowed, classes are built without RestrictedPython's metaclass
    indirection, and dunders are allowed from `allowed_dunders` only.
    """
    from RestrictedPython.transformer import (  # imported here: the parent's static checker does not need it
        INSPECT_ATTRIBUTES,
        RestrictingNodeTransformer,
        copy_locations,
    )

    blocked_attributes = frozenset(INSPECT_ATTRIBUTES) | FRAME_ATTRIBUTES

    class SandboxTransformer(RestrictingNodeTransformer):
        def check_name(self, node: ast.AST, name: str | None, allow_magic_methods: bool = False) -> None:
            if name is None:
                return
            if _is_dunder(name):
                if name not in allowed_dunders:
                    self.error(node, f'"{name}" is not an allowed name')
            elif name in GUARD_NAMES or (len(name) > 1 and name.startswith("_") and name.endswith("_")):
                self.error(node, f'"{name}" is reserved for the sandbox')

        def visit_Name(self, node: ast.Name) -> ast.AST:
            node = self.node_contents_visit(node)
            self.check_name(node, node.id)
            return node

        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            if isinstance(node.ctx, ast.Load) and self._classes:
                # The compiler mangles `self.__x` inside `class K` to `_K__x`, but not the string
                # constant `_getattr_` receives: mangle it here, as the store side is mangled.
                node.attr = _mangle(self._classes[-1], node.attr)
            if _is_dunder(node.attr) and node.attr not in allowed_dunders:
                self.error(node, f'"{node.attr}" is not an allowed attribute')
            if node.attr in blocked_attributes:
                self.error(node, f'"{node.attr}" is an interpreter internal and not allowed')
            node = self.node_contents_visit(node)
            if isinstance(node.ctx, ast.Load):
                call = ast.Call(
                    func=ast.Name("_getattr_", ast.Load()),
                    args=[node.value, ast.Constant(node.attr)],
                    keywords=[],
                )
                copy_locations(call, node)
                return call
            wrapped = ast.Call(func=ast.Name("_write_", ast.Load()), args=[node.value], keywords=[])
            copy_locations(wrapped, node.value)
            node.value = wrapped
            return node

        def visit_Call(self, node: ast.Call) -> ast.AST:
            if isinstance(node.func, ast.Name) and node.func.id in {"exec", "eval"}:
                if node.func.id not in allowed_calls:
                    self.error(node, f"{node.func.id}() is not allowed")
            # `f(*args, **kwargs)` stays as written (RestrictedPython routes it through `_apply_`,
            # a hook that would check nothing here): CPython's own errors then name `f`.
            return self.node_contents_visit(node)

        def visit_Nonlocal(self, node: ast.Nonlocal) -> ast.AST:
            return self.node_contents_visit(node)

        # Async code (RestrictedPython refuses it): a coroutine, an async generator and what they
        # await are values like a generator, their frames and code behind the same blocked names
        # (`cr_frame`, `ag_frame`, `cr_await`...); `async def` gets the checks `def` gets, and
        # `async with` the same rewrite of tuple targets as `with`.
        def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> Any:
            return RestrictingNodeTransformer.visit_FunctionDef(self, node)  # type: ignore[arg-type]  # same fields

        def visit_AsyncWith(self, node: ast.AsyncWith) -> Any:
            return RestrictingNodeTransformer.visit_With(self, node)  # type: ignore[arg-type]  # same fields

        def visit_Await(self, node: ast.Await) -> ast.AST:
            return self.node_contents_visit(node)

        def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
            # Not through `_getiter_` (that is `iter`, which an async iterable does not support);
            # the target unpacks natively, as `_getiter_` would let it.
            return self.node_contents_visit(node)

        def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
            if node.is_async:
                return self.node_contents_visit(node)
            guarded: Any = self.guard_iter(node)  # the node: RestrictedPython returns it
            return guarded

        def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
            # `self.n += 1` and `counts[k] += 1` (RestrictedPython refuses both): the target object
            # goes through `_write_` like any store, and the attribute name was checked above at
            # compile time; names keep RestrictedPython's `_inplacevar_` rewrite.
            if isinstance(node.target, ast.Name):
                rewritten: Any = super().visit_AugAssign(node)  # a node: RestrictedPython returns it
                return rewritten
            visited: ast.AST = self.node_contents_visit(node)
            return visited

        def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
            # `x: int = 1` (dataclass fields, typed variables): the target and the annotation are
            # visited like any other store and expression.
            return self.node_contents_visit(node)

        _classes: list[str] = []

        def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
            self.check_name(node, node.name)
            if any(k.arg == "metaclass" for k in node.keywords):
                self.error(node, "metaclasses are not allowed")
            # Bases, keywords and decorators are outside the class's mangling scope.
            for child in (*node.bases, *node.keywords, *node.decorator_list):
                self.visit(child)
            self._classes = [*self._classes, node.name]
            try:
                body: list[ast.stmt] = []
                for stmt in node.body:
                    new = self.visit(stmt)
                    body.extend(new if isinstance(new, list) else [new] if new is not None else [])
                node.body = body
            finally:
                self._classes = self._classes[:-1]
            return node

        def visit_Match(self, node: ast.AST) -> ast.AST:
            return self.node_contents_visit(node)

        visit_match_case = visit_MatchValue = visit_MatchSingleton = visit_MatchSequence = visit_Match
        visit_MatchMapping = visit_MatchClass = visit_MatchOr = visit_Match

        def visit_MatchStar(self, node: ast.AST) -> ast.AST:
            self.check_name(node, getattr(node, "name", None))
            return self.node_contents_visit(node)

        visit_MatchAs = visit_MatchStar

    return SandboxTransformer


class Guard:
    """The runtime half of the policy: guarded builtins and the `_getattr_`-family functions."""

    def __init__(
        self,
        allowed_imports: Iterable[str],
        banned_builtins: Iterable[str],
        allowed_dunders: Iterable[str],
        importer: Callable[..., Any],
    ) -> None:
        self.allowed_imports = tuple(allowed_imports)
        self.banned = frozenset(banned_builtins)
        self.dunders = frozenset(allowed_dunders)
        self._import = importer
        self._module_cache: dict[str, bool] = {}
        self._unsafe_ids: set[int] = set()
        self._granted_modules: set[int] = set()  # modules handed out under an allowed name (os.path)
        self._proxies: dict[int, Any] = {}  # id(module) -> its proxy; both live as long as the runner
        self._proxied: dict[int, types.ModuleType] = {}  # id(proxy) -> module
        allowed_calls = frozenset({"exec", "eval"} - self.banned)
        self.transformer = make_transformer(self.dunders, allowed_calls)
        self._formatter = _GuardedFormatter(self)

    # --------------------------------------------------------------- modules

    def module_allowed(self, name: str) -> bool:
        allowed = self._module_cache.get(name)
        if allowed is None:
            allowed = self._module_cache[name] = module_allowed(name, self.allowed_imports)
        return allowed

    def _note_unsafe_values(self, module: types.ModuleType) -> None:
        """Record the unsafe values of every loaded module (whichever module was handed out: the
        values are reachable through re-exports, `from x import y` and attributes of other modules)."""
        for module_name, attribute in UNSAFE_CALLABLES:
            loaded = sys.modules.get(module_name)
            if loaded is not None and hasattr(loaded, attribute):
                self._unsafe_ids.add(id(getattr(loaded, attribute)))

    def guarded_import(
        self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level:
            raise PolicyViolation("relative imports are not available in the sandbox")
        if (
            type(fromlist) is list
            and fromlist in ([], ["__doc__"])
            and type(name) is str
            and name in IMPLICIT_IMPORTS
        ):
            # C code of an allowed module importing its helper (`datetime.strptime` -> `_strptime`);
            # PyImport_Import calls __import__ with this list. It gets the module it asked for.
            return self._import(name, ())
        name = plain_str(name, "module name")
        if not self.module_allowed(name):
            allowed = ", ".join(self.allowed_imports) or "none"
            raise PolicyViolation(f"import of '{name}' is not allowed. Allowed imports: {allowed}")
        items = [plain_str(item, "imported name") for item in fromlist or ()]
        if "*" in items:
            raise PolicyViolation("'import *' is not allowed; import the names you need")
        module = self._import(name, ())
        self._note_unsafe_values(module)
        target = sys.modules.get(name, module)
        self._note_unsafe_values(target)
        if isinstance(target, types.ModuleType):
            self._granted_modules.add(id(target))
        if not items:
            return self.proxy(module)
        for item in items:
            # `from pkg import sub` imports the submodule `pkg.sub`: only if the allowlist covers it.
            if not hasattr(target, item) and not self.module_allowed(f"{name}.{item}"):
                raise PolicyViolation(f"import of '{name}.{item}' is not allowed")
        module = self._import(name, tuple(items))
        for item in items:
            # The names `from x import y` binds get the same checks as `x.y` (no `typing.sys`).
            self.check_attribute(module, item)
            if hasattr(module, item):
                self.check_value(getattr(module, item), f"{name}.{item}")
        return self.proxy(module)  # IMPORT_FROM reads the names through the proxy, so through getattr

    def proxy(self, module: types.ModuleType) -> Any:
        """The stand-in the code holds instead of `module` (one per module, so `is` still works).

        The code never holds a real module: library code it calls with one (`functools.update_wrapper`,
        `dataclasses.dataclass`, `setattr`...) would otherwise modify it below the guard, and modules
        are shared with the runner (`json.dumps` writes its replies) and the audit hook (`os.path`
        resolves the paths it checks). Reads through the proxy go through `getattr`; writes fail.
        """
        found = self._proxies.get(id(module))
        if found is None:
            found = self._proxies[id(module)] = _module_proxy(self, module)
            self._proxied[id(found)] = module
        return found

    def unwrap(self, obj: Any) -> Any:
        return self._proxied.get(id(obj), obj)

    # --------------------------------------------------------------- attributes

    def check_attribute(self, obj: Any, name: str) -> str:
        """Refuse what `obj.name` may not read; return the name as an exact `str`."""
        name = plain_str(name)
        if name.startswith("__") and name.endswith("__"):
            if name not in self.dunders:
                raise PolicyViolation(f"access to the attribute '{name}' is not allowed")
        elif name in FRAME_ATTRIBUTES:
            raise PolicyViolation(f"access to the attribute '{name}' (interpreter internals) is not allowed")
        elif isinstance(obj, types.ModuleType):
            if name.startswith("_"):
                raise PolicyViolation(
                    f"access to the private attribute '{obj.__name__}.{name}' is not allowed"
                )
            module_name = obj.__name__
            if not (
                id(obj) in self._granted_modules
                or self.module_allowed(module_name)
                or self.module_allowed(f"{module_name}.{name}")
            ):
                # However the code came to hold a module outside the allowlist, it cannot use it.
                raise PolicyViolation(f"the module '{module_name}' is not allowed")
        return name

    def check_value(self, value: Any, path: str) -> Any:
        if isinstance(value, types.ModuleType):
            if not (self.module_allowed(value.__name__) or self.module_allowed(path)):
                raise PolicyViolation(f"'{path}' is the module '{value.__name__}', which is not allowed")
            self._granted_modules.add(id(value))
            self._note_unsafe_values(value)
            return self.proxy(value)
        elif isinstance(value, types.FrameType | types.CodeType | types.TracebackType):
            raise PolicyViolation(f"'{path}' leads to interpreter internals")
        elif id(value) in self._unsafe_ids:
            raise PolicyViolation(f"'{path}' is not available in the sandbox")
        elif value is _STR_FORMAT or value is _STR_FORMAT_MAP:
            return self._safe_format_method(None, value.__name__)
        elif (
            type(value) is types.BuiltinMethodType
            and isinstance(value.__self__, str)
            and value.__name__ in ("format", "format_map")
        ):
            # However the bound method was reached (`s.format`, `super(S, s).format`...), fields go
            # through the guard.
            return self._safe_format_method(value.__self__, value.__name__)
        return value

    def getattr(self, obj: Any, name: str, *default: Any) -> Any:
        obj = self._proxied.get(id(obj), obj)
        name = self.check_attribute(obj, name)
        try:
            value = getattr(obj, name)
        except AttributeError:
            if default:
                return default[0]
            raise
        path = f"{obj.__name__}.{name}" if isinstance(obj, types.ModuleType) else name
        return self.check_value(value, path)

    def hasattr(self, obj: Any, name: str) -> bool:
        try:
            self.getattr(obj, name)
        except (AttributeError, PolicyViolation):
            return False
        return True

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        obj = self._proxied.get(id(obj), obj)
        name = self.check_attribute(obj, name)
        builtins.setattr(self.write(obj), name, value)

    def delattr(self, obj: Any, name: str) -> None:
        obj = self._proxied.get(id(obj), obj)
        name = self.check_attribute(obj, name)
        builtins.delattr(self.write(obj), name)

    def write(self, obj: Any) -> Any:
        obj = self._proxied.get(id(obj), obj)
        if isinstance(obj, types.ModuleType):
            raise PolicyViolation(f"modules cannot be modified ('{obj.__name__}')")
        if isinstance(obj, type) and not _own_class(obj):
            # `json.JSONEncoder.encode = f` would change json for everyone in the process.
            raise PolicyViolation(
                f"classes of modules cannot be modified ('{obj.__module__}.{obj.__qualname__}')"
            )
        return obj

    def getitem(self, obj: Any, key: Any) -> Any:
        value = obj[key]
        if isinstance(value, types.ModuleType | types.FrameType | types.CodeType | types.TracebackType):
            return self.check_value(value, f"[{key!r}]")
        return value

    def _safe_format_method(self, obj: Any, name: str) -> Callable[..., str]:
        """`str.format`/`format_map`, bound to `obj` (a str) or unbound (`obj` None), through the guard."""
        vformat = self._formatter.vformat

        def text(value: Any) -> str:
            if not isinstance(value, str):
                raise TypeError(
                    f"descriptor '{name}' for 'str' objects doesn't apply to a '{type(value).__name__}' object"
                )
            return value

        if obj is not None:
            if name == "format":
                return lambda *args, **kwargs: vformat(obj, args, kwargs)
            return lambda mapping: vformat(obj, (), mapping)
        if name == "format":
            return lambda self_, *args, **kwargs: vformat(text(self_), args, kwargs)
        return lambda self_, mapping: vformat(text(self_), (), mapping)

    # --------------------------------------------------------------- namespace

    def builtins(self, extra: dict[str, Any]) -> dict[str, Any]:
        """The `__builtins__` of the sandboxed code."""
        table: dict[str, Any] = {
            name: value
            for name, value in vars(builtins).items()
            if not name.startswith("_") and name not in self.banned
        }
        table.update(
            getattr=_builtin("getattr", self.getattr, 2, 3),
            hasattr=_builtin("hasattr", self.hasattr, 2, 2),
            setattr=_builtin("setattr", self.setattr, 3, 3),
            delattr=_builtin("delattr", self.delattr, 2, 2),
            __build_class__=builtins.__build_class__,
            __import__=self.guarded_import,
            __name__="__main__",
        )
        table.update(extra)
        guards: dict[str, Any] = {
            "_getattr_": self.getattr,
            "_getitem_": self.getitem,
            "_getiter_": iter,
            "_write_": self.write,
            "_inplacevar_": _inplace,
            # `a, b = x` and `for a, b in xs` unpack as CPython does (and say what CPython says):
            # RestrictedPython's hooks would only route the items through `_getiter_`, which is `iter`.
            "_unpack_sequence_": _unpacked_as_is,
            "_iter_unpack_sequence_": _unpacked_as_is,
        }
        table.update(guards)
        return table

    def compile(self, source: str, filename: str, mode: str = "exec") -> types.CodeType:
        """Compile through our RestrictedPython transformer; the PolicyViolation lists every problem.

        Not `compile_restricted_exec`: that compiles inside a module with ``from __future__ import
        annotations`` and inherits it, so every annotation of the code became a string (which breaks
        `typing.NamedTuple`, `dataclasses.InitVar` and `get_type_hints`). Ours inherits nothing.
        """
        tree = ast.parse(source, filename, mode)  # a SyntaxError is the code's, as CPython raises it
        return self.compile_tree(tree, filename, mode)

    def compile_tree(self, tree: ast.AST, filename: str, mode: str = "exec") -> types.CodeType:
        """`compile` of an already parsed tree (which the transformer changes in place)."""
        errors: list[str] = []
        self.transformer(errors, [], {}).visit(tree)
        if errors:
            raise PolicyViolation("; ".join(_clean_error(e) for e in errors))
        return compile(tree, filename, mode, dont_inherit=True)  # type: ignore[call-overload]  # mode: exec/eval


def _own_class(cls: type) -> bool:
    """True for classes the code made: their module is the code's namespace (``__main__``) and they
    are not a class that module itself defines (the runner runs as ``__main__`` too)."""
    if cls.__module__ != "__main__":
        return False
    main = sys.modules.get("__main__")
    return getattr(main, cls.__name__, None) is not cls


def _builtin(name: str, function: Callable[..., Any], least: int, most: int) -> Callable[..., Any]:
    """`function` as the builtin `name` the code calls: named so, and refusing a wrong number of
    arguments in CPython's words (`getattr expected at least 2 arguments, got 1`)."""

    def call(*args: Any) -> Any:
        if not least <= len(args) <= most:
            if least == most:
                expected = f"{least} arguments"
            elif len(args) < least:
                expected = f"at least {least} arguments"
            else:
                expected = f"at most {most} arguments"
            raise TypeError(f"{name} expected {expected}, got {len(args)}")
        return function(*args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(builtins, name).__doc__
    return call


def _unpacked_as_is(value: Any, spec: Any, getiter: Any) -> Any:
    return value


def _module_proxy(guard: Guard, module: types.ModuleType) -> Any:
    """A read-only stand-in for `module` (see `Guard.proxy`); its class holds the module in a closure."""
    name = module.__name__

    class ModuleProxy:
        __slots__ = ()

        def __getattr__(self, attribute: str) -> Any:
            try:
                return guard.getattr(module, attribute)
            except PolicyViolation as exc:  # library code probing with getattr(x, name, default)
                raise AttributeError(str(exc)) from None

        def __setattr__(self, attribute: str, value: Any) -> None:
            raise PolicyViolation(f"modules cannot be modified ('{name}')")

        def __delattr__(self, attribute: str) -> None:
            raise PolicyViolation(f"modules cannot be modified ('{name}')")

        def __repr__(self) -> str:
            return repr(module)

        def __dir__(self) -> list[str]:
            return [n for n in dir(module) if not n.startswith("_")]

        def __copy__(self) -> Any:
            return self

        def __deepcopy__(self, memo: Any) -> Any:
            return self

        def __reduce_ex__(self, protocol: Any) -> Any:
            raise TypeError(f"cannot pickle the module {name!r}")

    ModuleProxy.__name__ = ModuleProxy.__qualname__ = "module"
    return ModuleProxy()


class _GuardedFormatter(string.Formatter):
    """`str.format` whose `{0.attr}` and `{0[key]}` fields go through the guard."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        import _string  # type: ignore[import-not-found]  # the parser str.format itself uses

        first, rest = _string.formatter_field_name_split(field_name)
        if isinstance(first, int) and first >= len(args):  # what str.format itself says
            raise IndexError(f"Replacement index {first} out of range for positional args tuple")
        obj = self.get_value(first, args, kwargs)
        for is_attribute, key in rest:
            obj = self.guard.getattr(obj, key) if is_attribute else self.guard.getitem(obj, key)
        return obj, first


_INPLACE = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
    "&=": operator.iand,
    "|=": operator.ior,
    "^=": operator.ixor,
    "@=": operator.imatmul,
}


def _inplace(op: str, target: Any, value: Any) -> Any:
    return _INPLACE[op](target, value)


def _clean_error(message: str) -> str:
    # RestrictedPython says "Line 3: ..." — keep that, drop its internal jargon.
    return message.replace(" in RestrictedPython", "")
