"""`POST /run_code`: SandboxFusion's `run_code` API, served by `sandboxes.grading`.

RL trainers (verl, SkyRL, the Tinker cookbook) already call SandboxFusion's `run_code` for code
rewards; this route answers its request and response shapes so that they can point their
endpoint here and keep their code. Each request is one `Program` graded in a fresh session of the
server's backend, so the reward cannot be gamed by the sandbox's quirks:

- a program that ends its own process (`sys.exit(0)`, `os._exit(0)`) before its end is `Failed`
  with a non-zero `return_code`, never `Success` (SandboxFusion's reward hack);
- the sandbox failing (could not open, worker lost) is `SandboxError`, which the client raises
  (and retries) instead of scoring.

Who may call: the server's API keys, as `X-API-Key: <key>`, `Authorization: Bearer <key>`, or
HTTP Basic auth with the key as the password (or as the user name with no password), which is what
SandboxFusion's client sends for an endpoint such as ``http://kodeagent:<key>@host:49982``. The
route counts against the key's requests in flight (`max_requests_per_key`), runs at most
`max_sandboxes` programs at once (more wait for a slot), bounds the body before parsing it, and caps
the run timeout at the server's `run_timeout`. Python only: another language is refused (400).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import posixpath
from collections.abc import Callable
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...grading import Grading, Program, ProgramStatus, SandboxFailure, Verdict, opened_and_judged
from ...policy import Limits, Policy
from ..mcp.auth import TokenTable
from ..web import Receive, Scope, Send
from .config import ServeConfig
from .errors import BadRequest, ServeError, TooLarge, Unauthorized

logger = logging.getLogger("sandboxes.adapters.serve.runcode")


PATH = "/run_code"
MAX_RUN_CODE_BYTES = 16 * 1024 * 1024
"""Largest request body (the code and its base64 files), whatever `max_request_bytes` allows."""
MAX_FILES = 64
"""Files one request may write or fetch."""
PYTHON_LANGUAGES = ("python", "python3")


class RunCodeRequest(BaseModel):
    """SandboxFusion's `RunCodeRequest` (fields another version sends and this one does not use are
    ignored)."""

    model_config = ConfigDict(extra="ignore")

    code: str
    language: str
    compile_timeout: float = Field(10, ge=0, allow_inf_nan=False)
    run_timeout: float = Field(10, gt=0, allow_inf_nan=False)
    memory_limit_MB: int = Field(-1, ge=-1)  # noqa: N815 - SandboxFusion's name
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict, max_length=MAX_FILES)
    fetch_files: list[str] = Field(default_factory=list, max_length=MAX_FILES)


class CommandRunResult(BaseModel):
    """SandboxFusion's `CommandRunResult`."""

    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """SandboxFusion's `RunCodeResponse`."""

    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def tenant_of(keys: TokenTable, headers: dict[str, str]) -> str | None:
    """The tenant of a request's key: `X-API-Key`, a bearer token, or HTTP Basic auth (the key as
    the password, or as the user with an empty password); None without a known key."""
    if "x-api-key" in headers:
        return keys.tenant_for_token(headers["x-api-key"])
    scheme, _, value = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer":
        return keys.tenant_for_token(value.strip())
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, _, password = decoded.partition(":")
        return keys.tenant_for_token(password or user)
    return None


def _relative(path: str) -> str:
    normal = posixpath.normpath(path)
    if not path or path.startswith("/") or normal == ".." or normal.startswith("../") or "\x00" in path:
        raise BadRequest(
            f"file path {path[:200]!r} must be relative to the program's directory, without '..'"
        )
    return normal


def program_of(request: RunCodeRequest, config: ServeConfig) -> Program:
    """The `Program` of a request, or `BadRequest` saying what to change."""
    if request.language.lower() not in PYTHON_LANGUAGES:
        raise BadRequest(
            f"language {request.language[:40]!r} is not served here: this /run_code runs Python only "
            "(language 'python')"
        )
    files: dict[str, bytes] = {}
    for path, content in request.files.items():
        try:
            files[_relative(path)] = base64.b64decode(content or "", validate=True)
        except binascii.Error:
            raise BadRequest(f"file {path[:200]!r} is not valid base64") from None
    limits = None
    if request.memory_limit_MB > 0:
        limits = Limits(memory_mb=max(64, request.memory_limit_MB))
    return Program(
        code=request.code,
        timeout=min(request.run_timeout, config.run_timeout),
        limits=limits,
        stdin=request.stdin,
        files=files,
        fetch_files=tuple(_relative(p) for p in request.fetch_files),
    )


