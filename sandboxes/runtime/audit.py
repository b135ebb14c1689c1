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

import os
import sys
from collections.abc import Iterable
from typing import Any

_PATH_EVENTS = {
    "os.listdir": (0,), "os.scandir": (0,), "os.chdir": (0,), "os.mkdir": (0,), "os.rmdir": (0,),
    "os.remove": (0,), "os.rename": (0, 1), "os.link": (0, 1), "os.truncate": (0,),
    "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,), "os.chflags": (0,), "os.mkfifo": (0,),
    "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "os.listxattr": (0,),
    "os.getxattr": (0,), "shutil.copyfile": (0, 1), "shutil.copymode": (0, 1),
    "shutil.copystat": (0, 1), "shutil.copytree": (0, 1), "shutil.rmtree": (0,),
    "shutil.move": (0, 1), "shutil.chown": (0,), "shutil.make_archive": (0,),
    "shutil.unpack_archive": (0, 1), "glob.glob": (0,), "os.symlink": (1,), "pathlib.Path.glob": (),
}  # fmt: skip

_PROCESS_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
    "os.killpg", "subprocess.Popen", "pty.spawn", "os.startfile", "os.setuid", "os.setgid",
    "os.pidfd_open", "signal.pthread_kill",
})  # fmt: skip

_NETWORK_EVENTS = frozenset({
    "socket.__new__", "socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "urllib.Request",
    "http.client.connect", "ftplib.connect", "smtplib.connect", "telnetlib.Telnet.open",
})  # fmt: skip

_INTERNALS_EVENTS = frozenset({
    "sys._current_frames", "sys._current_exceptions", "sys.settrace",
    "sys.setprofile", "sys.monitoring.register_callback", "ctypes.dlopen", "ctypes.dlsym",
    "ctypes.cdata", "ctypes.addressof", "ctypes.call_function", "ctypes.PyObj_FromPtr",
    "ctypes.string_at", "ctypes.wstring_at", "code.__new__", "function.__new__",
    "cpython.run_command", "cpython.run_file", "cpython.run_module",
    "cpython.run_interactivehook", "cpython.run_startup", "cpython.PyInterpreterState_New",
    "mmap.__new__", "marshal.loads", "marshal.load", "pickle.find_class",
    "builtins.input", "builtins.breakpoint", "webbrowser.open",
})  # fmt: skip

_TRUSTED_COMPILERS = frozenset({"dataclasses", "collections", "enum"})


class SystemGuard:
    """The state the audit hook consults. One per runner; `active` only while user code runs."""

    def __init__(self) -> None:
        self.active = False
        self.trusted_depth = 0  # >0 while the runner itself works on the code's behalf (imports, eval)
        self.workdir = os.path.realpath(os.getcwd())
        self.readable_roots: tuple[str, ...] = ()
        self.files = "workdir"
        self.network = False
        self.subprocess = False
        self.protected_fds: frozenset[int] = frozenset()

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
        self.readable_roots = tuple(os.path.realpath(p) for p in readable_roots if p)
        self.protected_fds = frozenset(protected_fds)

    def install(self) -> None:
        sys.addaudithook(self.hook)

    def _inside(self, path: str, roots: Iterable[str]) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    def check_path(self, raw: Any, write: bool) -> None:
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
            return
        where = "the working directory" if self.files == "workdir" else "no directory (files are disabled)"
        raise PermissionError(f"access to '{os.fsdecode(raw)}' is not allowed: the code may use {where}")

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or self.trusted_depth:
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            write = _is_write(mode, flags)
            self.check_path(path, write)
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
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller not in _TRUSTED_COMPILERS:
                raise PermissionError("compiling source text is not allowed here")
        elif event in _INTERNALS_EVENTS:
            if event.startswith("ctypes.") and self.subprocess:
                return
            raise PermissionError(f"'{event}' is not allowed in the sandbox")


def _is_write(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    if isinstance(flags, int):
        return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
    return True
