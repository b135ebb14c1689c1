"""The version has one source (pyproject.toml) and CHANGELOG.md's newest release names it."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import kodeagent
import sandboxes

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2})$", re.M)


def pyproject_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_newest_release_in_the_changelog_is_the_package_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = RELEASE.findall(changelog)
    assert releases, "CHANGELOG.md has no released section (## [X.Y.Z] - YYYY-MM-DD)"
    assert releases[0][0] == pyproject_version(), (
        f"CHANGELOG.md's newest release is {releases[0][0]}, pyproject.toml says {pyproject_version()}: "
        "release both together (the '## [Unreleased]' heading and pyproject's version line)"
    )
    dates = [date for _, date in releases]
    assert dates == sorted(dates, reverse=True), "releases are listed newest first"
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{releases[0][0]}]")


def test_both_packages_report_the_installed_version() -> None:
    installed = metadata.version("kodeagent")
    assert kodeagent.__version__ == sandboxes.__version__ == installed
    assert installed == pyproject_version(), (
        f"the installed metadata says {installed}, pyproject.toml {pyproject_version()}: "
        "reinstall (pip install -e .) after changing the version"
    )
