"""The system guard: a CPython audit hook that confines what the code's *library calls* may do.

The attribute guard sees the code; this hook sees what the interpreter does on its behalf, however
the call was reached (`open`, `io.FileIO`, `pathlib`, `os.*`, `shutil`, sockets, subprocesses).
While user code runs it refuses:

- files outside the working directory (after resolving symlinks, ``..`` and ``/proc/self/cwd``);
  reads of the interpreter's own library directories stay allowed so lazy imports work;
- starting processes and signalling (unless the policy allows subprocesses);
- sockets (unless the policy allows the network);
- compiling source text, except for the stdlib modules that generate code from validated parts
  (`dataclasses`, `collections.namedtuple`, `enum`) and our own guarded `eval`/`exec`.

What it cannot see: C extensions calling libc directly (numpy reading a file with `fopen`, for one).
That is what the process and namespace layers are for. Audit hooks cannot be removed once added.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import os
import symtable
import sys
import threading
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any

_PATH_EVENTS = {
    "os.listdir": (0,),
    "os.scandir": (0,),
    "os.chdir": (0,),
    "os.mkdir": (0,),
    "os.rmdir": (0,),
    "os.remove": (0,),
    "os.rename": (0, 1),
    "os.link": (0, 1),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.utime": (0,),
    "os.chflags": (0,),
    "os.mkfifo": (0,),
    "os.mknod": (0,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
    "os.listxattr": (0,),
    "os.getxattr": (0,),
    "shutil.copyfile": (0, 1),
    "shutil.copymode": (0, 1),
    "shutil.copystat": (0, 1),
    "shutil.copytree": (0, 1),
    "shutil.rmtree": (0,),
    "shutil.move": (0, 1),
    "shutil.chown": (0,),
    "shutil.make_archive": (0,),
    "shutil.unpack_archive": (0, 1),
    "glob.glob": (0,),
    "os.symlink": (1,),
    "pathlib.Path.glob": (),
}

_PROCESS_EVENTS = frozenset(
    {
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "subprocess.Popen",
        "pty.spawn",
        "os.startfile",
        "os.setuid",
        "os.setgid",
        "os.pidfd_open",
        "signal.pthread_kill",
    }
)

_NETWORK_EVENTS = frozenset(
    {
        "socket.__new__",
        "socket.bind",
        "socket.connect",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "urllib.Request",
        "http.client.connect",
        "ftplib.connect",
        "smtplib.connect",
        "telnetlib.Telnet.open",
    }
)

_INTERNALS_EVENTS = frozenset(
    {
        "sys._current_frames",
        "sys._current_exceptions",
        "sys.settrace",
        "sys.setprofile",
        "sys.monitoring.register_callback",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
        "ctypes.addressof",
        "ctypes.call_function",
        "ctypes.PyObj_FromPtr",
        "ctypes.string_at",
        "ctypes.wstring_at",
        "code.__new__",
        "function.__new__",
        "cpython.run_command",
        "cpython.run_file",
        "cpython.run_module",
        "cpython.run_interactivehook",
        "cpython.run_startup",
        "cpython.PyInterpreterState_New",
        "mmap.__new__",
        "marshal.loads",
        "marshal.load",
        "pickle.find_class",
        "builtins.input",
        "builtins.breakpoint",
        "webbrowser.open",
        "resource.setrlimit",
        "resource.prlimit",
    }
)
"""`resource.setrlimit`: a worker running as root (the host's `process` level without a private user)
could raise its own hard limits."""

_TRUSTED_COMPILERS = frozenset({"dataclasses", "collections", "enum"})
"""Stdlib modules that generate code from parts (field names) the code supplies. What they compile is
validated by `check_generated_source`: a field name like ``"x,__import__('os')"`` must not become code."""

_PARSE_ONLY_COMPILERS = frozenset({"ast"})
"""`ast.parse` compiles to a syntax tree only, which cannot run (`inspect.signature` needs it)."""

_GENERATED_GLOBALS = frozenset({"hash", "super", "type", "NotImplemented", "_tuple_new", "__class__"})
_GENERATED_ROOTS = frozenset({"self", "other", "__dataclass_self__", "__dataclass_builtins_object__"})
_GENERATED_DUNDERS = frozenset({"__class__", "__qualname__", "__setattr__", "__delattr__", "__post_init__"})
_GENERATED_NODES = (
    "Module",
    "Expression",
    "Interactive",
    "FunctionDef",
    "Lambda",
    "arguments",
    "arg",
    "Return",
    "Assign",
    "Expr",
    "If",
    "Raise",
    "Compare",
    "IfExp",
    "Call",
    "Attribute",
    "Name",
    "Constant",
    "Tuple",
    "JoinedStr",
    "FormattedValue",
    "BinOp",
    "BoolOp",
    "UnaryOp",
    "keyword",
    "Load",
    "Store",
    "Add",
    "Is",
    "IsNot",
    "Eq",
    "NotEq",
    "Lt",
    "LtE",
    "Gt",
    "GtE",
    "In",
    "NotIn",
    "And",
    "Or",
    "Not",
)


# The frame-attribute denylist is defined once, in `guard.py`, for the attribute guard and for this
# hook: the copy of it the runner loaded (siblings.py, loaded by the entry point first).
_FRAME_ATTRIBUTES: frozenset[str] = sys.modules["_kodeagent_siblings"].load("guard").FRAME_ATTRIBUTES
"""The attribute guard's `FRAME_ATTRIBUTES`: generated code reads none of them either."""


def check_generated_source(source: str) -> str | None:
    """Why `source`, generated by a trusted stdlib module, is not plain generated code (None if it is).

    Generated methods (dataclass ``__init__``/``__repr__``/``__eq__``..., namedtuple ``__new__``) only
    read attributes of their own objects, call a few helpers and the values they were given, and refer
    to no global beyond a handful of harmless builtins. Anything else came from a crafted name.
    """
    try:
        tree = ast.parse(source)
        table = symtable.symtable(source, "<generated>", "exec")
    except (SyntaxError, ValueError) as exc:
        return f"it does not parse ({exc})"
    for node in ast.walk(tree):
        kind = type(node).__name__
        if kind not in _GENERATED_NODES:
            return f"it contains {kind}"
        if isinstance(node, ast.Attribute):
            if node.attr in _FRAME_ATTRIBUTES or (
                node.attr.startswith("__") and node.attr not in _GENERATED_DUNDERS
            ):
                return f"it reads the attribute {node.attr!r}"
            base = node.value
            if isinstance(base, ast.Attribute) and base.attr == "__class__":
                base = base.value
            if not (
                (isinstance(base, ast.Name) and base.id in _GENERATED_ROOTS)
                or (
                    isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
                )
            ):
                return f"it reads {node.attr!r} of something other than its own object"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr not in _GENERATED_DUNDERS:
                return f"it calls the method {node.func.attr!r}"
    stack = [table]
    while stack:
        scope = stack.pop()
        stack.extend(scope.get_children())
        for symbol in scope.get_symbols():
            if symbol.is_global() and symbol.is_referenced() and symbol.get_name() not in _GENERATED_GLOBALS:
                return f"it refers to the global name {symbol.get_name()!r}"
    return None


class SystemGuard:
    """The state the audit hook consults. One per runner.

    `active` is set when user code first runs and stays set: threads the code started, `__del__`,
    `atexit` handlers and a hostile `__str__` run between and after runs too. The runner's own work
    (compiling, truncating its capture files, imports on the code's behalf) is marked with
    `trusted()`, which counts only on the runner's main thread and holds off the garbage collector,
    so that no finalizer of the code's objects runs inside it.
    """

    def __init__(self) -> None:
        self.active = False
        self.trusted_depth = 0  # >0 while the runner itself works on the code's behalf (imports, eval)
        self.main_thread = threading.get_ident()
        self.workdir = os.path.realpath(os.getcwd())
        self.readable_roots: tuple[str, ...] = ()
        self.files = "workdir"
        self.network = False
        self.subprocess = False
        self.protected_fds: frozenset[int] = frozenset()
        self._checking_source = False

    def configure(
        self,
        *,
        files: str,
        network: bool,
        subprocess: bool,
        readable_roots: Iterable[str],
        protected_fds: Iterable[int],
    ) -> None:
        self.files, self.network, self.subprocess = files, network, subprocess
        self.workdir = os.path.realpath(os.getcwd())
        self.readable_roots = tuple(
            os.path.realpath(p) for p in [*readable_roots, *_system_data_roots()] if p
        )
        self.protected_fds = frozenset(protected_fds)
        self.main_thread = threading.get_ident()

    @contextlib.contextmanager
    def trusted(self) -> Iterator[None]:
        collecting = gc.isenabled()
        gc.disable()
        self.trusted_depth += 1
        try:
            yield
        finally:
            self.trusted_depth -= 1
            if collecting and not self.trusted_depth:
                gc.enable()

    def install(self) -> None:
        sys.addaudithook(self.hook)

    def _inside(self, path: str, roots: Iterable[str]) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    def check_path(self, raw: Any, write: bool, opening: bool = False) -> None:
        if self.files == "any":
            return
        if isinstance(raw, int):
            if raw in self.protected_fds:
                raise PermissionError("this file descriptor belongs to the sandbox runner")
            return
        if raw is None:
            raw = "."
        try:
            path = os.path.realpath(os.fsdecode(raw))
        except (TypeError, ValueError) as exc:
            raise PermissionError(f"invalid path {raw!r}") from exc
        if self.files == "workdir" and self._inside(path, (self.workdir,)):
            return
        if not write and self._inside(path, self.readable_roots):
            if opening and os.path.isdir(path):
                # A descriptor of a directory outside the working directory would let relative paths
                # with `dir_fd=` (which the audit events do not carry) write there.
                raise PermissionError(f"opening the directory '{os.fsdecode(raw)}' is not allowed")
            return
        where = "the working directory" if self.files == "workdir" else "no directory (files are disabled)"
        raise PermissionError(f"access to '{os.fsdecode(raw)}' is not allowed: the code may use {where}")

    def check_compile(self, args: tuple[Any, ...]) -> None:
        if self._checking_source:  # our own ast.parse of a generated source
            return
        if _running_a_module_body():
            return  # a library module being imported (lazily, by a library) compiles its own constants
        caller = _caller_module(2)
        if caller in _PARSE_ONLY_COMPILERS:
            return
        if caller not in _TRUSTED_COMPILERS:
            raise PermissionError("compiling source text is not allowed here")
        source = args[0] if args else None
        if isinstance(source, bytes | bytearray):
            source = bytes(source).decode("utf-8", "replace")
        if not isinstance(source, str):
            raise PermissionError(f"{caller} may compile only source text here")
        self._checking_source = True
        try:
            problem = check_generated_source(source)
        finally:
            self._checking_source = False
        if problem:
            raise PermissionError(f"refused code generated by {caller}: {problem} (a crafted field name?)")

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or (self.trusted_depth and threading.get_ident() == self.main_thread):
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            write = _is_write(mode, flags)
            self.check_path(path, write, opening=True)
        elif event in _PATH_EVENTS:
            write = event not in ("os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr")
            for index in _PATH_EVENTS[event]:
                if index < len(args):
                    self.check_path(args[index], write)
        elif event in _PROCESS_EVENTS:
            if not self.subprocess:
                raise PermissionError(f"starting or signalling processes is not allowed ({event})")
        elif event in _NETWORK_EVENTS:
            if not self.network:
                raise PermissionError(f"network access is not allowed ({event})")
        elif event == "compile":
            self.check_compile(args)
        elif event in _INTERNALS_EVENTS:
            if event.startswith("ctypes.") and self.subprocess:
                return
            if event == "marshal.loads" and sys._getframe(1).f_code.co_filename == _IMPORT_MACHINERY:
                return  # a library importing a module lazily (Counter.most_common imports heapq)
            raise PermissionError(f"'{event}' is not allowed in the sandbox")


_IMPORT_MACHINERY = "<frozen importlib._bootstrap_external>"  # no user code can carry this filename


def _system_data_roots() -> list[str]:
    """Read-only system data the stdlib computation modules read: the time zone database (zoneinfo)."""
    try:
        import sysconfig

        tzpath = sysconfig.get_config_var("TZPATH") or ""
    except Exception:
        tzpath = ""
    roots = [p for p in tzpath.split(os.pathsep) if os.path.isabs(p)] or ["/usr/share/zoneinfo"]
    return [p for p in roots if os.path.isdir(p)]


def _running_a_module_body() -> bool:
    """True when the import machinery is executing a module's top-level code and no code of the user
    (a ``<cell N>`` or ``<string>`` frame) runs between it and us: the module's own constant text is
    being compiled (PIL's ``typing`` annotations, for one), not a string the user chose."""
    frame: FrameType | None = sys._getframe(3)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<cell ") or filename == "<string>":
            return False
        if (
            filename == "<frozen importlib._bootstrap>"
            and frame.f_code.co_name == "_call_with_frames_removed"
        ):
            return True
        frame = frame.f_back
    return False


def _caller_module(depth: int) -> str:
    """The stdlib module whose code is running `depth` frames up, or "" (a forged `__name__` does not
    count: the frame's code must come from that module's own file)."""
    frame = sys._getframe(depth + 1)
    name = frame.f_globals.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or getattr(module, "__file__", None) != frame.f_code.co_filename:
        return ""
    return name  # type: ignore[return-value]


def _is_write(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    if isinstance(flags, int):
        return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
    return True
