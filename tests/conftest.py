"""Shared fixtures. The conformance suite runs once per available backend.

Each backend has a module `tests/backend_<name>.py` with two functions:

    def unavailable() -> str | None      # None when usable here, else the reason (and how to enable it)
    def make_executor(**options) -> Executor   # an unopened executor with the given common options

`executor_factory` is parametrised over every such module; a backend that is unavailable is skipped
with its reason, except under CI (CI=true), where an unavailable backend that CI is meant to run
fails instead of hiding behind a skip.
"""

from __future__ import annotations

import importlib
import os
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TESTS = pathlib.Path(__file__).parent
BACKEND_NAMES = sorted(p.stem.removeprefix("backend_") for p in TESTS.glob("backend_*.py"))
REQUIRED_IN_CI = {"host", "docker", "e2b", "ray"}


def backend_module(name: str) -> Any:
    return importlib.import_module(f"backend_{name}")


@pytest.fixture(params=BACKEND_NAMES)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    reason = backend_module(name).unavailable()
    if reason:
        if os.environ.get("CI") == "true" and name in REQUIRED_IN_CI:
            pytest.fail(f"backend {name!r} must run in CI but is unavailable: {reason}")
        pytest.skip(reason)
    return name


@pytest.fixture
def executor_factory(backend: str) -> Callable[..., Any]:
    """Make unopened executors of the current backend: `executor_factory(timeout=5, ...)`."""
    module = backend_module(backend)

    def make(**options: Any) -> Any:
        return module.make_executor(**options)

    return make


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
