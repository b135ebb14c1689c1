"""`ServerConfig`: what the MCP server serves (backend, policy, tool functions) and its limits.

One pydantic model, read from a JSON or TOML file (`load_config`) or built from command-line flags,
so that a bad setting is refused with its field's name before anything starts.
"""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ... import Policy, SandboxError
from ...backends import BackendName
from ..settings import read_file, validate

MIN_TOKEN_LENGTH = 16


class McpConfigError(SandboxError, ValueError):
    """The MCP server's configuration (a file, a flag, a tool function's import path) is not valid."""


class TokenConfig(BaseModel):
    """One bearer token of the HTTP service: a tenant. Sessions opened with it are reachable only with it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="Shown in logs instead of the token.")
    token: str = Field(min_length=MIN_TOKEN_LENGTH, repr=False)

    @field_validator("token")
    @classmethod
    def _printable(cls, value: str) -> str:
        if not value.isascii() or not value.isprintable() or " " in value:
            raise ValueError("a token is printable ASCII without spaces (it travels in an HTTP header)")
        return value


class HttpConfig(BaseModel):
    """The streamable HTTP transport: where it listens and whom it lets in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(
        "127.0.0.1", description="Loopback by default; anything else is reachable from the network."
    )
    port: int = Field(8765, ge=0, le=65535, description="0: an ephemeral port (printed at start).")
    path: str = Field("/mcp", pattern=r"^/[A-Za-z0-9_\-/]*$")
    tokens: tuple[TokenConfig, ...] = Field(
        (), description="Accepted bearer tokens; none: one is taken from KODEAGENT_MCP_TOKEN or generated."
    )
    allowed_hosts: tuple[str, ...] = Field(
        (),
        description="Extra Host header values accepted ('name:port' or 'name:*'), besides the bound address.",
    )
    allowed_origins: tuple[str, ...] = Field(
        (), description="Extra Origin header values accepted; requests without Origin are accepted."
    )
    max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    max_connections: int = Field(
        100, ge=1, description="Concurrent MCP connections (transport sessions), all tokens together."
    )
    max_connections_per_token: int = Field(
        16,
        ge=1,
        description="Concurrent MCP connections per token, so that one tenant cannot take every slot.",
    )
    connection_idle_timeout: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="An MCP connection with no request in flight this long is ended (its client reconnects).",
    )

    @field_validator("tokens", mode="before")
    @classmethod
    def _named_tokens(cls, value: Any) -> Any:
        # A bare string is a token without a name: named by its position, never by its text.
        if isinstance(value, list | tuple):
            return [
                {"name": f"token-{i}", "token": v} if isinstance(v, str) else v
                for i, v in enumerate(value, 1)
            ]
        return value

    @model_validator(mode="after")
    def _distinct(self) -> HttpConfig:
        if len({t.token for t in self.tokens}) != len(self.tokens):
            raise ValueError("the same token is listed twice")
        if len({t.name for t in self.tokens}) != len(self.tokens):
            raise ValueError("two tokens have the same name")
        if self.max_connections_per_token > self.max_connections:
            raise ValueError("max_connections_per_token is above max_connections")
        return self


class ServerConfig(BaseModel):
    """Everything `kodeagent mcp` serves. Every field has a safe default.

    Args:
        backend: where code runs ("host", "docker", "e2b", "ray").
        backend_options: options of that backend, e.g. ``{"isolation": "process"}`` or ``{"image": ...}``.
        policy: what the code may do (imports, builtins, files, network, limits): a `sandboxes.Policy`.
        tools: functions the sandboxed code may call by name, as ``{"name": "pkg.module:function"}``.
            They run in the server process (outside the sandbox), with its rights.
        timeout: seconds per run when the call gives none; `max_timeout` caps what a call may ask.
        output_limit: characters kept of stdout and of stderr per run (head and tail).
        idle_timeout: a session unused this long is closed (its variables and files are gone).
        max_sessions, max_sessions_per_token: open sessions at once, in total and per token (tenant).
        max_file_bytes: the largest file `upload_file` takes or `download_file` returns.
        http: the HTTP transport's settings (ignored on stdio).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: BackendName = "host"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    policy: Policy = Policy()
    tools: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(30.0, gt=0, le=86_400)
    max_timeout: float = Field(300.0, gt=0, le=86_400)
    output_limit: int = Field(64_000, ge=100, le=10_000_000)
    idle_timeout: float = Field(900.0, gt=0)
    max_sessions: int = Field(32, ge=1)
    max_sessions_per_token: int = Field(8, ge=1)
    max_file_bytes: int = Field(1024 * 1024, ge=1)
    http: HttpConfig = HttpConfig()

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_list(cls, value: Any) -> Any:
        # A list of import paths names each tool after its function.
        if isinstance(value, list | tuple):
            return {str(path).rpartition(":")[2].rpartition(".")[2]: path for path in value}
        return value

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"tool name {name!r} must be a Python identifier not starting with '_'")
            module, colon, attribute = path.partition(":")
            if not colon or not module or not attribute:
                raise ValueError(f"tool {name!r}: {path!r} is not an import path 'pkg.module:function'")
        return value

    @model_validator(mode="after")
    def _timeouts(self) -> ServerConfig:
        if self.timeout > self.max_timeout:
            raise ValueError(f"timeout ({self.timeout:g} s) is above max_timeout ({self.max_timeout:g} s)")
        if self.max_sessions_per_token > self.max_sessions:
            raise ValueError("max_sessions_per_token is above max_sessions")
        return self


def network_problem(config: ServerConfig) -> str | None:
    """Why the config's network cannot work on this machine (checked at start, so that the server
    refuses to start rather than fail every run), or None. Only what this process decides: the
    e2b and ray backends apply the policy elsewhere and refuse it at open."""
    if config.policy.network_policy is None or config.backend not in ("host", "docker"):
        return None
    if config.backend == "host" and config.backend_options.get("isolation") == "process":
        return (
            "policy.network: the host backend's 'process' isolation shares this machine's network, so "
            "it cannot hold an egress policy; drop isolation=process (the default picks 'namespaces')"
        )
    from ...egress.service import unavailable

    problem = unavailable()
    return None if problem is None else f"policy.network: {problem}"


def load_config(path: str | pathlib.Path, **overrides: Any) -> ServerConfig:
    """Read a config file (``.json`` or ``.toml``); `overrides` (e.g. from flags) replace its top-level keys."""
    data = read_file(path, McpConfigError)
    return make_config({**data, **overrides}, source=str(path))


def make_config(data: dict[str, Any], source: str = "the settings") -> ServerConfig:
    """Validate settings into a `ServerConfig`; a mistake becomes one `McpConfigError` naming the field."""
    return validate(ServerConfig, data, source, McpConfigError)


def load_tool(name: str, path: str) -> Callable[..., Any]:
    """Import ``pkg.module:function`` (or ``pkg.module:Class.method``) and return the callable."""
    module_name, _, attributes = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # an import error of the user's module, whatever it is
        raise McpConfigError(
            f"tool {name!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})"
        ) from None
    for attribute in attributes.split("."):
        try:
            target = getattr(target, attribute)
        except AttributeError:
            raise McpConfigError(f"tool {name!r}: {module_name!r} has no attribute {attributes!r}") from None
    if not callable(target):
        raise McpConfigError(f"tool {name!r}: {path!r} is not callable")
    function: Callable[..., Any] = target
    return function


def load_tools(config: ServerConfig) -> dict[str, Callable[..., Any]]:
    """The config's tool functions, imported."""
    return {name: load_tool(name, path) for name, path in config.tools.items()}
