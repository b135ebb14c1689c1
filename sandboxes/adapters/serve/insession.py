"""How the server runs its own stdlib helpers as code of a session (envd's file operations and
commands, the interpreter's cells): the helper's source runs in a namespace of its own, so the
session's variables are untouched, and the code ends with the helper's answer as its last expression,
which comes back as the run's `value` through the executor's bounded codec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def helper_code(helper_source: str, request: dict[str, Any]) -> str:
    """Code that runs `helper_source`'s ``main(request)`` in the session and ends with its answer."""
    return (
        "(lambda __kodeagent_helper: (__import__('builtins').exec("
        f"{helper_source!r}, __kodeagent_helper), __kodeagent_helper['main'](__import__('json').loads("
        f"{json.dumps(request)!r})))[1])({{}})"
    )
