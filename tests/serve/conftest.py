"""Fixtures of the `kodeagent serve` tests: `served` is a real server on loopback (uvicorn, the host
backend) with two tenants, alice and bob; `serve_with(**settings)` starts one with other settings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from support.served import Served, serving


@pytest.fixture
def served() -> Iterator[Served]:
    with serving() as server:
        yield server


@pytest.fixture
def serve_with() -> Iterator[Callable[..., Served]]:
    with ExitStack() as stack:

        def start(**settings: Any) -> Served:
            return stack.enter_context(serving(**settings))

        yield start
