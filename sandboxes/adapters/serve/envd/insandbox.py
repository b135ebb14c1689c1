"""The file operations envd performs *inside* a session, as the session's own code (standard library
only; its source is sent and run in a fresh namespace, never imported there).

Running them in the session puts them behind the session's OS boundary (its namespaces or container,
its user, its mounts): whatever this code is tricked into touching, the sandbox could touch anyway.
Within that, it keeps to the working directory: every path is resolved with symlinks, and one that
leaves the directory is refused. The sandbox may have replaced any of this (its code controls its own
interpreter), so the parent trusts nothing it answers: it validates every field it uses.

`main(request)` answers ``{"ok": value}`` or ``{"error": code, "message": text}``, code a Connect code.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import stat
import subprocess
from typing import Any


class _Refused(Exception):
    code = "invalid_argument"


class _Missing(Exception):
    code = "not_found"


class _Exists(Exception):
    code = "already_exists"


def _root() -> str:
    return os.path.realpath(os.getcwd())


def _inside(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip("/") + "/")


def _locate(relative: str, follow: bool) -> str:
    """The path of `relative` below the working directory: its parent resolved (and inside), and with
    `follow` the whole path resolved (and inside)."""
    root = _root()
    if relative in ("", "."):
        return root
    full = os.path.join(root, relative)
    parent = os.path.realpath(os.path.dirname(full))
    if not _inside(root, parent):
        raise _Refused(f"{relative!r} resolves outside the home directory (through a symlink)")
    path = os.path.join(parent, os.path.basename(full))
    if follow:
        real = os.path.realpath(path)
        if not _inside(root, real):
            raise _Refused(f"{relative!r} resolves outside the home directory (through a symlink)")
        return real
    return path


def _relative(path: str) -> str:
    root = _root()
    return "" if path == root else os.path.relpath(path, root)


def _name(lookup: Any, ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except (KeyError, OverflowError):
        return str(ident)


def _entry(path: str) -> dict[str, Any]:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise _Missing(f"{_relative(path)!r} does not exist") from None
    kind = "file" if stat.S_ISREG(info.st_mode) else "directory" if stat.S_ISDIR(info.st_mode) else "other"
    target = None
    if stat.S_ISLNK(info.st_mode):
        kind = "symlink"
        target = os.readlink(path)
        try:  # E2B reports a symlink by what it points to, with its target
            followed = os.stat(path)
            kind = (
                "file"
                if stat.S_ISREG(followed.st_mode)
                else "directory"
                if stat.S_ISDIR(followed.st_mode)
                else "symlink"
            )
        except OSError:
            pass
    return {
        "name": os.path.basename(path) if path != _root() else "",
        "kind": kind,
        "path": _relative(path),
        "size": info.st_size,
        "mode": stat.S_IMODE(info.st_mode),
        "permissions": stat.filemode(info.st_mode),
        "owner": _name(pwd.getpwuid, info.st_uid),
        "group": _name(grp.getgrgid, info.st_gid),
        "mtime": info.st_mtime,
        "symlink": target,
    }


def _stat(request: dict[str, Any]) -> Any:
    return _entry(_locate(request["path"], follow=bool(request.get("follow"))))


def _list(request: dict[str, Any]) -> Any:
    top = _locate(request["path"], follow=True)
    if not os.path.isdir(top):
        if not os.path.lexists(top):
            raise _Missing(f"{request['path']!r} does not exist")
        raise _Refused(f"{request['path']!r} is not a directory")
    depth, cap = int(request["depth"]), int(request["cap"])
    entries: list[dict[str, Any]] = []
    level = [top]
    for _ in range(depth):
        below = []
        for directory in level:
            for name in sorted(os.listdir(directory)):
                path = os.path.join(directory, name)
                entries.append(_entry(path))
                if len(entries) > cap:
                    raise OverflowError
                if os.path.isdir(path) and not os.path.islink(path):
                    below.append(path)
        level = below
    return entries


def _mkdir(request: dict[str, Any]) -> Any:
    path = _locate(request["path"], follow=False)
    if os.path.lexists(path):
        raise _Exists(f"{request['path']!r} already exists")
    os.makedirs(_locate(request["path"], follow=True))
    return _entry(path)


def _move(request: dict[str, Any]) -> Any:
    source = _locate(request["source"], follow=False)
    destination = _locate(request["destination"], follow=False)
    if not os.path.lexists(source):
        raise _Missing(f"{request['source']!r} does not exist")
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    os.rename(source, destination)
    return _entry(destination)


def _remove(request: dict[str, Any]) -> Any:
    path = _locate(request["path"], follow=False)
    if path == _root():
        raise _Refused("the home directory itself cannot be removed")
    if not os.path.lexists(path):
        raise _Missing(f"{request['path']!r} does not exist")
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return None


def _run(request: dict[str, Any]) -> Any:
    """Run a command to its end with the session's stdout/stderr (so its output streams as the run's),
    killing its whole process group at `timeout` seconds; answers its exit code, or None at the timeout."""
    cwd = _locate(request["cwd"], follow=True)
    env = {**os.environ, **request["envs"]}
    try:
        child = subprocess.Popen(
            request["argv"], cwd=cwd, env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )
    except OSError as exc:
        return {"spawned": False, "message": f"{type(exc).__name__}: {exc.strerror or exc}"}
    try:
        code = child.wait(timeout=request["timeout"])
    except subprocess.TimeoutExpired:
        code = None
    except BaseException:  # the run is cancelled (the client left): the command goes with it
        os.killpg(child.pid, signal.SIGKILL)
        raise
    try:
        os.killpg(child.pid, signal.SIGKILL)  # what it left running in its group ends with it
    except ProcessLookupError:
        pass
    if code is None:
        child.wait()
    return {"spawned": True, "exit_code": code}


_OPERATIONS = {"stat": _stat, "list": _list, "mkdir": _mkdir, "move": _move, "remove": _remove, "run": _run}


def main(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": _OPERATIONS[request["op"]](request)}
    except (_Refused, _Missing, _Exists) as exc:
        return {"error": exc.code, "message": str(exc)}
    except OverflowError:
        return {"error": "resource_exhausted", "message": f"more than {request.get('cap')} entries"}
    except PermissionError as exc:
        return {"error": "permission_denied", "message": f"{exc.strerror}: {request.get('path', '')!r}"}
    except FileExistsError:
        return {"error": "already_exists", "message": "the destination already exists"}
    except NotADirectoryError:
        return {"error": "invalid_argument", "message": "a component of the path is not a directory"}
    except OSError as exc:
        return {"error": "internal", "message": f"{type(exc).__name__}: {exc.strerror or exc}"}