def response_of(graded: Verdict | SandboxFailure) -> RunCodeResponse:
    """The SandboxFusion response of a grading result."""
    if isinstance(graded, SandboxFailure):
        return RunCodeResponse(status="SandboxError", message=graded.message)
    stderr = graded.stderr
    if graded.error is not None and graded.status is ProgramStatus.FAILED:
        # `python file.py` prints the traceback on stderr, and graders read it there.
        stderr += graded.error.traceback or f"{graded.error.type}: {graded.error.message}\n"
    status: Literal["Finished", "Error", "TimeLimitExceeded"] = "Finished"
    code = graded.return_code
    message = ""
    if graded.status is ProgramStatus.TIMED_OUT:
        status, message = "TimeLimitExceeded", "the program ran past its run_timeout"
    elif graded.status is ProgramStatus.OUT_OF_MEMORY:
        code, message = 1, "the program ran out of memory"
    elif graded.status is ProgramStatus.EXITED:
        # Ended its own process: what follows the call (the tests) never ran. Never 0, so that no
        # reader of the return code takes it for a pass.
        status, code = "Error", code or 1
        message = (
            "the program ended its own process (exit status "
            f"{'unknown' if graded.return_code is None else graded.return_code}) before its end: not a pass"
        )
    run = CommandRunResult(
        status=status,
        execution_time=graded.run_seconds,
        return_code=code,
        stdout=graded.stdout,
        stderr=stderr,
    )
    return RunCodeResponse(
        status="Success" if graded.passed else "Failed",
        message=message,
        run_result=run,
        files={path: base64.b64encode(data).decode("ascii") for path, data in graded.files.items()},
    )


class RunCode:
    """The route: authenticates, bounds, parses, grades, answers in SandboxFusion's shape."""

    def __init__(self, config: ServeConfig, keys: TokenTable, in_flight: Callable[[str], Any]) -> None:
        self.config = config
        self.keys = keys
        self.in_flight = in_flight
        self.slots = anyio.CapacityLimiter(config.max_sandboxes)
        options = dict(config.backend_options)
        if config.backend == "host":
            options.setdefault("isolation", "namespaces")  # plain Python needs the namespaces boundary
        self.grading = Grading(
            backend=config.backend,
            options=options,
            policy=Policy(python_guards=config.python_guards, allowed_imports=("*",), files="workdir"),
            timeout=min(10.0, config.run_timeout),
        )
        self.limit = min(MAX_RUN_CODE_BYTES, config.max_request_bytes)
        self.started = 0
        """Programs this route has started (a session opened for each): what a refused request never adds to."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        try:
            if scope.get("method") != "POST":
                raise ServeError("/run_code takes POST with a JSON body", status=405)
            tenant = tenant_of(self.keys, headers)
            if tenant is None:
                logger.warning(
                    "refused a /run_code request with %s API key",
                    "a wrong" if headers.keys() & {"x-api-key", "authorization"} else "no",
                )
                raise Unauthorized(
                    "Invalid API key: send this server's key as X-API-Key, as a bearer token, or in the "
                    "endpoint URL (http://kodeagent:<key>@host:port)"
                )
            async with self.in_flight(tenant):
                request = await self._request(receive, headers)
                program = program_of(request, self.config)
                async with self.slots:
                    self.started += 1
                    executor, graded = await opened_and_judged(program, self.grading)
                try:
                    await _answer(send, 200, response_of(graded))
                finally:
                    # After the answer: the client has its verdict while the worker is killed and reaped.
                    if executor is not None:
                        with anyio.CancelScope(shield=True):
                            await executor.close()
        except ServeError as exc:
            await _answer(send, exc.status, RunCodeResponse(status="SandboxError", message=str(exc)))

    async def _request(self, receive: Receive, headers: dict[str, str]) -> RunCodeRequest:
        declared = headers.get("content-length", "")
        if declared and (not declared.isdigit() or len(declared) > 18):
            raise BadRequest("Content-Length is not a number")
        if declared and int(declared) > self.limit:
            raise TooLarge(
                f"the request body is {int(declared):,} bytes; /run_code takes at most {self.limit:,}"
            )
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise BadRequest("the client went away before the body ended")
            body += message.get("body", b"")
            if len(body) > self.limit:
                raise TooLarge(f"the request body is larger than the {self.limit:,} bytes /run_code takes")
            if not message.get("more_body"):
                break
        try:
            return RunCodeRequest.model_validate(json.loads(body))
        except (ValueError, ValidationError) as exc:
            raise BadRequest(f"the body is not a run_code request: {str(exc)[:500]}") from None


async def _answer(send: Send, status: int, response: RunCodeResponse) -> None:
    body = response.model_dump_json().encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
