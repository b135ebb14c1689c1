"""envd, the in-sandbox daemon of port 49983, as the e2b SDK reaches it: ``/health``, ``/files`` and the
Connect services ``filesystem.Filesystem`` and ``process.Process``.

`envd_app(resolve)` is the ASGI app the server mounts for requests carrying ``E2b-Sandbox-Port: 49983``.
Every request is resolved to its sandbox first (which checks its access token); a refusal answers in
the form the SDK maps to its exception (a JSON ``message`` on ``/files``, a Connect error on RPCs)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..connect import RpcError, error_response, parse_json, read_body, unary_response
from ..errors import ServeError
from ..limits import InsideLimits
from ..sandbox import Resolve, ServedSandbox
from . import files, filesystem, process, watch

WATCHER_METHODS = frozenset({"CreateWatcher", "GetWatcherEvents", "RemoveWatcher"})


def envd_app(resolve: Resolve, limits: InsideLimits | None = None) -> Starlette:
    """The envd ASGI app; `limits` caps what each request may cost (default `InsideLimits()`)."""
    caps = limits or InsideLimits()

    async def health(request: Request) -> Response:
        try:
            await resolve(request)
        except ServeError as exc:
            return files.error(exc)
        return Response(status_code=204)

    async def files_route(request: Request) -> Response:
        try:
            sandbox = await resolve(request)
            if request.method == "GET":
                return await files.read(request, sandbox, caps)
            return await files.write(request, sandbox, caps)
        except RpcError as exc:
            return files.error(ServeError(exc.message, status=_FILES_STATUS.get(exc.code, exc.status)))
        except ServeError as exc:
            return files.error(exc)

    async def filesystem_route(request: Request) -> Response:
        method = request.path_params["method"]
        if method == "WatchDir":
            return await watch.stream(request, resolve, caps)
        if method in WATCHER_METHODS:
            return await _unary(request, lambda message, sandbox: watch.handle(method, message, sandbox))
        return await _unary(
            request, lambda message, sandbox: filesystem.handle(method, message, sandbox, caps)
        )

    async def _unary(request: Request, handler: Callable[[dict, ServedSandbox], Awaitable[dict]]) -> Response:
        try:
            sandbox = await resolve(request)
            if not request.headers.get("content-type", "").startswith("application/json"):
                raise RpcError("invalid_argument", "a unary call is application/json")
            message = parse_json(await read_body(request, caps.max_rpc_bytes))
            return unary_response(await handler(message, sandbox))
        except ServeError as exc:
            return error_response(exc)

    async def process_route(request: Request) -> Response:
        method = request.path_params["method"]
        if method in process.STREAMING:
            return await process.stream(request, method, resolve, caps)
        return await _unary(request, lambda message, sandbox: process.handle(method, message, sandbox))

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/files", files_route, methods=["GET", "POST"]),
            Route("/filesystem.Filesystem/{method}", filesystem_route, methods=["POST"]),
            Route("/process.Process/{method}", process_route, methods=["POST"]),
        ]
    )


_FILES_STATUS = {"not_found": 404, "invalid_argument": 400, "permission_denied": 403, "unavailable": 502}
"""On ``/files`` a session's refusal is an HTTP status (502 is what the SDK reads as the sandbox gone)."""

__all__ = ["envd_app"]
