"""Run the stand-in: uvicorn on two loopback ports, on its own event loop in a background thread.

The thread owns the loop (an anyio blocking portal), so the server keeps answering while a test's
own event loop is blocked or busy, exactly like a remote service. Tests reach the stand-in's state
through the portal (`vanish()`, `stats()`, ...), never by touching it from their own thread.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import uvicorn
from anyio.from_thread import BlockingPortal, start_blocking_portal

from .app import StandInApp
from .state import HOME, Registry

DEFAULT_API_KEY = "e2b_standin_0123456789abcdef0123456789abcdef"


class StandIn:
    """The E2B control plane and sandbox proxy, served on 127.0.0.1.

    Use as a context manager, or `start()` / `stop()`. Point the SDK at it with
    ``api_url=standin.api_url, sandbox_url=standin.sandbox_url, api_key=standin.api_key``.
    """

    def __init__(self, *, api_key: str = DEFAULT_API_KEY, max_sandboxes: int = 100) -> None:
        self.api_key = api_key
        self.max_sandboxes = max_sandboxes
        self.api_url = ""
        self.sandbox_url = ""
        self._portal_cm: Any = None
        self._portal: BlockingPortal | None = None
        self._registry: Registry | None = None
        self._server: uvicorn.Server | None = None
        self._serving: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> StandIn:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="e2b-standin-")
        sockets = [_listen() for _ in range(2)]
        self.api_url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        self.sandbox_url = f"http://127.0.0.1:{sockets[1].getsockname()[1]}"
        self._portal_cm = start_blocking_portal("asyncio")
        self._portal = self._portal_cm.__enter__()
        self._serving, _ = self._portal.start_task(self._serve, sockets)
        deadline = time.monotonic() + 10
        while self._server is None or not self._server.started:
            if time.monotonic() > deadline or self._serving.done():
                self.stop()
                raise RuntimeError("the E2B stand-in did not start")
            time.sleep(0.005)

    async def _serve(self, sockets: list[socket.socket], *, task_status: anyio.abc.TaskStatus[None]) -> None:
        assert self._tmp is not None
        async with anyio.create_task_group() as tg:
            self._registry = Registry(Path(self._tmp.name), tg, self.max_sandboxes)
            app = StandInApp(self._registry, self.api_key)
            app.api_port = sockets[0].getsockname()[1]
            app.sandbox_port = sockets[1].getsockname()[1]
            config = uvicorn.Config(
                app, lifespan="off", log_level="warning", access_log=False, timeout_keep_alive=300
            )
            self._server = uvicorn.Server(config)
            task_status.started()
            await self._server.serve(sockets=sockets)
            for sandbox in self._registry.running():
                await self._registry.destroy(sandbox, reason="the stand-in stopped")
            with anyio.move_on_after(3):  # let the killed processes be reaped before the loop ends
                while any(s.processes for s in self._registry.sandboxes.values()):
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()

    def stop(self) -> None:
        if self._portal is not None and self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                self._serving.result(timeout=15)
        if self._portal_cm is not None:
            with contextlib.suppress(Exception):
                self._portal_cm.__exit__(None, None, None)
        self._portal_cm = self._portal = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # ------------------------------------------------------------------ test hooks (blocking)

    def vanish(self, sandbox_id: str) -> None:
        """Make a sandbox disappear as if its VM died: no API call is involved."""
        registry = self._need_registry()

        async def go() -> None:
            sandbox = registry.sandboxes.get(sandbox_id)
            if sandbox is None or not sandbox.alive:
                raise KeyError(f"no running sandbox {sandbox_id!r}")
            registry.stats["vanished"] += 1
            await registry.destroy(sandbox, reason="it vanished")

        assert self._portal is not None
        self._portal.call(go)

    def running_ids(self) -> list[str]:
        registry = self._need_registry()
        return self._call(lambda: [s.sandbox_id for s in registry.running()])

    def stats(self) -> dict[str, int]:
        registry = self._need_registry()
        return self._call(lambda: dict(registry.stats))

    def requests(self) -> dict[str, int]:
        """How many requests each route received (``"envd POST /process.Process/SendInput": 3``)."""
        registry = self._need_registry()
        return self._call(lambda: dict(registry.requests))

    def home_dir(self, sandbox_id: str) -> Path:
        """Where a sandbox's ``/home/user`` lives on this machine (gone once the sandbox is)."""
        registry = self._need_registry()
        return self._call(lambda: registry.sandboxes[sandbox_id].root / HOME.lstrip("/"))

    def network(self, sandbox_id: str) -> dict[str, Any]:
        """The egress settings the client last sent for a sandbox."""
        registry = self._need_registry()
        return self._call(lambda: dict(registry.sandboxes[sandbox_id].network))

    def end_at(self, sandbox_id: str) -> float:
        """The sandbox's expiry as a Unix time."""
        registry = self._need_registry()
        return self._call(lambda: registry.sandboxes[sandbox_id].end_at)

    def _call(self, function: Any) -> Any:
        assert self._portal is not None

        async def run() -> Any:
            return function()

        return self._portal.call(run)

    def _need_registry(self) -> Registry:
        if self._registry is None:
            raise RuntimeError("the stand-in is not running; call start() first")
        return self._registry


def _listen() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this. Without it every response whose head and body are written
    # separately waits ~40 ms for the client's delayed ACK (Nagle), which no real service shows.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock
