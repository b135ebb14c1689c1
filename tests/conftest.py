"""Shared fixtures: the backends (the conformance suite runs once per available backend), the LLM
stand-in (`llm`) and a loopback TCP listener (`listener`).

Each backend has a module `tests/support/backend_<name>.py` with two functions:

    def unavailable() -> str | None      # None when usable here, else the reason (and how to enable it)
    def make_executor(**options) -> Executor   # an unopened executor with the given common options

`executor_factory` is parametrised over every such module; a backend that is unavailable is skipped
with its reason, except under CI (CI=true), where an unavailable backend that CI is meant to run
fails instead of hiding behind a skip. The backend names and their markers are in
`tests/support/tiers.py`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.listener import Listener
from support.llm_standin import StandinLLM, register_standin_models
from support.needs import require
from support.tiers import BACKEND_NAMES, REQUIRED_IN_CI, backend_param

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def backend_module(name: str) -> Any:
    return importlib.import_module(f"support.backend_{name}")


@pytest.fixture(params=[backend_param(name) for name in BACKEND_NAMES])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    reason = backend_module(name).unavailable()
    if reason and name not in REQUIRED_IN_CI:
        pytest.skip(reason)
    require(reason, f"the {name} backend")
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


@pytest.fixture
def llm() -> Iterator[StandinLLM]:
    """A fresh LLM stand-in on loopback (`tests/support/llm_standin.py`), its models registered with litellm."""
    register_standin_models()
    with StandinLLM() as server:
        yield server


@pytest.fixture
def listener() -> Iterator[Listener]:
    """A loopback TCP listener that records every connection (`tests/support/listener.py`)."""
    server = Listener()
    yield server
    server.close()
