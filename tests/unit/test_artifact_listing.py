"""The working directory's stamp (`runtime/artifacts.py`): kept only where its change time vouches
for the directory (its last change far enough back that a later one cannot share its time), and
broken by any entry made or removed since. On real directories, in this process."""

from __future__ import annotations

import os
import pathlib
import time

import pytest

from sandboxes.runtime import artifacts


def test_a_directory_changed_within_the_quiet_time_gets_no_stamp(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "QUIET_NS", 3600 * 10**9)  # every change is recent
    assert artifacts.empty_stamp(str(tmp_path)) is None
    monkeypatch.setattr(artifacts, "QUIET_NS", 0)
    assert artifacts.empty_stamp(str(tmp_path)) is not None


def test_an_entry_made_or_removed_since_the_stamp_breaks_it(tmp_path: pathlib.Path) -> None:
    time.sleep(2 * artifacts.QUIET_NS / 1e9)
    stamp = artifacts.empty_stamp(str(tmp_path))
    assert stamp is not None
    assert artifacts.scan(str(tmp_path)) == ({}, True)
    assert artifacts.unchanged(str(tmp_path), stamp)
    (tmp_path / "made").write_text("x")
    os.remove(tmp_path / "made")
    assert not artifacts.unchanged(str(tmp_path), stamp)  # empty again, but changed


def test_a_directory_holding_only_an_empty_one_is_not_bare(tmp_path: pathlib.Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to("/")
    assert artifacts.scan(str(tmp_path)) == ({}, False)
    (tmp_path / "sub" / "f").write_text("abc")
    assert artifacts.scan(str(tmp_path)) == (
        {os.path.join("sub", "f"): (3, os.stat(tmp_path / "sub" / "f").st_mtime_ns)},
        False,
    )
