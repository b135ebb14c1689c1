"""The files a run wrote: the working directory before and after it (loaded by `runner.py` as
``_kodeagent_artifacts``; stdlib only). Symlinks are never followed, and the scan stops at
`MAX_ARTIFACT_SCAN` files, so a directory the code filled costs the runner a bounded walk."""

from __future__ import annotations

import os
import time
from typing import Any

MAX_ARTIFACT_SCAN = 5000

Snapshot = dict[str, tuple[int, int]]
"""Path (relative to the working directory) -> (size, mtime in ns)."""

Stamp = tuple[int, int, int]
"""An empty working directory's device, inode and change time (ns), as a listing found it."""

QUIET_NS = 50_000_000
"""How long before a listing the directory's last change must lie for its stamp to be kept: a
change time comes from a clock that ticks (and a filesystem may store it coarser still), so a change
within one tick of the last would keep the same time; 50 ms is past both (a 100 Hz tick, the 10 ms
of the coarsest filesystems that keep sub-second times at all)."""


def snapshot(root: str) -> Snapshot:
    """Regular files under `root` (symlinks are never followed): path -> (size, mtime)."""
    return scan(root)[0]


def scan(root: str) -> tuple[Snapshot, bool]:
    """`snapshot(root)`, and whether `root` held no entry at all (not even a directory or a link)."""
    found: Snapshot = {}
    try:
        entries = list(os.scandir(root))
    except OSError:
        return found, False
    bare = not entries
    stack: list[str] = []
    while True:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    found[os.path.relpath(entry.path, root)] = (info.st_size, info.st_mtime_ns)
            except OSError:
                continue
        if not stack or len(found) >= MAX_ARTIFACT_SCAN:
            return found, bare
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            entries = []


def empty_stamp(root: str) -> Stamp | None:
    """Taken just before a listing: `root`'s stamp, to keep should the listing find it empty, or None
    when its change time cannot vouch for it (changed within `QUIET_NS`, or whole seconds only).

    An entry made in, moved into or removed from a directory (a link, a mount point's creation, an
    `utime` too) sets its change time to the clock's, which the code cannot set back; so once the
    time lies a tick behind, a directory whose stamp reads the same later has had no entry since,
    and `unchanged` answers for it without a scan."""
    now = time.time_ns()
    try:
        info = os.stat(root, follow_symlinks=False)
    except OSError:
        return None
    changed = info.st_ctime_ns
    if changed % 1_000_000_000 == 0 or changed > now - QUIET_NS:
        return None
    return info.st_dev, info.st_ino, changed


def unchanged(root: str, stamp: Stamp) -> bool:
    """Whether `root` is still the directory `stamp` was taken of, with no change since."""
    try:
        info = os.stat(root, follow_symlinks=False)
    except OSError:
        return False
    return (info.st_dev, info.st_ino, info.st_ctime_ns) == stamp


def changed_files(before: Snapshot, after: Snapshot) -> list[dict[str, Any]]:
    """The files of `after` that are new or changed since `before`, by path, with their sizes."""
    return [
        {"path": path, "size": stat[0]} for path, stat in sorted(after.items()) if before.get(path) != stat
    ]
