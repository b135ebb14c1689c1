"""The backends by name: the one list of names, and the executor class of each, imported on demand
(a module of its own so a backend can look another up without importing `open_executor`'s types)."""

from __future__ import annotations

import importlib
from typing import Final, Literal, get_args

from ..errors import UnknownBackend
from ..executor import Executor

BackendName = Literal["host", "docker", "e2b", "ray"]
"""A backend's name: the one list every reader (kodeagent's `RunEnv`, the CLI, the benchmarks) takes."""
BACKEND_NAMES: Final[tuple[BackendName, ...]] = get_args(BackendName)
"""`BackendName` at run time, in its order; `BACKENDS` has exactly these keys (a unit test keeps them equal)."""

BACKENDS: dict[str, tuple[str, str]] = {
    "host": ("sandboxes.backends.host", "HostExecutor"),
    "docker": ("sandboxes.backends.docker", "DockerExecutor"),
    "e2b": ("sandboxes.backends.e2b", "E2BExecutor"),
    "ray": ("sandboxes.backends.ray", "RayExecutor"),
}


def backend_name(name: str) -> BackendName:
    """`name` as a `BackendName` (for a name known only at run time: a command line, a config file),
    or `UnknownBackend` naming the choices; what `open_executor`'s typed overloads then accept."""
    for known in BACKEND_NAMES:
        if name == known:
            return known
    raise UnknownBackend(f"unknown backend {name!r}; choose one of: {', '.join(BACKEND_NAMES)}")


def executor_class(backend: str) -> type[Executor]:
    """The `Executor` subclass of a backend, by name."""
    try:
        module_name, class_name = BACKENDS[backend]
    except KeyError:
        raise UnknownBackend(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}") from None
    cls: type[Executor] = getattr(importlib.import_module(module_name), class_name)
    return cls
