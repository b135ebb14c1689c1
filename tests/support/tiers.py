"""The backends the suite runs on, and the markers that say what a test needs and what it costs.

Each backend has a module `tests/support/backend_<name>.py` (see `tests/conftest.py`). A backend
that needs a piece beyond this machine's processes carries that piece's marker, so each tier runs
alone (`-m docker`, `-m "not docker and not ray and not e2b"`); host and hostprocess need none.
dockershared is the docker backend in its shared-container mode: the same daemon, the same marker.

`hostprocess` is the host backend at its process isolation level: the contracts hold there too, but
the quick developer loop (`-m "not slow ..."`) covers them once, on `host`, so its parameters are
also `slow`.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

SUPPORT = pathlib.Path(__file__).parent
BACKEND_NAMES = sorted(p.stem.removeprefix("backend_") for p in SUPPORT.glob("backend_*.py"))
REQUIRED_IN_CI = {"host", "docker", "dockershared", "e2b", "ray"}

BACKEND_MARKS: dict[str, list[Any]] = {
    "docker": [pytest.mark.docker],
    "dockershared": [pytest.mark.docker],
    "e2b": [pytest.mark.e2b],
    "ray": [pytest.mark.ray],
    "hostprocess": [pytest.mark.slow],
}


def backend_param(name: str, *values: Any, id: str | None = None) -> Any:
    """A backend name (and more values of the same case) as a test parameter, with its markers."""
    return pytest.param(name, *values, marks=BACKEND_MARKS.get(name, []), id=id)
