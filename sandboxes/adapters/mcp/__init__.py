"""An MCP server over the sandbox: `kodeagent mcp` (stdio) and `kodeagent mcp --http [HOST:]PORT`.

Tools: ``run_python`` (code, optional session id, timeout -> the bounded `ExecutionResult` as
structured content plus a text observation), ``open_session`` / ``reset_session`` /
``close_session`` / ``list_sessions``, ``upload_file`` / ``download_file`` (bounded; text or base64).

Modules: `config` (the pydantic `ServerConfig`, from flags or a JSON/TOML file), `sessions` (per-token
sessions, caps, idle reaping; no MCP), `auth` (bearer tokens, Host/Origin, request size: a plain ASGI
middleware), `watchdog` (nothing outlives a killed server), `server` (the tools and transports on the
official `mcp` SDK, imported only when a server starts: ``pip install 'kodeagent[mcp]'``).
"""

from __future__ import annotations

import os
import secrets
import sys
from typing import Literal

from .config import McpConfigError, ServerConfig, TokenConfig, load_config, make_config, network_problem
from .sessions import Session, SessionManager, SessionRefused

TOKEN_VARIABLE = "KODEAGENT_MCP_TOKEN"


def with_tokens(config: ServerConfig) -> tuple[ServerConfig, str | None]:
    """The config with at least one HTTP token: its own, else `KODEAGENT_MCP_TOKEN`, else a generated one
    (returned second, to be shown to the user once)."""
    if config.http.tokens:
        return config, None
    given = os.environ.get(TOKEN_VARIABLE, "").strip()
    token = given or secrets.token_urlsafe(32)
    try:
        tokens = (TokenConfig(name="default", token=token),)
    except ValueError as exc:
        raise McpConfigError(f"{TOKEN_VARIABLE}: {exc}") from None
    http = config.http.model_copy(update={"tokens": tokens})
    return config.model_copy(update={"http": http}), None if given else token


def serve(
    config: ServerConfig,
    transport: Literal["stdio", "http"] = "stdio",
    *,
    watchdog: bool = True,
    verbose: bool = False,
) -> int:
    """Run the server until its client leaves (stdio) or a signal arrives; return an exit code.

    With `watchdog` (Linux), the process forks first: this process stays as the watchdog and the child
    serves (see `watchdog`). Logs go to stderr; on stdio, stdout carries only MCP messages."""
    import logging

    import anyio

    try:
        import mcp  # noqa: F401
    except ImportError:
        raise McpConfigError("the MCP server needs the mcp package: pip install 'kodeagent[mcp]'") from None
    problem = network_problem(config)
    if problem is not None:
        raise McpConfigError(problem)
    generated = None
    if transport == "http":
        config, generated = with_tokens(config)
        from .auth import bind, url_of

        sock = bind(config.http.host, config.http.port)  # before forking: a port in use fails here
    from . import watchdog as dog

    server_pid = os.getpid()
    if watchdog and dog.available():
        watcher, scratch = dog.supervise(docker_sweep=config.backend == "docker")
        server_pid = os.getpid()
        info = f"server pid {server_pid}, watchdog pid {watcher}, temporary files in {scratch}"
    else:
        info = f"server pid {server_pid}, no watchdog"
    level = "INFO" if verbose else "WARNING"
    logging.basicConfig(level=level, stream=sys.stderr, format="kodeagent mcp: %(levelname)s %(message)s")
    from .server import catch_signals_early, print_stderr, serve_http, serve_stdio

    catch_signals_early()
    if transport == "stdio":
        announce = f"serving MCP on stdio, backend {config.backend} ({info})"
        anyio.run(lambda: serve_stdio(config, log_level=level, ready=lambda: print_stderr(announce)))
        return 0
    from .auth import TokenTable, is_loopback

    tokens = TokenTable(config.http.tokens)
    if generated:
        print_stderr(
            f"no token given: clients must send 'Authorization: Bearer {generated}' (set "
            f"{TOKEN_VARIABLE} or http.tokens in a config file to choose one)"
        )
    if not is_loopback(config.http.host):
        print_stderr(
            f"warning: {config.http.host} is not a loopback address: the server is reachable from the "
            "network, and its bearer token travels in clear text without TLS in front"
        )
    announce = (
        f"listening on {url_of(sock, config.http.path)}, backend {config.backend}, "
        f"tokens: {', '.join(tokens.tenants)} ({info})"
    )
    anyio.run(
        lambda: serve_http(config, tokens, sock=sock, log_level=level, ready=lambda: print_stderr(announce))
    )
    return 0


__all__ = [
    "TOKEN_VARIABLE",
    "McpConfigError",
    "ServerConfig",
    "Session",
    "SessionManager",
    "SessionRefused",
    "TokenConfig",
    "load_config",
    "make_config",
    "serve",
    "with_tokens",
]
