"""The code interpreter of port 49999, as e2b-code-interpreter reaches it: ``POST /execute`` (streamed
NDJSON), and contexts (``POST/GET /contexts``, ``DELETE /contexts/{id}``, ``POST
/contexts/{id}/restart``).

Python only (another language is refused, naming what is served). Each context is a namespace of its
own in the sandbox's one session, not a kernel of its own: contexts share the session's process, its
files and its modules, and run one cell at a time (the session's runner takes one request at a time),
while their variables stay apart. The default context is ``default``."""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..connect import RpcError, parse_json, read_body
from ..errors import BadRequest, ServeError, TooMany
from ..limits import InsideLimits
from ..paths import to_relative, to_sandbox
from ..sandbox import Resolve, ServedSandbox
from .cells import Context, context_op, execute

DEFAULT_CONTEXT = "default"
MAX_CONTEXTS = 32
MAX_ENV_VARS = 1_000
_GUARDED = "with the guards on, cells run in the default context with the sandbox's own environment"


def interpreter_app(resolve: Resolve, limits: InsideLimits | None = None) -> Starlette:
    """The interpreter ASGI app; `limits` caps what each request may cost (default `InsideLimits()`)."""
    caps = limits or InsideLimits()

    async def guarded(request: Request, handler: Any) -> Response:
        try:
            sandbox = await resolve(request)
            response: Response = await handler(request, sandbox)
            return response
        except ServeError as exc:
            status = exc.status if not isinstance(exc, RpcError) else {429: 413}.get(exc.status, exc.status)
            return _error(status, exc.message if isinstance(exc, RpcError) else str(exc))

    async def execute_route(request: Request) -> Response:
        return await guarded(request, _execute)

    async def _execute(request: Request, sandbox: ServedSandbox) -> Response:
        body = parse_json(await read_body(request, caps.max_code_bytes))
        code, envs = body.get("code"), body.get("env_vars") or {}
        if not isinstance(code, str):
            raise BadRequest("the request needs `code`, a string")
        _check_language(body.get("language"))
        if (
            not isinstance(envs, dict)
            or len(envs) > MAX_ENV_VARS
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in envs.items())
        ):
            raise BadRequest(f"env_vars must map at most {MAX_ENV_VARS} names to strings")
        context_id = body.get("context_id") or DEFAULT_CONTEXT
        context = _context(sandbox, context_id)
        if sandbox.executor.policy.python_guards and envs:
            raise BadRequest(f"a cell's own env_vars need the server's python_guards = false ({_GUARDED})")
        return StreamingResponse(
            execute(sandbox, context, code, {**sandbox.envs, **envs}, caps), media_type="application/x-ndjson"
        )

    async def contexts_route(request: Request) -> Response:
        return await guarded(request, _contexts)

    async def _contexts(request: Request, sandbox: ServedSandbox) -> Response:
        _context(sandbox, DEFAULT_CONTEXT)
        if request.method == "GET":
            return _json([c.to_json() for c in sandbox.contexts.values()])
        body = parse_json(await read_body(request, caps.max_rpc_bytes))
        _check_language(body.get("language"))
        if sandbox.executor.policy.python_guards:
            raise BadRequest(f"contexts other than the default need python_guards = false ({_GUARDED})")
        if len(sandbox.contexts) >= MAX_CONTEXTS:
            raise TooMany(f"a sandbox holds at most {MAX_CONTEXTS} contexts; remove one first")
        relative = to_relative(body.get("cwd") or str(sandbox.home), sandbox.home)
        context = Context(id=uuid.uuid4().hex, cwd=to_sandbox(relative, sandbox.home), relative=relative)
        await context_op(sandbox, context, "touch")
        context.known = True
        sandbox.contexts[context.id] = context
        return _json(context.to_json())

    async def context_route(request: Request) -> Response:
        return await guarded(request, _context_item)

    async def _context_item(request: Request, sandbox: ServedSandbox) -> Response:
        context = _context(sandbox, request.path_params["context_id"], create=False)
        restart = request.url.path.endswith("/restart")
        if sandbox.executor.policy.python_guards:
            raise BadRequest(f"restarting a context needs python_guards = false ({_GUARDED})")
        if not restart and context.id == DEFAULT_CONTEXT:
            raise BadRequest("the default context cannot be removed; restart it to clear its state")
        await context_op(sandbox, context, "forget")
        context.known = False
        if not restart:
            del sandbox.contexts[context.id]
        return Response(status_code=204)

    return Starlette(
        routes=[
            Route("/execute", execute_route, methods=["POST"]),
            Route("/contexts", contexts_route, methods=["GET", "POST"]),
            Route("/contexts/{context_id}", context_route, methods=["DELETE"]),
            Route("/contexts/{context_id}/restart", context_route, methods=["POST"]),
        ]
    )


def _check_language(language: object) -> None:
    if language is None or (isinstance(language, str) and language.lower() in ("python", "python3")):
        return
    shown = language if isinstance(language, str) else type(language).__name__
    raise BadRequest(f"language {shown!r} is not supported: this server's sandboxes run Python only")


def _context(sandbox: ServedSandbox, context_id: object, *, create: bool = True) -> Context:
    if not isinstance(context_id, str) or len(context_id) > 64:
        raise BadRequest("a context id is a string of at most 64 characters")
    context = sandbox.contexts.get(context_id)
    if context is None:
        if not (create and context_id == DEFAULT_CONTEXT):
            raise ServeError(f"no context {context_id!r} in this sandbox; create it first", status=404)
        context = Context(id=DEFAULT_CONTEXT, cwd=str(sandbox.home))
        sandbox.contexts[DEFAULT_CONTEXT] = context
    assert isinstance(context, Context)
    return context


def _json(value: Any) -> Response:
    return Response(json.dumps(value), media_type="application/json")


def _error(status: int, message: str) -> Response:
    return Response(
        json.dumps({"code": status, "message": message}), status_code=status, media_type="application/json"
    )


__all__ = ["interpreter_app"]
