"""The MCP tools over `SessionManager`, and the two transports (stdio, streamable HTTP).

Imports the `mcp` SDK (and, for HTTP, uvicorn) at module level: this module is itself imported only
when a server is built (`sandboxes.adapters.mcp` loads it lazily).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from ... import ExecutionResult, SandboxError
from ...runtime import values
from .auth import TENANT_KEY, Connections, HttpGuard, TokenTable, bind
from .config import ServerConfig, load_tools
from .sessions import Session, SessionManager

logger = logging.getLogger("sandboxes.adapters.mcp")

STDIO_TENANT = "local"
SessionId = Annotated[
    str | None,
    Field(
        description="A session_id from open_session; leave it out to use your default session (opened on first use)."
    ),
]


class RunOutput(ExecutionResult):
    """The bounded `ExecutionResult` of one run, and the session it ran in."""

    session_id: str = Field(description="The session the code ran in (pass it again to keep its variables).")
    previous_run_cancelled: bool = Field(
        False, description="The previous run of this session was cancelled: its variables were lost."
    )


class SessionInfo(BaseModel):
    session_id: str
    default: bool = Field(description="The session used when a call gives no session_id.")
    backend: str
    isolation: str
    created: float = Field(description="Unix time it was opened.")
    idle_seconds: float
    runs: int
    busy: bool


class SessionList(BaseModel):
    sessions: list[SessionInfo]
    max_sessions_per_token: int
    idle_timeout: float = Field(description="Seconds without use after which a session is closed.")


class Closed(BaseModel):
    session_id: str
    closed: bool


class Uploaded(BaseModel):
    session_id: str
    path: str
    size: int


class Downloaded(BaseModel):
    session_id: str
    path: str
    size: int
    encoding: Literal["text", "base64"]
    content: str


class SandboxMcp:
    """The tools of the server, bound to one `SessionManager`. `tokens` is None on stdio (one tenant)."""

    def __init__(
        self, config: ServerConfig, manager: SessionManager, tokens: TokenTable | None = None
    ) -> None:
        self.config = config
        self.manager = manager
        self.tokens = tokens

    # ------------------------------------------------------------------ who is calling

    def tenant(self, ctx: Context) -> str:
        if self.tokens is None:
            return STDIO_TENANT
        request = ctx.request_context.request
        scope = getattr(request, "scope", None) or {}
        headers = getattr(request, "headers", None) or {}
        # The guard put the tenant in the scope; checking the header again costs microseconds and
        # does not depend on the scope reaching this task.
        tenant = self.tokens.tenant_for_header(headers.get("authorization"))
        if tenant is None or scope.get(TENANT_KEY, tenant) != tenant:
            raise ToolError("this call carries no valid bearer token")
        return tenant

    async def session(self, ctx: Context, session_id: str | None) -> Session:
        try:
            return await self.manager.resolve(self.tenant(ctx), session_id)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None

    # ------------------------------------------------------------------ the tools

    async def run_python(
        self,
        code: Annotated[
            str, Field(description="Python source to run. State persists across calls in a session.")
        ],
        ctx: Context,
        session_id: SessionId = None,
        timeout: Annotated[
            float | None, Field(description="Seconds before the run is stopped.", gt=0)
        ] = None,
    ) -> Annotated[CallToolResult, RunOutput]:
        session = await self.session(ctx, session_id)
        try:
            result, was_cancelled = await self.manager.run(session, code, timeout)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        output = RunOutput(**result.model_dump(), session_id=session.id, previous_run_cancelled=was_cancelled)
        return CallToolResult(
            content=[TextContent(type="text", text=observation(output))],
            structured_content=output.model_dump(mode="json"),
            is_error=not result.ok,
        )

    async def open_session(self, ctx: Context) -> SessionInfo:
        try:
            session = await self.manager.open(self.tenant(ctx))
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        return SessionInfo(**session.info())

    async def reset_session(self, ctx: Context, session_id: SessionId = None) -> SessionInfo:
        session = await self.session(ctx, session_id)
        try:
            await self.manager.reset(session)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        return SessionInfo(**session.info())

    async def close_session(
        self, session_id: Annotated[str, Field(description="The session to close.")], ctx: Context
    ) -> Closed:
        try:
            await self.manager.close(self.tenant(ctx), session_id)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        return Closed(session_id=session_id, closed=True)

    async def list_sessions(self, ctx: Context) -> SessionList:
        sessions = [SessionInfo(**s.info()) for s in self.manager.list(self.tenant(ctx))]
        return SessionList(
            sessions=sessions,
            max_sessions_per_token=self.config.max_sessions_per_token,
            idle_timeout=self.config.idle_timeout,
        )

    async def upload_file(
        self,
        path: Annotated[
            str, Field(description="Relative to the session's working directory, e.g. 'data/in.csv'.")
        ],
        content: Annotated[
            str, Field(description="The file's content: text, or base64 with encoding='base64'.")
        ],
        ctx: Context,
        session_id: SessionId = None,
        encoding: Literal["text", "base64"] = "text",
    ) -> Uploaded:
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError):
                raise ToolError("content is not valid base64") from None
        else:
            data = content.encode("utf-8")
        session = await self.session(ctx, session_id)
        try:
            await self.manager.upload(session, path, data)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        return Uploaded(session_id=session.id, path=path, size=len(data))

    async def download_file(
        self,
        path: Annotated[str, Field(description="Relative to the session's working directory.")],
        ctx: Context,
        session_id: SessionId = None,
        encoding: Annotated[
            Literal["auto", "text", "base64"],
            Field(description="auto: text when the file is UTF-8, else base64."),
        ] = "auto",
    ) -> Downloaded:
        session = await self.session(ctx, session_id)
        try:
            data = await self.manager.download(session, path)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        text: str | None = None
        if encoding != "base64":
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                if encoding == "text":
                    raise ToolError(f"{path!r} is not UTF-8 text; ask for encoding='base64'") from None
        if text is not None:
            return Downloaded(session_id=session.id, path=path, size=len(data), encoding="text", content=text)
        return Downloaded(
            session_id=session.id,
            path=path,
            size=len(data),
            encoding="base64",
            content=base64.b64encode(data).decode("ascii"),
        )

    # ------------------------------------------------------------------ the MCP server

    def build(self, log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING") -> MCPServer:
        app: MCPServer = MCPServer(
            "kodeagent-sandbox",
            instructions="Run Python in a sandbox. Sessions keep variables and files between calls, like a notebook.",
            log_level=log_level,
        )
        add = app.add_tool
        add(
            self.run_python,
            name="run_python",
            description=self._run_description(),
            annotations=ToolAnnotations(
                title="Run Python in a sandbox", open_world_hint=self.config.policy.network_policy is not None
            ),
        )
        add(
            self.open_session,
            name="open_session",
            description="Open a new sandbox session and return its session_id (variables and files are per session).",
        )
        add(
            self.reset_session,
            name="reset_session",
            description="Forget every variable of a session (its working directory's files stay).",
        )
        add(
            self.close_session,
            name="close_session",
            description="Close a session: its worker stops, its variables and files are gone.",
            annotations=ToolAnnotations(destructive_hint=True),
        )
        add(
            self.list_sessions,
            name="list_sessions",
            description="Your open sessions.",
            annotations=ToolAnnotations(read_only_hint=True),
        )
        add(
            self.upload_file,
            name="upload_file",
            description=(
                f"Write a file into a session's working directory (at most {self.config.max_file_bytes:,} bytes)."
            ),
        )
        add(
            self.download_file,
            name="download_file",
            description=(
                f"Read a file from a session's working directory (at most {self.config.max_file_bytes:,} bytes)."
            ),
            annotations=ToolAnnotations(read_only_hint=True),
        )
        return app

    def _run_description(self) -> str:
        policy = self.config.policy
        imports = ", ".join(policy.allowed_imports) or "none"
        lines = [
            "Run Python code in a sandbox session and return what it printed, its error, the value of its",
            "last expression (as a notebook shows it) and the files it changed.",
            "Variables persist between calls of one session (pass the same session_id; without one, your",
            "default session is used). Call final_answer(value) to return a value.",
            f"Allowed imports: {imports}.",
            f"Network: {_network_text(policy)}. Files: {policy.files}.",
            f"Timeout: {self.config.timeout:g} s by default, at most {self.config.max_timeout:g} s; "
            f"stdout and stderr are cut to {self.config.output_limit:,} characters each.",
        ]
        if self.manager.tools:
            lines.append("Functions the code can call (they run outside the sandbox):")
            for name, function in sorted(self.manager.tools.items()):
                doc = (function.__doc__ or "").strip().splitlines()
                lines.append(f"- {name}(...)" + (f": {doc[0]}" if doc else ""))
        return "\n".join(lines)


def _network_text(policy: Any) -> str:
    """The network the code gets, as the model is told it (so it does not try what is refused)."""
    rules = policy.network_policy
    if rules is None:
        return "none"
    text = "through a proxy (HTTP_PROXY is set), to " + (
        ", ".join(rules.allow[:20]) if rules.allow else "the public internet only"
    )
    return text + (f", never {', '.join(rules.deny[:20])}" if rules.deny else "")


def observation(output: RunOutput) -> str:
    """The text a model reads: what the code printed, its error, and what happened to the session."""
    parts = []
    if output.previous_run_cancelled:
        parts.append(
            "[the previous run was cancelled and its sandbox replaced: earlier variables are gone]\n"
        )
    elif output.state_lost and not output.timed_out and output.error is None:
        parts.append("[the sandbox was replaced before this run: earlier variables are gone]\n")
    parts.append(output.observation())
    if output.artifacts:
        shown = ", ".join(f"{a.path} ({a.size:,} bytes)" for a in output.artifacts[:20])
        more = len(output.artifacts) - 20 + output.artifacts_omitted
        parts.append(f"[files changed: {shown}{f' and {more} more' if more > 0 else ''}]\n")
    if output.network is not None:
        parts.extend(line + "\n" for line in output.network.refusals())
    if output.has_final_answer:
        value = output.final_answer
        parts.append(f"final answer: {value if isinstance(value, str) else values.shown(value)}\n")
    text = "".join(parts)
    return text if text.strip() else "(the code ran and printed nothing)"


# ---------------------------------------------------------------------- transports


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_early: list[int] = []


def catch_signals_early() -> None:
    """Until the event loop listens, remember stop signals instead of dying of them mid-start-up."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda number, _frame: _early.append(number))


