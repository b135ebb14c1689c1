"""envd's directory watching (`files.watch_dir`): the streaming ``WatchDir`` the async SDK calls, and
the ``CreateWatcher`` / ``GetWatcherEvents`` / ``RemoveWatcher`` trio the sync SDK polls.

Events come from the kernel (inotify), read by the server on the sandbox's home as this machine
sees it (the host's directory, or the Docker home volume where the daemon keeps it), never from the
session: the sandbox cannot forge or hide them, only cause them. The watched directory is reached from
the home one component at a time without following a symlink, so a link planted in the home cannot
point a watch outside it; the kernel then watches that directory itself (through its descriptor),
whatever is renamed around it later. A watcher belongs to its sandbox: its id means nothing to
another. Bounded: `MAX_WATCHERS` per sandbox, `MAX_QUEUED` events kept per watcher (the oldest are
dropped, as the kernel drops past its own queue), `MAX_DIRS` directories per recursive watch.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import os
import secrets
import struct
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..connect import (
    STREAM_CONTENT_TYPE,
    RpcError,
    end_of_stream,
    envelope,
    parse_single_envelope,
    read_body,
    timeout_seconds,
)
from ..errors import ServeError
from ..limits import InsideLimits
from ..metrics import home_on_this_machine
from ..paths import to_relative
from ..sandbox import Resolve, ServedSandbox

MAX_WATCHERS = 16
MAX_QUEUED = 1024
MAX_DIRS = 1024
POLL = 0.05
KEEPALIVE = 30.0
_STREAM = "stream-"  # a streaming watch's key: counted and closed with the sandbox, never reachable by id

_IN_MODIFY, _IN_ATTRIB, _IN_MOVED_FROM, _IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
_IN_CREATE, _IN_DELETE, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ONLYDIR, _IN_ISDIR = 0x4000, 0x8000, 0x01000000, 0x40000000
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")
_KINDS = (
    (_IN_CREATE | _IN_MOVED_TO, "EVENT_TYPE_CREATE"),
    (_IN_MODIFY, "EVENT_TYPE_WRITE"),
    (_IN_DELETE | _IN_DELETE_SELF, "EVENT_TYPE_REMOVE"),
    (_IN_MOVED_FROM, "EVENT_TYPE_RENAME"),
    (_IN_ATTRIB, "EVENT_TYPE_CHMOD"),
)


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


@dataclass(eq=False)
class Watcher:
    """One inotify instance over a directory of the home (and its subdirectories when recursive)."""

    fd: int
    recursive: bool
    dirs: dict[int, str] = field(default_factory=dict)  # watch descriptor -> path relative to the watched dir
    queue: deque[dict[str, str]] = field(default_factory=lambda: deque(maxlen=MAX_QUEUED))
    dropped: int = 0
    closed: bool = False
    root: int = -1  # a descriptor of the watched directory (opened without following symlinks)

    def drain(self) -> None:
        """Move what the kernel has into the bounded queue (never blocks)."""
        while not self.closed:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return
            except OSError:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
                offset += _EVENT.size + length
                self._event(wd, mask, raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape"))

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & _IN_Q_OVERFLOW:
            self.dropped += 1
            return
        if mask & _IN_IGNORED:
            self.dirs.pop(wd, None)
            return
        base = self.dirs.get(wd)
        if base is None:
            return
        relative = f"{base}/{name}" if base and name else (name or base)
        for bits, kind in _KINDS:
            if mask & bits:
                self._queue(relative, kind)
                break
        if self.recursive and mask & _IN_ISDIR and mask & (_IN_CREATE | _IN_MOVED_TO):
            self._add_tree(relative, announce=True)

    def _queue(self, name: str, kind: str) -> None:
        if len(self.queue) == MAX_QUEUED:
            self.dropped += 1
        self.queue.append({"name": name, "type": kind})

    def _add_tree(self, relative: str, *, announce: bool = False) -> None:
        """Watch `relative` (under the watched directory) and, recursively, what is below it; with
        `announce` (a directory that just appeared) what is already in it is reported as created, since
        it may have been made before the watch was in place."""
        pending = [relative]
        while pending and len(self.dirs) < MAX_DIRS:
            current = pending.pop()
            try:
                fd = _open_below(self.root, current)
            except OSError:
                continue
            try:
                wd = _add_watch(self.fd, fd)
                if wd >= 0:
                    self.dirs[wd] = current
                if self.recursive:
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            name = f"{current}/{entry.name}" if current else entry.name
                            if announce:
                                self._queue(name, "EVENT_TYPE_CREATE")
                            if entry.is_dir(follow_symlinks=False):
                                pending.append(name)
            except OSError:
                pass
            finally:
                os.close(fd)

    def take(self) -> list[dict[str, str]]:
        self.drain()
        events = list(self.queue)
        self.queue.clear()
        return events

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for fd in (self.fd, self.root):
                with contextlib.suppress(OSError):
                    os.close(fd)


def _open_below(top: int, relative: str) -> int:
    """A descriptor of the directory `relative` below the descriptor `top`, no symlink followed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.dup(top)
    try:
        for part in [p for p in relative.split("/") if p]:
            if part in (".", ".."):
                raise OSError(errno.EINVAL, "a path component is . or ..")
            next_fd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_watch(inotify: int, directory: int) -> int:
    # The kernel resolves /proc/self/fd/N to the directory that descriptor holds: the one the walk
    # opened, never what a name may point to by now.
    path = f"/proc/self/fd/{directory}".encode()
    return int(_libc().inotify_add_watch(inotify, path, _MASK | _IN_ONLYDIR))


