"""Backends: one subpackage each (host, docker, e2b, ray). A backend is transport and isolation, nothing else.

`open_executor(name, ...)` imports the backend's module on demand, so the Docker, E2B and Ray SDKs
are imported only by those who use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Unpack, overload

from ..executor import Executor, Snapshot
from .names import BACKEND_NAMES, BACKENDS, BackendName, backend_name, executor_class

if TYPE_CHECKING:  # the backends' modules are imported on demand, never here
    from .docker import DockerExecutor, DockerOptions
    from .e2b import E2BExecutor, E2BOptions
    from .host import HostExecutor, HostOptions
    from .ray import RayExecutor, RayOptions

__all__ = ["BACKENDS", "BACKEND_NAMES", "BackendName", "backend_name", "executor_class", "open_executor"]


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