async def _stop_on_signals(
    stop: Callable[[], Awaitable[None]], ready: Callable[[], None] | None = None
) -> None:
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        if ready is not None:
            ready()
        if not _early:
            async for signum in signals:
                _early.append(signum)
                break
        logger.warning("received %s: closing every session", signal.Signals(_early[0]).name)
        await stop()


async def serve_stdio(
    config: ServerConfig, *, log_level: str = "WARNING", ready: Callable[[], None] | None = None
) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin or a signal arrives; close every session."""
    async with SessionManager(config, load_tools(config)) as manager:
        app = SandboxMcp(config, manager).build(log_level)  # type: ignore[arg-type]
        async with anyio.create_task_group() as group:

            async def serve() -> None:
                await app.run_stdio_async()
                group.cancel_scope.cancel()

            async def stop() -> None:
                group.cancel_scope.cancel()

            group.start_soon(_stop_on_signals, stop, ready)
            group.start_soon(serve)


async def serve_http(
    config: ServerConfig,
    tokens: TokenTable,
    *,
    sock: socket.socket | None = None,
    log_level: str = "WARNING",
    ready: Callable[[], None] | None = None,
) -> None:
    """Serve MCP over streamable HTTP behind `HttpGuard` until a signal arrives; close every session."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    http = config.http
    sock = sock or bind(http.host, http.port)
    async with SessionManager(config, load_tools(config)) as manager:
        app = SandboxMcp(config, manager, tokens).build(log_level)  # type: ignore[arg-type]
        inner = app.streamable_http_app(
            streamable_http_path=http.path,
            max_request_body_size=http.max_request_bytes,
            max_sessions=http.max_connections,
            # The guard ends its binding of an idle connection after the same time (and the SDK's
            # clock starts first: it restarts when a request ends, the guard's after that).
            session_idle_timeout=http.connection_idle_timeout,
            # HttpGuard in front does the Host and Origin checks (with clear errors); the SDK's copy of
            # them cannot know the names this server answers to when bound to all interfaces.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        guarded = HttpGuard(
            inner,
            tokens,
            max_body=http.max_request_bytes,
            allowed_hosts=http.allowed_hosts,
            allowed_origins=http.allowed_origins,
            connections=Connections.of(http),
        )
        server = _server(
            uvicorn.Config(
                guarded,
                log_level=log_level.lower(),
                lifespan="on",
                access_log=False,
                timeout_graceful_shutdown=3,
            )
        )
        async with anyio.create_task_group() as group:

            async def stop() -> None:
                # Sessions first: runs in flight end at once (their workers are gone) and their
                # responses go out; then uvicorn stops, giving open streams a moment to close.
                await manager.close_all()
                server.should_exit = True

            group.start_soon(_stop_on_signals, stop, ready)
            await server.serve(sockets=[sock])
            group.cancel_scope.cancel()


def _server(config: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its signal handlers: ours stop it and then close the sessions (uvicorn's
        would re-raise SIGTERM once it stopped serving, ending the process before that)."""

        def capture_signals(self) -> Any:
            return contextlib.nullcontext()

    return Server(config)


def print_stderr(message: str) -> None:
    print(f"kodeagent mcp: {message}", file=sys.stderr, flush=True)
