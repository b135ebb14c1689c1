"""The frame-attribute denylist is one list: the static check, the attribute guard and the audit hook's
check of generated code refuse the same names among every attribute of frames, code, tracebacks,
generators, coroutines and classes, so a name added to (or dropped from) one layer alone fails here."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from sandboxes import Policy
from sandboxes.runtime import RUNTIME_DIR


def runtime_module(name: str) -> Any:
    """A runtime module as the runner loads it: by path, under its private name (`siblings.py`)."""
    if "_kodeagent_siblings" not in sys.modules:
        spec = importlib.util.spec_from_file_location("_kodeagent_siblings", RUNTIME_DIR / "siblings.py")
        assert spec and spec.loader
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules["_kodeagent_siblings"].load(name)


guard = runtime_module("guard")
audit = runtime_module("audit")


def _internals() -> list[object]:
    """One live object of each kind whose attributes lead to interpreter internals."""

    def generator() -> Any:
        yield

    async def coroutine() -> None:
        pass

    async def async_generator() -> Any:
        yield

    try:
        raise ValueError
    except ValueError as exc:
        traceback = exc.__traceback__
    coro = coroutine()
    objects = [sys._getframe(), generator.__code__, traceback, generator(), coro, async_generator(), int]
    coro.close()
    return objects


PLAIN = ("value", "append", "items", "real", "name", "f_value", "co_name_", "gi", "mro_")
CANDIDATES = sorted(
    {name for obj in _internals() for name in dir(obj) if not name.startswith("__")}
    | set(guard.FRAME_ATTRIBUTES)
    | set(PLAIN)
)


class Plain:
    """An ordinary value of the code's own: what the attribute guard checks a read on."""


def guard_refuses(name: str) -> bool:
    runtime = guard.Guard((), (), (), __import__)
    try:
        runtime.check_attribute(Plain(), name)
    except guard.PolicyViolation:
        return True
    return False


def audit_refuses(name: str) -> bool:
    return audit.check_generated_source(f"def method(self):\n    return self.{name}\n") is not None


def static_check_refuses(name: str) -> bool:
    return Policy().check(f"value.{name}") is not None


@pytest.mark.parametrize("name", CANDIDATES)
def test_every_layer_refuses_the_same_attribute_names(name: str) -> None:
    refused = name in guard.FRAME_ATTRIBUTES
    assert guard_refuses(name) is refused, name
    assert audit_refuses(name) is refused, name
    assert static_check_refuses(name) is refused, name


def test_the_names_cover_every_kind_of_internal_object() -> None:
    refused = {name for name in CANDIDATES if audit_refuses(name)}
    assert {
        "tb_frame",
        "f_globals",
        "f_back",
        "co_code",
        "gi_frame",
        "cr_frame",
        "ag_frame",
        "mro",
    } <= refused
    assert not refused & set(PLAIN)
    assert {"f_lineno", "co_name", "gi_running", "tb_lineno"} <= set(CANDIDATES) - refused  # read freely
