"""The files a run wrote: the working directory before and after it (loaded by `runner.py` as
``_kodeagent_artifacts``; stdlib only). Symlinks are never followed, and the scan stops at
`MAX_ARTIFACT_SCAN` files, so a directory the code filled costs the runner a bounded walk."""

from __future__ import annotations

import os
from typing import Any

MAX_ARTIFACT_SCAN = 5000

Snapshot = dict[str, tuple[int, int]]
"""Path (relative to the working directory) -> (size, mtime in ns)."""


def snapshot(root: str) -> Snapshot:
    """Regular files under `root` (symlinks are never followed): path -> (size, mtime)."""
    found: Snapshot = {}
    stack = [root]
    while stack and len(found) < MAX_ARTIFACT_SCAN:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    found[os.path.relpath(entry.path, root)] = (info.st_size, info.st_mtime_ns)
            except OSError:
                continue
    return found


def changed_files(before: Snapshot, after: Snapshot) -> list[dict[str, Any]]:
    """The files of `after` that are new or changed since `before`, by path, with their sizes."""
    return [
        {"path": path, "size": stat[0]} for path, stat in sorted(after.items()) if before.get(path) != stat
    ]
