"""Helpers shared by the security suites (`test_security_*.py`, `test_benign.py`, `test_bad_input.py`).

An attack snippet prints ``ESCAPED`` only after the forbidden step succeeded, so a test can prove
the effect did not happen (not merely that some exception was raised).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

from sandboxes import ExecutionResult, Policy

ESCAPED = "ESCAPED"
HOST_BACKENDS = frozenset({"host", "hostprocess"})
"""Backends whose working directory is a directory of this machine (`workdir=` is a host path)."""


async def run_once(factory: Callable[..., Any], code: str | bytes, **options: Any) -> ExecutionResult:
    """Run `code` in a fresh session of the current backend."""
    options.setdefault("timeout", 10)
    async with factory(**options) as ex:
        result: ExecutionResult = await ex.run(code)
        return result


def assert_refused(result: ExecutionResult, *kinds: str) -> None:
    """The attack failed with an error (of one of `kinds`, if given) and its effect never printed."""
    assert ESCAPED not in result.stdout, f"the attack succeeded: {result!r}"
    assert ESCAPED not in result.stderr, f"the attack succeeded: {result!r}"
    assert result.error is not None, f"no error for an attack: {result!r}"
    if kinds:
        assert result.error.type in kinds, f"expected one of {kinds}, got {result.error!r}"
    assert not result.has_final_answer


async def assert_usable(ex: Any) -> None:
    """The executor still runs code and answers correctly."""
    result = await ex.run("print(6 * 7)")
    assert result.ok, result
    assert result.stdout == "42\n"


def policy(*imports: str, **options: Any) -> Policy:
    return Policy(allowed_imports=list(imports), **options)


def workdir_options(backend: str, tmp_path: pathlib.Path) -> dict[str, Any]:
    """Options that put the session's working directory where the test can look at it (host backends)."""
    return {"workdir": str(tmp_path)} if backend in HOST_BACKENDS else {}
