"""Every name the two packages export exists and is documented, and both ship `py.typed`. (What a
type checker and a fresh interpreter see: `tests/test_public_api.py`.)"""

from __future__ import annotations

import importlib
import inspect
import pathlib

import pytest


@pytest.mark.parametrize("package", ["sandboxes", "kodeagent"])
def test_every_exported_name_resolves_and_is_documented(package: str) -> None:
    module = importlib.import_module(package)
    exported = module.__all__
    assert len(exported) == len(set(exported)), "a name is exported twice"
    undocumented = []
    for name in exported:
        value = getattr(module, name)  # raises for a name in __all__ that does not exist
        if (inspect.isclass(value) or inspect.isfunction(value)) and not inspect.getdoc(value):
            undocumented.append(name)
    assert not undocumented, f"{package} exports undocumented names: {undocumented}"
    assert (pathlib.Path(module.__file__).parent / "py.typed").is_file()
