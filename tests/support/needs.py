"""The one rule for tests that need something this machine may lack (Docker, bubblewrap, Ray, a
model): outside CI they skip with the reason and the fix; under CI (`CI=true`), where `.ci/run`
installs everything, a missing piece fails the test instead of hiding behind a skip."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    """True when the suite runs under CI, where every optional part must be present."""
    return os.environ.get("CI") == "true"


def require(reason: str | None, what: str = "this test") -> None:
    """Do nothing when `reason` is None; else skip (outside CI) or fail (in CI) with it."""
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"{what} must run in CI but cannot: {reason}")
    pytest.skip(reason)
