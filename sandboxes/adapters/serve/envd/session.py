"""Envd's file operations, run as code in the sandbox's own session (`insandbox.py`), and their answers
validated here before a field is used: the session's code may have replaced the helper."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ....errors import ExecutorClosed
from ....events import EventStream
from ....models import ExecutionResult
from ..connect import RpcError
from ..insession import helper_code, source
from ..paths import MAX_PATH_CHARS, to_sandbox
from ..sandbox import ServedSandbox

_SOURCE = source(Path(__file__).with_name("insandbox.py"))
_TEXT = 1024


class Entry(BaseModel):
    """One file-system entry as the helper reports it (paths relative to the working directory)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(max_length=_TEXT)
    kind: Literal["file", "directory", "symlink", "other"]
    path: str = Field(max_length=MAX_PATH_CHARS)
    size: int = Field(ge=0)
    mode: int = Field(ge=0, le=0o7777)
    permissions: str = Field(max_length=16)
    owner: str = Field(max_length=_TEXT)
    group: str = Field(max_length=_TEXT)
    mtime: float
    symlink: str | None = Field(default=None, max_length=MAX_PATH_CHARS)

    def to_json(self, sandbox: ServedSandbox) -> dict[str, Any]:
        """The entry as envd's `EntryInfo` message in protobuf's JSON form."""
        kinds = {"file": "FILE_TYPE_FILE", "directory": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
        message: dict[str, Any] = {
            "name": self.name,
            "type": kinds.get(self.kind, "FILE_TYPE_UNSPECIFIED"),
            "path": to_sandbox(self.path, sandbox.home),
            "size": str(self.size),
            "mode": self.mode,
            "permissions": self.permissions,
            "owner": self.owner,
            "group": self.group,
            "modifiedTime": _timestamp(self.mtime),
        }
        if self.symlink is not None:
            message["symlinkTarget"] = self.symlink
            message["isSymlink"] = True
        return message


def _timestamp(seconds: float) -> str:
    try:
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        moment = datetime.datetime.fromtimestamp(0, datetime.UTC)
    return moment.isoformat().replace("+00:00", "Z")


_CODES = frozenset(
    {
        "invalid_argument",
        "not_found",
        "already_exists",
        "permission_denied",
        "resource_exhausted",
        "internal",
        "failed_precondition",
    }
)


def _code(sandbox: ServedSandbox, request: dict[str, Any]) -> str:
    if sandbox.executor.policy.python_guards:
        # The helper is plain Python (os, subprocess, dunders): the guards would refuse it anyway.
        raise RpcError(
            "failed_precondition",
            f"envd's {request.get('op', 'operation')!r} runs a helper in the sandbox, and this server runs "
            "sandboxes with python_guards = true; only file reads and writes are served (set "
            "python_guards = false for commands and the other file operations)",
        )
    return helper_code(_SOURCE, request)


async def call(sandbox: ServedSandbox, request: dict[str, Any]) -> Any:
    """Run one helper operation in the session and return its answer, or raise its `RpcError`
    (also when the sandbox was killed or ended while the request was on its way)."""
    try:
        result = await sandbox.executor.run(_code(sandbox, request))
    except ExecutorClosed:
        raise RpcError("unavailable", "the sandbox was killed or ended during the operation") from None
    return answer(result)


@contextlib.asynccontextmanager
async def stream(sandbox: ServedSandbox, request: dict[str, Any]) -> AsyncIterator[EventStream]:
    """Run one helper operation and watch its output (`Executor.stream`); leaving early cancels it."""
    async with sandbox.executor.stream(_code(sandbox, request)) as events:
        yield events


def answer(result: ExecutionResult) -> Any:
    """The helper's answer in `result`, validated, or its `RpcError`."""
    if result.timed_out or result.error is not None:
        what = "timed out" if result.timed_out else f"failed ({result.error.type})"  # type: ignore[union-attr]
        raise RpcError("unavailable", f"the sandbox's operation {what}; try again")
    reply = result.value
    if not isinstance(reply, dict) or not ({"ok"} == set(reply) or {"error", "message"} == set(reply)):
        raise RpcError("internal", "the sandbox answered an operation with something that is not an answer")
    if "error" in reply:
        code_name, message = reply["error"], reply["message"]
        if code_name not in _CODES or not isinstance(message, str):
            raise RpcError("internal", "the sandbox answered an operation with an unknown error")
        raise RpcError(code_name, message[:_TEXT])
    return reply["ok"]


def entry(value: Any) -> Entry:
    try:
        return Entry.model_validate(value)
    except ValidationError as exc:
        raise RpcError(
            "internal", f"the sandbox's file entry is not valid: {exc.error_count()} errors"
        ) from None


def entries(value: Any, cap: int) -> list[Entry]:
    if not isinstance(value, list) or len(value) > cap:
        raise RpcError("internal", "the sandbox's directory listing is not a bounded list")
    return [entry(item) for item in value]
