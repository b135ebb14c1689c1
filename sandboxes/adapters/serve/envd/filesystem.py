"""envd's ``filesystem.Filesystem`` Connect service, the unary methods the SDK calls: Stat (also how it
tells `exists`), ListDir (with depth), MakeDir, Move, Remove. Each runs in the session (`session`)."""

from __future__ import annotations

from typing import Any

from ..connect import RpcError
from ..limits import InsideLimits
from ..paths import to_relative
from ..sandbox import ServedSandbox
from . import session

MAX_DEPTH = 64
UNARY = frozenset({"Stat", "ListDir", "MakeDir", "Move", "Remove"})


def _path(message: dict[str, Any], key: str, sandbox: ServedSandbox) -> str:
    return to_relative(message.get(key, ""), sandbox.home)


async def handle(
    method: str, message: dict[str, Any], sandbox: ServedSandbox, limits: InsideLimits
) -> dict[str, Any]:
    if method not in UNARY:
        raise RpcError("unimplemented", f"filesystem.Filesystem/{method} is not served here")
    if method == "Stat":
        found = session.entry(
            await session.call(sandbox, {"op": "stat", "path": _path(message, "path", sandbox)})
        )
        return {"entry": found.to_json(sandbox)}
    if method == "ListDir":
        depth = message.get("depth", 0) or 1
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise RpcError("invalid_argument", f"depth must be a whole number from 1 to {MAX_DEPTH}")
        request = {
            "op": "list",
            "path": _path(message, "path", sandbox),
            "depth": depth,
            "cap": limits.max_list_entries,
        }
        try:
            listed = session.entries(await session.call(sandbox, request), limits.max_list_entries)
        except RpcError as exc:
            if exc.code != "resource_exhausted":
                raise
            raise RpcError(
                "resource_exhausted",
                f"the listing has more than {limits.max_list_entries:,} entries, this server's cap; "
                "list a deeper directory or with a smaller depth",
            ) from None
        return {"entries": [item.to_json(sandbox) for item in listed]}
    if method == "MakeDir":
        made = session.entry(
            await session.call(sandbox, {"op": "mkdir", "path": _path(message, "path", sandbox)})
        )
        return {"entry": made.to_json(sandbox)}
    if method == "Move":
        request = {
            "op": "move",
            "source": _path(message, "source", sandbox),
            "destination": _path(message, "destination", sandbox),
        }
        if "" in (request["source"], request["destination"]):
            raise RpcError("invalid_argument", "the home directory itself cannot be moved or replaced")
        moved = session.entry(await session.call(sandbox, request))
        return {"entry": moved.to_json(sandbox)}
    await session.call(sandbox, {"op": "remove", "path": _path(message, "path", sandbox)})
    return {}
