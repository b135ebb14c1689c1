"""Variables sent into a session (`Executor.send_variables`), checked and encoded in the parent
before anything is sent.

Each value crosses in the values codec's tagged form (`runtime/values.py`, the table in
docs/values.md), so a tuple stays a tuple, a set a set, bytes bytes, a dict with int keys such a
dict; what the codec cannot carry is refused here with its message, naming the variable's part and
its type. The runner checks the names and the bounds again when it binds them (`Runner.define`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .runtime import bounds, values
from .runtime.guard import variable_name_problem


def encode_variables(variables: Mapping[str, Any], taken: Iterable[str] = ()) -> dict[str, Any]:
    """`variables` in the tagged form, ready for a `DefineRequest`. A name that is not an identifier,
    starts with ``_``, or is one of `taken` (the session's tools) or the runner's own is a
    `ValueError`; a value the codec cannot carry is `values.Uncarriable` (a `TypeError`) naming the
    part and its type; more than `bounds.DEFINE_MESSAGE_LIMIT` bytes of JSON in all a `ValueError`."""
    if not isinstance(variables, Mapping):
        raise TypeError(
            f"send_variables() takes a mapping of names to values, not {type(variables).__name__}"
        )
    taken = frozenset(taken)
    encoded: dict[str, Any] = {}
    for name, value in variables.items():
        problem = variable_name_problem(name, taken)
        if problem is not None:
            raise ValueError(f"{problem}; send it under another name")
        encoded[name] = values.encode(value, path=name, crossing="enter the sandbox")
    try:
        size = len(json.dumps(encoded, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except ValueError as exc:  # an int too long to write as text
        raise ValueError(f"the variables cannot be written as JSON: {exc}") from None
    if size > bounds.DEFINE_MESSAGE_LIMIT:
        raise ValueError(
            f"the variables are {size:,} bytes in the values codec's JSON, past the "
            f"{bounds.DEFINE_MESSAGE_LIMIT:,} that cross into the sandbox at once; send large data "
            "as a file (upload()) and read it in the code"
        )
    return encoded
