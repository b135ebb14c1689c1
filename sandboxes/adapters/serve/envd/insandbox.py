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

import base64
import grp
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import threading
import types
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


_COMMANDS = "__kodeagent_commands__"
_WINDOW = 1024 * 1024
"""Bytes of each stream a command keeps for readers that have not read them yet; older ones are dropped."""


class _Buffer:
    """One stream of a command: what it wrote, as a window of at most `_WINDOW` bytes and its offset."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.start = 0  # the offset of data[0] in the whole stream

    def append(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > _WINDOW:
            cut = len(self.data) - _WINDOW
            del self.data[:cut]
            self.start += cut

    def read(self, offset: int, limit: int) -> tuple[bytes, int]:
        offset = max(offset, self.start)
        chunk = bytes(self.data[offset - self.start : offset - self.start + limit])
        return chunk, offset + len(chunk)

    def end(self) -> int:
        return self.start + len(self.data)


def _commands() -> dict[int, Any]:
    module = sys.modules.get(_COMMANDS)
    if module is None:
        module = types.ModuleType(_COMMANDS)
        module.table = {}  # type: ignore[attr-defined]
        sys.modules[_COMMANDS] = module
    table: dict[int, Any] = module.table
    return table


def _pump(stream: Any, buffer: _Buffer, changed: threading.Condition) -> None:
    while True:
        chunk = os.read(stream.fileno(), 65536)
        with changed:
            if chunk:
                buffer.append(chunk)
            changed.notify_all()
        if not chunk:
            return


def _spawn(request: dict[str, Any]) -> Any:
    """Start a command detached from the run: its output pumped into buffers by threads of the session,
    so it outlives this run and neither it nor a cell sees the other's output."""
    cwd = _locate(request["cwd"], follow=True)
    env = {**os.environ, **request["envs"]}
    try:
        child = subprocess.Popen(
            request["argv"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if request["stdin"] else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return {"spawned": False, "message": f"{type(exc).__name__}: {exc.strerror or exc}"}
    changed = threading.Condition()
    pumps: list[threading.Thread] = []
    entry = {"child": child, "stdout": _Buffer(), "stderr": _Buffer(), "changed": changed, "pumps": pumps}
    for name in ("stdout", "stderr"):
        pump = threading.Thread(target=_pump, args=(getattr(child, name), entry[name], changed), daemon=True)
        pump.start()
        pumps.append(pump)
    _commands()[int(request["pid"])] = entry
    return {"spawned": True}


def _entry_of(request: dict[str, Any]) -> Any:
    entry = _commands().get(int(request["pid"]))
    if entry is None:
        raise _Missing(f"no command with pid {request['pid']} in this sandbox")
    return entry


def _poll(request: dict[str, Any]) -> Any:
    """What a command wrote past the reader's offsets, waiting up to `wait` seconds for something new,
    and its exit code once it ended and its output was all read."""
    entry = _entry_of(request)
    child, changed, limit = entry["child"], entry["changed"], int(request["limit"])
    offsets = {"stdout": int(request["stdout"]), "stderr": int(request["stderr"])}

    def news() -> bool:
        done = child.poll() is not None and not any(p.is_alive() for p in entry["pumps"])
        return done or any(entry[n].end() > offsets[n] for n in offsets)

    with changed:
        changed.wait_for(news, timeout=float(request["wait"]))
        answer: dict[str, Any] = {}
        for name in offsets:
            answer[name], answer[name + "_offset"] = entry[name].read(offsets[name], limit)
        drained = all(entry[n].end() == answer[n + "_offset"] for n in offsets)
    finished = child.poll() is not None and not any(p.is_alive() for p in entry["pumps"])
    answer["exit_code"] = child.returncode if finished and drained else None
    return answer


def _signal(request: dict[str, Any]) -> Any:
    entry = _entry_of(request)
    try:
        os.killpg(entry["child"].pid, int(request["signal"]))
    except ProcessLookupError:
        pass
    return None


def _stdin(request: dict[str, Any]) -> Any:
    stdin = _entry_of(request)["child"].stdin
    if stdin is None:
        raise _Refused("the command was started without stdin")
    if request.get("close"):
        stdin.close()
    else:
        stdin.write(base64.b64decode(request["data"]))
        stdin.flush()
    return None


def _forget(request: dict[str, Any]) -> Any:
    entry = _commands().pop(int(request["pid"]), None)
    if entry is not None and entry["child"].poll() is None:
        os.killpg(entry["child"].pid, signal.SIGKILL)
    return None


def _running(request: dict[str, Any]) -> Any:
    return [pid for pid, entry in _commands().items() if entry["child"].poll() is None]


_OPERATIONS = {
    "stat": _stat,
    "list": _list,
    "mkdir": _mkdir,
    "move": _move,
    "remove": _remove,
    "spawn": _spawn,
    "poll": _poll,
    "signal": _signal,
    "stdin": _stdin,
    "forget": _forget,
    "running": _running,
}


def main(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": _OPERATIONS[request["op"]](request)}
    except (_Refused, _Missing, _Exists) as exc:
        return {"error": exc.code, "message": str(exc)}
    except OverflowError:
        return {"error": "resource_exhausted", "message": f"more than {request.get('cap')} entries"}
    except BrokenPipeError:
        return {"error": "failed_precondition", "message": "the command closed its stdin (or ended)"}
    except PermissionError as exc:
        return {"error": "permission_denied", "message": f"{exc.strerror}: {request.get('path', '')!r}"}
    except FileExistsError:
        return {"error": "already_exists", "message": "the destination already exists"}
    except NotADirectoryError:
        return {"error": "invalid_argument", "message": "a component of the path is not a directory"}
    except OSError as exc:
        return {"error": "internal", "message": f"{type(exc).__name__}: {exc.strerror or exc}"}
