"""The e2b backend for the conformance suite, against the loopback stand-in (`tests/support/e2b_standin`).

One stand-in serves the whole test session: started on first use, stopped at interpreter exit. It
speaks the E2B API and envd protocols, so the unmodified SDK drives it over real HTTP.
"""

from __future__ import annotations

import atexit
import importlib.util
import threading
from typing import Any

_lock = threading.Lock()
_standin: Any = None


def unavailable() -> str | None:
    for module, extra in (("e2b", "kodeagent[e2b]"), ("uvicorn", "uvicorn (the [dev] extra)")):
        if importlib.util.find_spec(module) is None:
            return f"the e2b backend tests need {module}: pip install '{extra}'"
    return None


def standin() -> Any:
    """The session's stand-in, started on first use."""
    global _standin
    with _lock:
        if _standin is None:
            from support.e2b_standin import StandIn

            server = StandIn()
            server.start()
            atexit.register(server.stop)
            _standin = server
        return _standin


def connection(**overrides: Any) -> dict[str, Any]:
    """The executor options that point the SDK at the stand-in."""
    server = standin()
    return {
        "api_key": server.api_key,
        "api_url": server.api_url,
        "sandbox_url": server.sandbox_url,
        **overrides,
    }


def make_executor(**options: Any) -> Any:
    from sandboxes.backends.e2b import E2BExecutor

    return E2BExecutor(**{**connection(), **options})
