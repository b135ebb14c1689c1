"""E2B's control plane (the REST API the SDK's `Sandbox.create`, `connect`, `kill`, `set_timeout`,
`get_info` and `list` call) over the `Registry`, as a Starlette app.

The front door (`app`) has already checked the API key and bounded the body; the tenant is in the
scope. Every body is parsed here with a size already known, validated before it is used, and every
refusal is E2B's error shape (``{"code", "message"}``) with the status the SDK maps.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import BadRequest, ServeError
from .metrics import Meter, sample
from .network import network_of
from .registry import Held, Registry, Spec

TENANT_KEY = "kodeagent.serve.tenant"
"""Where the front door leaves the caller's tenant in the ASGI scope."""
CLIENT_ID = "kodeagent"
ENVD_VERSION = "0.5.7"
"""The envd version announced: the SDK picks its wire features by it (octet-stream uploads, stdin and
user options since 0.3/0.4); 0.6.2 and later would make it expect file metadata support."""
TEMPLATE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_ENTRIES = 256
MAX_VALUE = 8192
UNSUPPORTED = {
    "mcp": "MCP servers inside the sandbox",
    "iam": "workload identity tokens",
    "volumeMounts": "volume mounts",
}


class CreateRequest(BaseModel):
    """The body of ``POST /v2/sandboxes`` (E2B's `NewSandboxV2`); fields this server cannot honour are
    refused below, never ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)

    template_id: str = Field(alias="templateID")
    timeout: int | None = None
    auto_pause: bool = Field(False, alias="autoPause")
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(None, alias="envVars")
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None

    @field_validator("template_id")
    @classmethod
    def _template(cls, value: str) -> str:
        if not TEMPLATE.match(value):
            raise ValueError("a template id is 1-128 letters, digits and _ . : / -")
        return value

    @field_validator("metadata", "env_vars")
    @classmethod
    def _bounded(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if len(value) > MAX_ENTRIES:
                raise ValueError(f"at most {MAX_ENTRIES} entries")
            for key, item in value.items():
                if len(key) > 128 or len(item) > MAX_VALUE:
                    raise ValueError(f"keys of at most 128 characters, values of at most {MAX_VALUE}")
        return value


def _iso(timestamp: float) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def sandbox_json(entry: Held) -> dict[str, Any]:
    """E2B's `Sandbox` (the answer to create and connect)."""
    return {
        "templateID": entry.sandbox.template,
        "sandboxID": entry.sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": entry.sandbox.access_token,
        "trafficAccessToken": None,
        "domain": None,
    }


def listed_json(entry: Held) -> dict[str, Any]:
    """E2B's `ListedSandbox`."""
    return {
        "templateID": entry.sandbox.template,
        "sandboxID": entry.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": _iso(entry.sandbox.started_at),
        "endAt": _iso(entry.end_at),
        "cpuCount": 1,
        "memoryMB": 2048,
        "diskSizeMB": 1024,
        "state": entry.state,
        "envdVersion": ENVD_VERSION,
        "metadata": entry.sandbox.metadata,
    }


def detail_json(entry: Held) -> dict[str, Any]:
    """E2B's `SandboxDetail` (the answer to get_info)."""
    return {
        **listed_json(entry),
        "envdAccessToken": entry.sandbox.access_token,
        "allowInternetAccess": entry.spec.allow_internet_access,
        "domain": None,
    }


