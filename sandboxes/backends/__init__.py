"""Backends: one subpackage each (host, docker, e2b, ray). A backend is transport and isolation, nothing else.

`open_executor(name, ...)` imports the backend's module on demand, so the Docker, E2B and Ray SDKs
are imported only by those who use them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final, Literal, Unpack, get_args, overload

from ..errors import UnknownBackend
from ..executor import Executor, Snapshot

if TYPE_CHECKING:  # the backends' modules are imported on demand, never here
    from .docker import DockerExecutor, DockerOptions
    from .e2b import E2BExecutor, E2BOptions
    from .host import HostExecutor, HostOptions
    from .ray import RayExecutor, RayOptions

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


@overload
def open_executor(
    backend: Literal["host"] = "host",
    *,
    from_snapshot: Snapshot | None = None,
    **options: Unpack[HostOptions],
) -> HostExecutor: ...
@overload
def open_executor(
    backend: Literal["docker"], *, from_snapshot: Snapshot | None = None, **options: Unpack[DockerOptions]
) -> DockerExecutor: ...
@overload
def open_executor(
    backend: Literal["e2b"], *, from_snapshot: Snapshot | None = None, **options: Unpack[E2BOptions]
) -> E2BExecutor: ...
@overload
def open_executor(
    backend: Literal["ray"], *, from_snapshot: Snapshot | None = None, **options: Unpack[RayOptions]
) -> RayExecutor: ...
def open_executor(
    backend: str = "host", *, from_snapshot: Snapshot | None = None, **options: Any
) -> Executor:
    """Create the executor of `backend` ("host", "docker", "e2b" or "ray") with its options.

    Typed per backend: the options are the backend's TypedDict (`HostOptions`, `DockerOptions`,
    `E2BOptions`, `RayOptions`), so a type checker refuses an option the backend does not take and
    an editor completes them. A name known only at run time must be a `BackendName`: pass a ``str``
    through `backend_name` first; an unknown one is `UnknownBackend`.

    Use the result as an async context manager; it opens on entry and closes on exit::

        async with open_executor("host", timeout=10) as ex:
            print((await ex.run("print(1)")).stdout)

    With `from_snapshot` (from `Executor.snapshot()`), the executor opens as a fork of the snapshot
    and takes its options, so no others may be given.
    """
    if from_snapshot is not None:
        if options:
            raise TypeError(
                "open_executor(from_snapshot=...) takes the snapshot's options (policy and limits are "
                f"part of the state it copies); drop {', '.join(sorted(options))}"
            )
        if from_snapshot.backend != backend:
            raise ValueError(f"this snapshot is of the {from_snapshot.backend!r} backend, not {backend!r}")
        return from_snapshot.executor()
    return executor_class(backend)(**options)
