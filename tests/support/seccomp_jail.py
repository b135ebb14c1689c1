"""Run a command where the kernel refuses new namespaces, as a container's seccomp profile makes it do.

Docker's default profile, for one, makes ``unshare`` and namespace-creating ``clone`` calls fail with
EPERM for a process without CAP_SYS_ADMIN. This installs a real seccomp filter that does the same (the
kernel enforces it; nothing is mocked), then executes the command in place:

    python3 seccomp_jail.py unshare|all COMMAND [ARG...]

``unshare``: only ``unshare(2)`` is refused (bubblewrap, which uses ``clone``, still works; a process
inside cannot move itself into new namespaces). ``all``: ``clone`` with a namespace flag is refused
too (and ``clone3`` answers ENOSYS so that libc falls back to ``clone``), so bubblewrap fails as in a
container. x86_64 and aarch64; `supported()` says whether this machine is one.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

# audit arch, then the numbers of unshare, clone and clone3
_ARCH = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}
_NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_EPERM, _ENOSYS = 1, 38
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_LD, _JEQ, _JSET, _RET = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
SCRIPT = os.path.abspath(__file__)


def supported() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in _ARCH


def _op(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(mode: str) -> None:
    """Refuse namespaces to this process and everything it starts from now on (cannot be undone)."""
    arch, unshare, clone, clone3 = _ARCH[platform.machine()]
    program = [
        _op(_LD, 0, 0, 4),
        _op(_JEQ, 1, 0, arch),
        _op(_RET, 0, 0, _ALLOW),  # another ABI: allow
        _op(_LD, 0, 0, 0),  # the syscall number
        _op(_JEQ, 0, 1, unshare),
        _op(_RET, 0, 0, _ERRNO | _EPERM),
    ]
    if mode == "all":
        program += [
            _op(_JEQ, 0, 1, clone3),
            _op(_RET, 0, 0, _ERRNO | _ENOSYS),
            _op(_JEQ, 0, 3, clone),
            _op(_LD, 0, 0, 16),  # clone's flags: the low word of args[0]
            _op(_JSET, 0, 1, _NAMESPACE_FLAGS),
            _op(_RET, 0, 0, _ERRNO | _EPERM),
        ]
    program.append(_op(_RET, 0, 0, _ALLOW))
    code = ctypes.create_string_buffer(b"".join(program))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: what lets an unprivileged process filter
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    fprog = _Program(len(program), ctypes.addressof(code))
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def command(mode: str, argv: list[str]) -> list[str]:
    """`argv` run under the filter."""
    return [sys.executable, "-I", "-S", SCRIPT, mode, *argv]


if __name__ == "__main__":
    chosen, *rest = sys.argv[1:]
    install(chosen)
    os.execvp(rest[0], rest)
