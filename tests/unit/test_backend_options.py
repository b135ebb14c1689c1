"""Backend options are checked when the executor is made, before anything starts (no cluster, no
sandbox, no stand-in: what is refused here never reached one)."""

from __future__ import annotations

import importlib.util

import pytest
from support.needs import require

from sandboxes import BackendUnavailable


def _e2b_sdk() -> None:
    missing = importlib.util.find_spec("e2b") is None
    require("the e2b SDK is not installed: pip install 'kodeagent[e2b]'" if missing else None, "this test")


def test_ray_node_options_are_checked_when_the_executor_is_made() -> None:
    from sandboxes.backends.ray import RayExecutor

    with pytest.raises(TypeError, match="isolaton"):
        RayExecutor(node_backend="host", isolaton="process")
    with pytest.raises(ValueError, match="node_backend"):
        RayExecutor(node_backend="e2b")


@pytest.mark.e2b  # the e2b SDK must be installed for its executor to be made
def test_e2b_pip_options_are_refused_before_anything_starts() -> None:
    from sandboxes.backends.e2b import E2BExecutor

    _e2b_sdk()
    with pytest.raises(ValueError, match="requirement specifier"):
        E2BExecutor(api_key="e2b_unit", pip_packages=["--index-url=http://example.invalid/simple", "pandas"])
    with pytest.raises(TypeError):
        E2BExecutor(api_key="e2b_unit", pip_packages="pandas")


@pytest.mark.e2b
def test_e2b_missing_api_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxes.backends.e2b import E2BExecutor

    _e2b_sdk()
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(BackendUnavailable, match="E2B_API_KEY"):
        E2BExecutor()