def error_json(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


class ControlPlane:
    """The routes, bound to one registry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def app(self) -> Starlette:
        routes = [
            Route("/sandboxes", self.create, methods=["POST"]),
            Route("/v2/sandboxes", self.create, methods=["POST"]),
            Route("/sandboxes", self.list_v1, methods=["GET"]),
            Route("/v2/sandboxes", self.list_v2, methods=["GET"]),
            Route("/sandboxes/metrics", self.metrics_of_many, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", self.get, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}/metrics", self.metrics, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", self.kill, methods=["DELETE"]),
            Route("/sandboxes/{sandbox_id}/timeout", self.set_timeout, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/connect", self.connect, methods=["POST"]),
            Route("/v2/sandboxes/{sandbox_id}/connect", self.connect, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/network", self.set_network, methods=["PUT"]),
            Route("/sandboxes/{sandbox_id}/pause", self.pause, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/resume", self.resume, methods=["POST"]),
        ]
        app = Starlette(routes=routes)
        app.add_exception_handler(ServeError, _serve_error)  # type: ignore[arg-type]
        app.add_exception_handler(404, _no_route)
        app.add_exception_handler(405, _no_route)
        return app

    async def create(self, request: Request) -> Response:
        body = await _json_body(request)
        try:
            asked = CreateRequest.model_validate(body)
        except ValidationError as exc:
            raise BadRequest(_problems(exc)) from None
        for name, what in UNSUPPORTED.items():
            if body.get(name) not in (None, [], {}):
                raise BadRequest(f"{what} ({name}) are not supported by this server; leave {name} out")
        resume = body.get("autoResume")
        if resume is not None and (not isinstance(resume, dict) or resume.get("enabled", True) is not True):
            raise BadRequest(
                "autoResume: a paused sandbox here always resumes on its next request; leave autoResume out"
            )
        if asked.env_vars:
            bad = [k for k in asked.env_vars if not ENV_NAME.match(k)]
            if bad:
                raise BadRequest(f"envVars: {bad[0]!r} is not an environment variable name")
        network = network_of(
            asked.allow_internet_access, asked.network, internet=self.registry.config.internet
        )
        timeout = self.registry.config.default_timeout if asked.timeout is None else asked.timeout
        spec = Spec(
            template=asked.template_id,
            timeout=self.registry.check_timeout(timeout),
            metadata=asked.metadata or {},
            envs=asked.env_vars or {},
            network=network,
            allow_internet_access=network is not False,
            on_timeout="pause" if asked.auto_pause else "kill",
        )
        entry = await self.registry.create(_tenant(request), spec)
        return JSONResponse(sandbox_json(entry), status_code=201)

    async def list_v1(self, request: Request) -> Response:
        return JSONResponse([listed_json(h) for h in self._filtered(request)])

    async def list_v2(self, request: Request) -> Response:
        held = self._filtered(request)
        states = request.query_params.get("state")
        if states:
            wanted = set(states.split(","))
            held = [h for h in held if h.state in wanted]
        limit_text = request.query_params.get("limit", "100")
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= 1000:
            raise BadRequest("limit must be a whole number from 1 to 1000")
        start = 0
        token = request.query_params.get("nextToken")
        if token:
            if not token.isdigit():
                raise BadRequest("nextToken is not one this server gave")
            start = int(token)
        page = held[start : start + int(limit_text)]
        headers = {}
        if start + len(page) < len(held):
            headers["x-next-token"] = str(start + len(page))
        return JSONResponse([listed_json(h) for h in page], headers=headers)

    def _filtered(self, request: Request) -> list[Held]:
        held = self.registry.list(_tenant(request))
        query = request.query_params.get("metadata")
        if query:
            from urllib.parse import parse_qsl

            wanted = dict(parse_qsl(query, keep_blank_values=True))
            held = [h for h in held if all(h.sandbox.metadata.get(k) == v for k, v in wanted.items())]
        return held

    async def get(self, request: Request) -> Response:
        entry = self.registry.get(_tenant(request), request.path_params["sandbox_id"])
        return JSONResponse(detail_json(entry))

    async def metrics(self, request: Request) -> Response:
        entry = self.registry.get(_tenant(request), request.path_params["sandbox_id"])
        start, end = _unix(request, "start"), _unix(request, "end")
        if start is not None and end is not None and start > end:
            raise BadRequest("start is after end")
        meter = await _measured(entry)
        return JSONResponse(meter.between(start, end))

    async def metrics_of_many(self, request: Request) -> Response:
        text = request.query_params.get("sandbox_ids", "")
        ids = [i for i in text.split(",") if i] if len(text) <= MAX_METRIC_IDS * 64 else None
        if not ids or len(ids) > MAX_METRIC_IDS:
            raise BadRequest(f"sandbox_ids: give 1 to {MAX_METRIC_IDS} sandbox ids, separated by commas")
        found: dict[str, Any] = {}
        for sandbox_id in dict.fromkeys(ids):
            try:
                entry = self.registry.get(_tenant(request), sandbox_id)
            except ServeError:
                continue  # not this tenant's, or gone: left out, as an id never seen is
            latest = (await _measured(entry)).samples
            if latest:
                found[sandbox_id] = latest[-1]
        return JSONResponse({"sandboxes": found})

    async def kill(self, request: Request) -> Response:
        await self.registry.kill(_tenant(request), request.path_params["sandbox_id"])
        return Response(status_code=204)

    async def set_timeout(self, request: Request) -> Response:
        body = await _json_body(request)
        self.registry.set_timeout(_tenant(request), request.path_params["sandbox_id"], body.get("timeout"))
        return Response(status_code=204)

    async def connect(self, request: Request) -> Response:
        body = await _json_body(request)
        entry, resumed = await self.registry.connect(
            _tenant(request), request.path_params["sandbox_id"], body.get("timeout")
        )
        return JSONResponse(sandbox_json(entry), status_code=201 if resumed else 200)

    async def pause(self, request: Request) -> Response:
        await _json_body(request)
        if not await self.registry.pause(_tenant(request), request.path_params["sandbox_id"]):
            return error_json(409, "the sandbox is already paused")
        return Response(status_code=204)

    async def resume(self, request: Request) -> Response:
        body = await _json_body(request)
        entry = self.registry.get(_tenant(request), request.path_params["sandbox_id"])
        timeout = body.get("timeout")
        seconds = None if timeout is None else self.registry.check_timeout(timeout)
        if not await self.registry.resume(entry, seconds):
            return error_json(409, "the sandbox is already running")
        return JSONResponse(sandbox_json(entry), status_code=201)

    async def set_network(self, request: Request) -> Response:
        body = await _json_body(request)
        entry = self.registry.get(_tenant(request), request.path_params["sandbox_id"])
        rules = {k: v for k, v in body.items() if k != "allow_internet_access"}
        network = network_of(
            body.get("allow_internet_access"), rules or None, internet=self.registry.config.internet
        )
        try:
            await entry.sandbox.executor.set_network(network)
        except ValueError as exc:
            raise BadRequest(
                f"{exc} (on this server: create the sandbox with internet on to change its rules later)"
            ) from None
        entry.spec = dataclasses.replace(
            entry.spec, network=network, allow_internet_access=network is not False
        )
        return Response(status_code=204)


MAX_METRIC_IDS = 100


async def _measured(entry: Held) -> Meter:
    """The sandbox's meter with a reading of now added (when it has a live session)."""
    sandbox = entry.sandbox
    meter = sandbox.meter
    if not isinstance(meter, Meter):
        meter = sandbox.meter = Meter(sandbox.started_at)
    reading = await sample(sandbox)
    if reading is not None:
        meter.add(reading)
    return meter


def _unix(request: Request, name: str) -> int | None:
    text = request.query_params.get(name)
    if text is None:
        return None
    if not text.isdigit() or len(text) > 12:
        raise BadRequest(f"{name} is a time in Unix seconds")
    return int(text)


def _tenant(request: Request) -> str:
    tenant = request.scope.get(TENANT_KEY)
    if not isinstance(tenant, str):  # the front door always sets it; never serve without one
        raise ServeError("no tenant for this request", status=401)
    return tenant


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(value, dict):
        raise BadRequest("the request body must be a JSON object")
    return value


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors(include_url=False)
    )


async def _serve_error(request: Request, exc: ServeError) -> Response:
    return error_json(exc.status, str(exc))


async def _no_route(request: Request, exc: Exception) -> Response:
    return error_json(404, f"this server has no route {request.method} {request.url.path}")
