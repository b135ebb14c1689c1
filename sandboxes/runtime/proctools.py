"""Process and file helpers that run beside the runner: in the parent for the host backend, and inside
the sandbox (as a script) for backends that reach it only through commands (E2B).

One copy of each, so a fix reaches every backend:

- `kill_process_tree`: the runner is a subreaper (``--subreaper``), so everything the code started,
  `setsid` children and double forks included, is in its process tree; the tree is frozen first (a
  stopped process cannot fork, so a fork bomb cannot outrun the kill), then killed.
- `open_beneath`: open a file below a directory without following a symlink on any component, so code
  still running in the sandbox cannot win a race by swapping a directory for a link.

As a script (standard library only; exit 2: no such file, 3: refused)::

    python3 -I proctools.py launch RUNNER        # own process group, then exec the runner (same pid)
    python3 -I proctools.py kill-tree PID
    python3 -I proctools.py place SOURCE ROOT RELATIVE   # copy SOURCE to ROOT/RELATIVE, then remove it
    python3 -I proctools.py fetch ROOT RELATIVE TARGET [LIMIT]   # copy at most LIMIT bytes to TARGET
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys

EXIT_MISSING = 2
EXIT_REFUSED = 3


class BeneathError(Exception):
    """`open_beneath` could not open the file; `missing` tells a missing file from a refused one."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def open_beneath(root: str, path: str, flags: int, uid: int | None = None) -> int:
    """Open the regular file `path` below `root` without following a symlink anywhere on the way.

    Each component is opened with O_NOFOLLOW relative to its parent's descriptor. Missing directories
    are created when `flags` has O_CREAT (owned by `uid` when given). FIFOs and devices are refused
    without blocking. Returns a blocking descriptor; raises `BeneathError`.
    """
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise BeneathError(f"{path!r} is outside the working directory")
    directory_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, directory_flags, dir_fd=fd)
            except FileNotFoundError:
                if not flags & os.O_CREAT:
                    raise BeneathError(f"no file {path!r} in the working directory", missing=True) from None
                with contextlib.suppress(FileExistsError):  # lost a race: the open below decides
                    os.mkdir(part, 0o755, dir_fd=fd)
                if uid is not None:
                    os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                child = os.open(part, directory_flags, dir_fd=fd)
            except OSError as exc:  # ELOOP / ENOTDIR: a symlink or a file where a directory should be
                raise BeneathError(
                    f"{path!r}: {part!r} is not a directory of the working directory (a symlink?); "
                    f"refused ({exc.strerror})"
                ) from None
            os.close(fd)
            fd = child
        try:
            opened = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=fd)
        except FileNotFoundError:
            raise BeneathError(f"no file {path!r} in the working directory", missing=True) from None
        except IsADirectoryError:
            raise BeneathError(f"{path!r} is a directory, not a file") from None
        except OSError as exc:
            raise BeneathError(
                f"{path!r} is not a regular file of the working directory (a symlink?); refused ({exc.strerror})"
            ) from None
    finally:
        os.close(fd)
    info = os.fstat(opened)
    if not stat.S_ISREG(info.st_mode):
        os.close(opened)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise BeneathError(f"{path!r} is {kind}; refused")
    os.set_blocking(opened, True)
    return opened


def signal_group(group: int, sig: int) -> None:
    """Signal a process group; a group that is gone (or not ours) is no error."""
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_process(pid: int, sig: int) -> None:
    """Signal one process; a process that is gone (or not ours) is no error."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(root: int) -> dict[int, int]:
    """Live (non-zombie) descendants of `root`, from /proc: pid -> process group."""
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            groups[pid] = int(fields[2])
        except (OSError, IndexError, ValueError):
            continue
    found: dict[int, int] = {}
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found[pid] = groups[pid]
            stack.extend(children.get(pid, ()))
    return found


def kill_process_tree(root: int, include_root: bool = False) -> None:
    """SIGKILL every descendant of `root` (and `root` itself with `include_root`): freeze, then kill."""
    if not os.path.isdir("/proc"):
        return
    signal_group(
        root, signal.SIGSTOP
    )  # most of a fork bomb is still in the runner's group: freeze it at once
    if include_root:
        signal_process(root, signal.SIGSTOP)
    stopped: set[int] = set()
    own_group = os.getpgrp()
    for _ in range(200):
        found = descendants(root)
        fresh = set(found) - stopped
        if not fresh:
            break
        # Whole groups first (a `setsid` shell bomb is one group), then the stragglers.
        for group in {found[pid] for pid in fresh} - {own_group, 0, 1}:
            signal_group(group, signal.SIGSTOP)
        for pid in fresh:
            signal_process(pid, signal.SIGSTOP)
        stopped |= fresh
    for _ in range(20):
        found = descendants(root)
        if not found:
            break
        for group in set(found.values()) - {own_group, 0, 1}:
            signal_group(group, signal.SIGKILL)
        for pid in found:
            signal_process(pid, signal.SIGKILL)
    if include_root:
        signal_process(root, signal.SIGKILL)
        if root != own_group:
            signal_group(root, signal.SIGKILL)


def _copy(source: int, target: int, limit: int | None = None) -> None:
    """Copy until end-of-file, or `limit` bytes (a file that grows while it is copied is cut there)."""
    left = limit
    while chunk := os.read(source, 1 << 20 if left is None else min(1 << 20, left)):
        if left is not None:
            left -= len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view) :]


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "launch":  # become a process-group leader so a kill reaches all the code started
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        runner = os.path.expanduser(args[0])
        os.execv(sys.executable, [sys.executable, "-I", runner, "--subreaper"])
    if command == "kill-tree":
        kill_process_tree(int(args[0]), include_root=True)
        return 0
    try:
        if command == "place":
            source, root, relative = args
            target = open_beneath(root, relative, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with open(source, "rb") as staged:
                try:
                    _copy(staged.fileno(), target)
                finally:
                    os.close(target)
            os.unlink(source)
            return 0
        if command == "fetch":
            root, relative, target_path, *limit = args
            opened = open_beneath(root, relative, os.O_RDONLY)
            try:
                with open(target_path, "wb") as copy:
                    _copy(opened, copy.fileno(), int(limit[0]) if limit else None)
            finally:
                os.close(opened)
            return 0
    except BeneathError as exc:
        print(exc, file=sys.stderr)
        return EXIT_MISSING if exc.missing else EXIT_REFUSED
    print(f"usage: proctools.py launch|kill-tree|place|fetch ..., not {command!r}", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
