"""Trusted modules loaded once for every session (`HostExecutor(preload=...)`, and
`DockerExecutor(preload=...)` with shared containers): the files, checked and read once."""

from __future__ import annotations

import os
from collections.abc import Iterable


def read_preload(paths: Iterable[str | os.PathLike[str]]) -> tuple[tuple[str, bytes], ...]:
    """(module name, content) of each preload file: Python files named like modules (``name.py``);
    `ValueError` that names the file otherwise, or when it cannot be read."""
    modules = []
    for path in paths:
        name, extension = os.path.splitext(os.path.basename(os.fspath(path)))
        if extension != ".py" or not name.isidentifier():
            raise ValueError(f"preload takes Python files named like modules (name.py), not {str(path)!r}")
        try:
            with open(path, "rb") as handle:
                modules.append((name, handle.read()))
        except OSError as exc:
            raise ValueError(f"cannot read the preload file {str(path)!r}: {exc}") from exc
    return tuple(modules)
