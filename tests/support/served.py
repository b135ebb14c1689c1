"""A real `kodeagent serve` app on a real uvicorn server on loopback, in a thread of the test process
(its own event loop), for tests that talk to it over HTTP with httpx or the unmodified E2B SDKs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sandboxes.adapters.serve.app import ServeApp
from sandboxes.adapters.serve.config import ServeConfig, make_config
from sandboxes.adapters.serve.server import in_thread

KEYS = {"alice": "e2b_" + "a1" * 20, "bob": "e2b_" + "b2" * 20}
"""Two tenants' API keys."""


@dataclass
class Served:
    """A running server: its URL (both the SDK's api_url and sandbox_url), a key, every tenant's key."""

    url: str
    key: str
    keys: dict[str, str]
    app: ServeApp
    loop: asyncio.AbstractEventLoop

    def call(self, function: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
        """Await `function()` on the server's own event loop (where its executors live)."""

        async def run() -> Any:
            return await function()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def sdk_options(self, tenant: str = "alice") -> dict[str, str]:
        """What `Sandbox.create(**...)` / `Sandbox.connect(id, **...)` take to reach this server."""
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": self.keys[tenant]}

    def env(self, tenant: str = "alice") -> dict[str, str]:
        """The same as environment variables (for a subprocess using the SDK)."""
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": self.keys[tenant]}


@contextmanager
def serving(**settings: Any) -> Iterator[Served]:
    """Serve `ServeConfig(**settings)` (two tenants' keys and no internet unless given) until exit."""
    settings.setdefault("keys", [{"name": n, "token": k} for n, k in KEYS.items()])
    settings.setdefault("internet", False)
    settings.setdefault("port", 0)
    config: ServeConfig = make_config(settings)
    keys = {k.name: k.token for k in config.keys}
    with in_thread(config) as running:
        yield Served(running.url, next(iter(keys.values())), keys, running.app, running.loop)
