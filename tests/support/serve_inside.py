"""A loopback server of the in-sandbox apps alone (envd, the interpreter), with a fixed `resolve` over
sandboxes it opened itself: real uvicorn on 127.0.0.1, on its own event loop in a background thread
(so it answers while a test's client blocks), real executors. The control plane's own fixture serves
the same apps behind the real control plane; this one lets the handlers be tested without it.
"""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from anyio.from_thread import BlockingPortal, start_blocking_portal
from starlette.requests import Request

from sandboxes import Policy, open_executor
from sandboxes.adapters.serve import ServedSandbox
from sandboxes.adapters.serve.envd import envd_app
from sandboxes.adapters.serve.errors import SandboxNotFound, Unauthorized
from sandboxes.adapters.serve.limits import InsideLimits


@dataclass
class Inside:
    url: str
    portal: BlockingPortal
    sandboxes: dict[str, ServedSandbox] = field(default_factory=dict)

    def headers(self, sandbox_id: str, port: int = 49983, token: str | None = None) -> dict[str, str]:
        sandbox = self.sandboxes[sandbox_id]
        return {
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": str(port),
            "X-Access-Token": sandbox.access_token if token is None else token,
        }

    def run(self, sandbox_id: str, code: str) -> Any:
        """Run code in a sandbox's session (on the server's loop), as the test's own probe."""
        return self.portal.call(self.sandboxes[sandbox_id].executor.run, code)


@contextmanager
def serve_inside(*, count: int = 2, limits: InsideLimits | None = None, **options: Any) -> Iterator[Inside]:
    """Serve `count` host sandboxes (ids ``sbx0``...); `options` go to each executor."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    with start_blocking_portal("asyncio") as portal:
        inside = Inside(url=f"http://127.0.0.1:{sock.getsockname()[1]}", portal=portal)

        async def resolve(request: Request) -> ServedSandbox:
            sandbox = inside.sandboxes.get(request.headers.get("e2b-sandbox-id", ""))
            if sandbox is None:
                raise SandboxNotFound("The sandbox was not found", status=502)
            if request.headers.get("x-access-token") != sandbox.access_token:
                raise Unauthorized("invalid or missing X-Access-Token")
            sandbox.touch()
            return sandbox

        envd = envd_app(resolve, limits)
        apps: dict[str, Any] = {"49983": envd}
        try:
            from sandboxes.adapters.serve.interpreter import interpreter_app
        except ImportError:
            pass
        else:
            apps["49999"] = interpreter_app(resolve, limits)

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            port = dict(scope["headers"]).get(b"e2b-sandbox-port", b"").decode()
            await apps.get(port, envd)(scope, receive, send)

        settings = {"policy": Policy(python_guards=False), "timeout": 30, **options}
        for index in range(count):
            executor = open_executor("host", **settings)
            portal.call(executor.open)
            sandbox_id = f"sbx{index}"
            inside.sandboxes[sandbox_id] = ServedSandbox(
                sandbox_id=sandbox_id, tenant="t", access_token=secrets.token_hex(16), executor=executor
            )
        server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False))

        async def serve() -> None:
            await server.serve(sockets=[sock])

        serving = portal.start_task_soon(serve)
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or serving.done():
                raise RuntimeError("the in-sandbox test server did not start")
            time.sleep(0.005)
        try:
            yield inside
        finally:
            server.should_exit = True
            serving.result(10)
            for sandbox in inside.sandboxes.values():
                portal.call(sandbox.executor.close)