def open_watcher(home: str, relative: str, recursive: bool) -> Watcher:
    """Start watching `relative` under `home` (a directory of this machine)."""
    libc = _libc()
    inotify = int(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
    if inotify < 0:
        raise RpcError("resource_exhausted", f"cannot watch now: {os.strerror(ctypes.get_errno())}")
    watcher = Watcher(fd=inotify, recursive=recursive)
    try:
        top = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            watcher.root = _open_below(top, relative)
        finally:
            os.close(top)
    except OSError as exc:
        watcher.close()
        if exc.errno in (errno.ENOENT,):
            raise RpcError("not_found", f"directory {relative or '.'!r} does not exist in the home") from None
        raise RpcError(
            "invalid_argument",
            f"{relative or '.'!r} is not a directory of the home (a symlink is not followed)",
        ) from None
    wd = _add_watch(inotify, watcher.root)
    if wd < 0:
        watcher.close()
        raise RpcError("resource_exhausted", f"cannot watch now: {os.strerror(ctypes.get_errno())}")
    watcher.dirs[wd] = ""
    if recursive:
        with os.scandir(watcher.root) as entries:
            subdirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        for name in subdirs:
            watcher._add_tree(name)
    return watcher


def _watchers(sandbox: ServedSandbox) -> dict[str, Watcher]:
    if sandbox.watchers is None:
        sandbox.watchers = {}
    watchers: dict[str, Watcher] = sandbox.watchers
    return watchers


async def _start(sandbox: ServedSandbox, message: dict[str, Any]) -> Watcher:
    path, recursive = message.get("path", ""), message.get("recursive", False)
    if not isinstance(path, str) or not isinstance(recursive, bool):
        raise RpcError("invalid_argument", "path is a string and recursive a boolean")
    relative = to_relative(path, sandbox.home)
    if len(_watchers(sandbox)) >= MAX_WATCHERS:
        raise RpcError("resource_exhausted", f"a sandbox has at most {MAX_WATCHERS} watchers; stop one first")
    home = await home_on_this_machine(sandbox)
    if home is None:
        raise RpcError(
            "unavailable", "this sandbox's home cannot be watched from this machine now; try again"
        )
    return await anyio.to_thread.run_sync(open_watcher, home, relative, recursive)


def close_all(sandbox: ServedSandbox) -> None:
    """End every watcher of a sandbox that ends (their streams then end too)."""
    for watcher in _watchers(sandbox).values():
        watcher.close()
    _watchers(sandbox).clear()


async def handle(method: str, message: dict[str, Any], sandbox: ServedSandbox) -> dict[str, Any]:
    """The unary trio."""
    watchers = _watchers(sandbox)
    if method == "CreateWatcher":
        watcher = await _start(sandbox, message)
        if len(watchers) >= MAX_WATCHERS:  # another request took the last place meanwhile
            watcher.close()
            raise RpcError(
                "resource_exhausted", f"a sandbox has at most {MAX_WATCHERS} watchers; stop one first"
            )
        watcher_id = secrets.token_hex(8)
        watchers[watcher_id] = watcher
        return {"watcherId": watcher_id}
    given = message.get("watcherId", message.get("watcher_id"))
    key = given if isinstance(given, str) and not given.startswith(_STREAM) else ""
    found = watchers.get(key)
    if found is None:
        raise RpcError("not_found", "no such watcher in this sandbox")
    if method == "GetWatcherEvents":
        return {"events": found.take()}
    found.close()
    watchers.pop(key, None)
    return {}


async def stream(request: Request, resolve: Resolve, caps: InsideLimits) -> Response:
    """``WatchDir``: a start event, then events as they happen, keepalives while quiet."""
    arrived = time.monotonic()
    try:
        sandbox = await resolve(request)
        if not request.headers.get("content-type", "").startswith(STREAM_CONTENT_TYPE):
            raise RpcError("invalid_argument", f"filesystem.Filesystem/WatchDir is {STREAM_CONTENT_TYPE}")
        message = parse_single_envelope(await read_body(request, caps.max_rpc_bytes))
        deadline = timeout_seconds(request.headers.get("connect-timeout-ms"))
        watchers = _watchers(sandbox)
        watcher = await _start(sandbox, message)
        if len(watchers) >= MAX_WATCHERS:
            watcher.close()
            raise RpcError(
                "resource_exhausted", f"a sandbox has at most {MAX_WATCHERS} watchers; stop one first"
            )
    except ServeError as exc:
        return Response(end_of_stream(RpcError.of(exc)), media_type=STREAM_CONTENT_TYPE)
    key = f"{_STREAM}{secrets.token_hex(8)}"
    watchers[key] = watcher  # counted and closed with the sandbox, never reachable by id
    expires = float("inf") if not deadline else arrived + deadline

    async def events() -> AsyncIterator[bytes]:
        try:
            yield envelope({"start": {}})
            quiet_since = time.monotonic()
            while not watcher.closed and time.monotonic() < expires:
                for event in watcher.take():
                    quiet_since = time.monotonic()
                    yield envelope({"filesystem": event})
                if time.monotonic() - quiet_since > KEEPALIVE:
                    quiet_since = time.monotonic()
                    yield envelope({"keepalive": {}})
                await anyio.sleep(POLL)
            yield end_of_stream()
        finally:
            watcher.close()
            watchers.pop(key, None)

    return StreamingResponse(events(), media_type=STREAM_CONTENT_TYPE)
