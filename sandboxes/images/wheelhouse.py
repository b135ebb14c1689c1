"""The wheelhouse: Python packages for images, downloaded by pip on the host (containers here cannot
verify the package index's TLS), so that image builds run without network."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .common import WHEELHOUSE, ImageBuildError, Progress


def pinned_requirements(path: Path) -> list[tuple[str, str]]:
    """(normalised name, version) of each `name==version` line; other lines are refused."""
    pins: list[tuple[str, str]] = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+!\-]+)", line)
        if not match:
            raise ImageBuildError(f"{path}: {raw!r} is not pinned as name==version; pin every requirement")
        pins.append((_normalise(match[1]), match[2]))
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(directory: Path, name: str, version: str | None) -> Path | None:
    for wheel in sorted(directory.glob("*.whl")):
        parts = wheel.name.split("-")
        if _normalise(parts[0]) == name and (version is None or parts[1] == version):
            return wheel
    return None


def fill_wheelhouse(requirements: Path, python: str, progress: Progress = print) -> list[Path]:
    """The wheels for `requirements` (and pip) for CPython `python` ("3.11"), downloaded on the host if missing.

    Runs `pip download` only when some pinned wheel is absent, so a filled wheelhouse works offline.
    """
    directory = WHEELHOUSE / f"cp{python.replace('.', '')}"
    directory.mkdir(parents=True, exist_ok=True)
    pins = pinned_requirements(requirements)

    def present() -> list[Path] | None:
        found = [_find_wheel(directory, name, version) for name, version in pins]
        found.append(_find_wheel(directory, "pip", None))
        return None if any(w is None for w in found) else [w for w in found if w is not None]

    wheels = present()
    if wheels is not None:
        return wheels
    progress(f"downloading wheels for CPython {python} into {directory}")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(directory),
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python,
        "--platform",
        "manylinux2014_x86_64",
        "--platform",
        "manylinux_2_17_x86_64",
        "--platform",
        "manylinux_2_28_x86_64",
        "--platform",
        "linux_x86_64",
        "-r",
        str(requirements),
        "pip",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageBuildError(
            f"pip download failed (is PyPI reachable from this host?):\n{done.stderr[-2000:]}\n"
            f"or put the wheels by hand into {directory}"
        )
    wheels = present()
    if wheels is None:
        raise ImageBuildError(
            f"pip download did not produce every pinned wheel of {requirements} in {directory}"
        )
    return wheels
