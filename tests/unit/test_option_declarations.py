"""Each backend's options are declared once: the TypedDict `open_executor` is typed with names exactly
what the executor takes; Docker's container options are `ContainerSettings`' fields (same names and
types, defaults only there) and the executor copies none by hand; a bad option is a clear error."""

from __future__ import annotations

import inspect
from typing import Any, get_type_hints

import pytest

from sandboxes import Limits, Policy, UnknownBackend
from sandboxes.backends import BACKEND_NAMES, backend_name, executor_class
from sandboxes.backends.docker import ContainerOptions, ContainerSettings, DockerExecutor, DockerOptions
from sandboxes.backends.e2b import E2BOptions
from sandboxes.backends.host import HostOptions
from sandboxes.backends.ray import RayOptions
from sandboxes.executor import COMMON_OPTIONS

TYPED = {"host": HostOptions, "docker": DockerOptions, "e2b": E2BOptions, "ray": RayOptions}


def _keywords(backend: str) -> set[str]:
    """The options the executor's signature names, with the common ones its ``**options`` takes."""
    parameters = inspect.signature(executor_class(backend).__init__).parameters.values()
    named = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return named | COMMON_OPTIONS


@pytest.mark.parametrize("backend", ["host", "e2b"])
def test_the_typed_options_are_what_the_executor_takes(backend: str) -> None:
    assert set(TYPED[backend].__annotations__) == _keywords(backend)


def test_every_backend_has_typed_options_with_the_common_ones() -> None:
    assert set(TYPED) == set(BACKEND_NAMES)
    for typed in TYPED.values():
        assert COMMON_OPTIONS <= set(typed.__annotations__)


def test_ray_offers_its_own_options_and_the_node_backends() -> None:
    node = (set(HostOptions.__annotations__) | set(DockerOptions.__annotations__)) - COMMON_OPTIONS
    assert set(RayOptions.__annotations__) == _keywords("ray") | node


def test_container_options_are_the_settings_fields_of_the_same_names_and_types() -> None:
    typed = get_type_hints(ContainerOptions)
    fields = ContainerSettings.model_fields
    assert set(typed) <= set(fields)
    for name, annotation in typed.items():
        assert fields[name].annotation == annotation, name
    # the rest come from the common options, never from the caller directly
    assert set(fields) - set(typed) == {"memory_mb", "network", "host_workdir", "preload"}


def test_the_executor_takes_the_settings_defaults_and_each_option_given() -> None:
    defaults = DockerExecutor().settings
    assert defaults == ContainerSettings(pids_limit=defaults.pids_limit)  # every other default is the model's
    chosen: dict[str, Any] = {
        "image": "img:tag",
        "cpus": 2.5,
        "pids_limit": 40,
        "read_only": False,
        "tmp_mb": 8,
        "user": "1234:1234",
        "drop_capabilities": False,
        "no_new_privileges": False,
        "open_files": 64,
        "file_size_mb": 3,
    }
    assert set(chosen) == set(ContainerOptions.__annotations__) - {"sessions_per_container"}
    settings = DockerExecutor(**chosen).settings
    assert {name: getattr(settings, name) for name in chosen} == chosen
    limited = DockerExecutor(policy=Policy(limits=Limits(memory_mb=300, max_processes=9))).settings
    assert limited.memory_mb == 300 and limited.pids_limit == 10  # the policy's, plus one for the init
    assert DockerExecutor(sessions_per_container=3).settings.shared


def test_a_bad_container_option_names_the_option_its_value_and_the_bound() -> None:
    with pytest.raises(ValueError, match=r"cpus=-1: Input should be greater than 0"):
        DockerExecutor(cpus=-1)
    with pytest.raises(ValueError, match=r"sessions_per_container=0: .*greater than or equal to 1"):
        DockerExecutor(sessions_per_container=0)


def test_an_unknown_docker_option_lists_what_it_takes_and_where_memory_goes() -> None:
    with pytest.raises(TypeError) as refused:
        DockerExecutor(memory_mb=512)  # type: ignore[call-arg]
    message = str(refused.value)
    assert "memory_mb" in message and "Limits(memory_mb=" in message and "pids_limit" in message


def test_backend_name_checks_a_name_known_at_run_time() -> None:
    assert [backend_name(str(name)) for name in BACKEND_NAMES] == list(BACKEND_NAMES)
    with pytest.raises(UnknownBackend, match="podman.*host, docker, e2b, ray"):
        backend_name("podman")
