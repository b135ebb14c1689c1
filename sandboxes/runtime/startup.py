"""How a runner process starts: its flags, trusted preloads, dropped privileges, the subreaper, and
the imports a fork server pays for once (loaded by `runner.py` as ``_kodeagent_startup``; stdlib
only). Nothing here runs user code; everything here runs before any does."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: nothing is imported at run time
    from .channel import Channel

_siblings = sys.modules["_kodeagent_siblings"]  # loaded by the entry point first (siblings.py)
channel = _siblings.load("channel")


def preload(path: str) -> None:
    """Import a trusted module file (``--preload``) under its name, before any session: a session
    that imports that name gets it from ``sys.modules``, already compiled and run."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def preimport() -> None:
    """Pay once, in a fork server (the host's, a shared container's session host), for every import
    a session would otherwise pay for itself; never runs user code."""
    guard = _siblings.load("guard")
    _siblings.load("audit")
    guard.make_transformer(frozenset(), frozenset())
    import resource  # noqa: F401  (used by the runner's limits)
    import sysconfig

    sysconfig.get_config_var("TZPATH")  # loads the config-vars cache the audit guard consults at init

    import RestrictedPython.Guards  # noqa: F401  (used by Guard.builtins)

    if sys.platform.startswith("linux"):
        import ctypes  # noqa: F401  (the runner becomes a subreaper through it)

    # What a program run as its own harness runs it (`bench humaneval`: fork, tempdir, reliability
    # guard) imports at once; loaded here they cost a session nothing. Loading grants nothing: a
    # guarded session still imports only what its policy allows.
    import faulthandler  # noqa: F401
    import shutil  # noqa: F401
    import site  # noqa: F401
    import subprocess  # noqa: F401
    import tempfile  # noqa: F401


def drop_privileges(uid: int, gid: int) -> None:
    """Become `uid`:`gid` (no supplementary groups) when started as root with a user to become."""
    if os.getuid() == 0 and uid:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)


def become_subreaper() -> bool:
    """Orphans of the code's processes (a `setsid` double fork) are re-parented to the runner rather
    than to init, so the supervisor finds every one of them in the runner's process tree (Linux)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
            return True
        except (OSError, AttributeError):
            pass
    return False


RunnerFactory = Callable[["Channel", Any, Any], Any]
"""The runner's class: made from the channel, the guard module and the audit module."""


def main(argv: list[str], make_runner: RunnerFactory) -> None:
    """Start a runner from its flags (``--sys-path DIR``, ``--uid N``, ``--gid N``, ``--subreaper``,
    ``--preload FILE``) and serve the parent until the channel ends. A failure before the first
    request is a ``fatal`` message on the channel, then exit code 3."""
    uid = gid = 0
    subreaper = False
    preloads: list[str] = []
    args = iter(argv)
    for flag in args:
        if flag == "--sys-path":
            sys.path.append(next(args))
        elif flag == "--uid":
            uid = int(next(args))
        elif flag == "--gid":
            gid = int(next(args))
        elif flag == "--subreaper":
            subreaper = become_subreaper()
        elif flag == "--preload":
            preloads.append(next(args))
    link = channel.take_channel()
    try:
        for path in preloads:
            preload(path)
        drop_privileges(uid, gid or uid)
        guard_module = _siblings.load("guard")
        audit_module = _siblings.load("audit")
        if "RestrictedPython.transformer" not in sys.modules:  # a fork server's child has it (`preimport`)
            guard_module.make_transformer(frozenset(), frozenset())  # import it before the first run
        runner = make_runner(link, guard_module, audit_module)
        runner.subreaper = subreaper
    except BaseException as exc:
        link.send({"op": "fatal", "message": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(3) from None
    runner.serve()
