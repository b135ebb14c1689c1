"""A real `kodeagent serve` app on a real uvicorn server on loopback, in a thread of the test process
(its own event loop), for tests that talk to it over HTTP with httpx or the unmodified E2B SDKs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

from sandboxes.adapters.serve.app import ServeApp, create_app
from sandboxes.adapters.serve.config import ServeConfig, make_config
from sandboxes.adapters.web import bind, url_of

KEYS = {"alice": "e2b_" + "a1" * 20, "bob": "e2b_" + "b2" * 20}
"""Two tenants' API keys."""


@dataclass
class Served:
    """A running server: its URL (both the SDK's api_url and sandbox_url), a key, every tenant's key."""

    url: str
    key: str
    keys: dict[str, str]
    app: ServeApp
    server: Any

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
    app = create_app(config)
    sock = bind(config.host, 0)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, timeout_graceful_shutdown=3)
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the served app did not start")
        time.sleep(0.01)
    keys = {k.name: k.token for k in config.keys}
    try:
        yield Served(url_of(sock), next(iter(keys.values())), keys, app, server)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
