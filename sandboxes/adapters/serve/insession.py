"""How the server runs its own stdlib helpers as code of a session (envd's file operations and
commands, the interpreter's cells): the helper becomes a module of the session's interpreter the first
time (compiling it is what costs: the runner checks all code it compiles), keyed by a hash of its
source, and each call is then one short expression ending with the helper's answer, which comes back
as the run's `value` through the executor's bounded codec. The session's own variables are untouched.
The session may replace that module (its code controls its interpreter): every answer is validated
by the caller."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

HELPERS = (
    Path(__file__).parent / "interpreter" / "insandbox.py",
    Path(__file__).parent / "envd" / "insandbox.py",
)
"""The helpers' sources: the interpreter's cells and contexts, envd's files and commands."""


def source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def module_name(helper_source: str) -> str:
    """The name a helper's module has in the session (a hash of its source)."""
    return f"__kodeagent_helper_{hashlib.sha256(helper_source.encode()).hexdigest()[:16]}__"


@functools.cache
def preload_files() -> tuple[str, ...]:
    """The helpers as trusted preload files named as `helper_code` finds them (for
    ``HostExecutor(preload=...)``): a session forked from the fork server then has them compiled
    already, instead of compiling one at its first cell or file operation (a few milliseconds of
    every create → first result)."""
    directory = tempfile.mkdtemp(prefix="kodeagent-serve-helpers-")
    atexit.register(shutil.rmtree, directory, True)
    paths = []
    for helper in HELPERS:
        text = source(helper)
        path = os.path.join(directory, f"{module_name(text)}.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        paths.append(path)
    return tuple(paths)


def helper_code(helper_source: str, request: dict[str, Any]) -> str:
    """Code that runs `helper_source`'s ``main(request)`` in the session and ends with its answer."""
    name = module_name(helper_source)
    install = (
        f"(lambda __m: (__import__('builtins').exec({helper_source!r}, __m.__dict__), "
        f"__s.modules.__setitem__({name!r}, __m), __m)[2])(__import__('types').ModuleType({name!r}))"
    )
    return (
        f"(lambda __s: (__s.modules[{name!r}] if {name!r} in __s.modules else {install})"
        f".main(__import__('json').loads({json.dumps(request)!r})))(__import__('sys'))"
    )
