"""Type-checked, never run: `scripts/check` runs mypy on this file. Each line marked
``# type: ignore[...]`` must be a type error (mypy's ``warn_unused_ignores`` fails the check when one
is not), so a wrong option to `open_executor` or a backend's executor is proved refused; the
`assert_type` lines prove each backend's name gives its own executor class."""

from __future__ import annotations

from typing import Any, assert_type

from sandboxes import Policy, open_executor
from sandboxes.backends import BackendName, backend_name
from sandboxes.backends.docker import DockerExecutor
from sandboxes.backends.e2b import E2BExecutor
from sandboxes.backends.host import HostExecutor
from sandboxes.backends.ray import RayExecutor
from sandboxes.executor import Executor


def each_backend_gives_its_own_class() -> None:
    assert_type(open_executor(), HostExecutor)
    assert_type(open_executor("host", isolation="process", timeout=5, policy=Policy()), HostExecutor)
    assert_type(open_executor("docker", image="x", cpus=2.0, sessions_per_container=4), DockerExecutor)
    assert_type(open_executor("e2b", template="base", pip_packages=["pandas"]), E2BExecutor)
    assert_type(open_executor("ray", node_backend="docker", image="x", isolation="auto"), RayExecutor)


def wrong_options_are_type_errors() -> None:
    open_executor("host", image="x")  # type: ignore[call-overload]
    open_executor("host", isolation="bubble")  # type: ignore[call-overload]
    open_executor("host", timeout="10")  # type: ignore[call-overload]
    open_executor("docker", memory_mb=512)  # type: ignore[call-overload]
    open_executor("docker", cpus="2")  # type: ignore[call-overload]
    open_executor("docker", isolation="process")  # type: ignore[call-overload]
    open_executor("e2b", sandbox_timeout=1.5)  # type: ignore[call-overload]
    open_executor("ray", node_backend="e2b")  # type: ignore[call-overload]
    open_executor("podman")  # type: ignore[call-overload]
    DockerExecutor(memmory=1)  # type: ignore[call-arg]
    DockerExecutor(read_only="yes")  # type: ignore[arg-type]
    HostExecutor(image="x")  # type: ignore[call-arg]


def a_name_known_at_run_time(name: str, options: dict[str, Any]) -> None:
    open_executor(name, **options)  # type: ignore[call-overload]
    checked: BackendName = backend_name(name)
    assert_type(
        open_executor(checked, timeout=5, **options),
        HostExecutor | DockerExecutor | E2BExecutor | RayExecutor,
    )
    opened: Executor = open_executor(checked)
    del opened
