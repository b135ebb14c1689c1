"""E2B paths (absolute, under the user's home ``/home/user``, or relative to it) as paths relative to the
session's working directory, which is what a served sandbox's home is.

The executor's working directory is the session's own (a private directory on the host, the container's
workspace on Docker), and every file operation of the session is relative to it; the home is that
directory under its E2B name, so what `/home/user/x` names is what the code sees as `./x`. Anything
outside the home is refused here, before the sandbox is asked; symlinks are checked inside the
session, where they resolve.
"""

from __future__ import annotations

import posixpath
from pathlib import PurePosixPath

from .errors import BadRequest

MAX_PATH_CHARS = 4096


class OutsideHome(BadRequest):
    """A path names something outside the sandbox's home."""


def to_relative(path: object, home: PurePosixPath) -> str:
    """The working-directory-relative form of an E2B `path` ("" for the home itself)."""
    if not isinstance(path, str) or not path:
        raise BadRequest("a path is required (absolute under /home/user, or relative to it)")
    if len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise BadRequest(f"invalid path: at most {MAX_PATH_CHARS} characters and no NUL byte")
    root = str(home)
    absolute = path if path.startswith("/") else f"{root}/{path}"
    normal = posixpath.normpath(absolute)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    if normal == root:
        return ""
    if not normal.startswith(root + "/"):
        raise OutsideHome(
            f"path {path!r} is outside {root}, the only directory a sandbox of this server exposes; "
            f"give a path under {root}"
        )
    return normal[len(root) + 1 :]


def to_sandbox(relative: str, home: PurePosixPath) -> str:
    """The E2B path of a working-directory-relative path."""
    return str(home) if relative in ("", ".") else f"{home}/{relative}"
