"""`ServeConfig`: what `kodeagent serve` holds sandboxes on, whom it lets in, and its limits.

One pydantic model, read from a JSON or TOML file or built from flags, so that a bad setting is
refused with its field's name before anything starts. API keys are the MCP server's tokens
(`TokenConfig`): several keys are several tenants.
"""

from __future__ import annotations

import pathlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..mcp.config import TokenConfig
from ..settings import read_file, validate
from .errors import ServeError
from .limits import InsideLimits

KIB = 1024
MIB = 1024 * KIB


class ServeConfigError(ServeError, ValueError):
    """The server's configuration (a file, a flag, an environment variable) is not valid."""


class ServeConfig(BaseModel):
    """Every setting of `kodeagent serve`; every field has a safe default.

    Args:
        backend: where sandboxes run: "host" (bubblewrap namespaces) or "docker" (a container each).
        backend_options: options of that backend, e.g. ``{"image": ...}`` for Docker.
        host, port: where it listens (loopback by default; port 0 picks one).
        keys: accepted API keys (the SDK's ``E2B_API_KEY``), each a tenant; none: one from
            ``KODEAGENT_SERVE_KEY``, else generated.
        python_guards: run `/execute` with kodeagent's Python guards (off by default: an E2B user
            expects a whole small Linux machine; the OS boundary holds either way).
        internet: whether sandboxes may have internet at all (E2B's default is on); off refuses a
            create asking for it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["host", "docker"] = "host"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    host: str = Field(
        "127.0.0.1", description="Loopback by default; anything else is reachable from the network."
    )
    port: int = Field(49982, ge=0, le=65535)
    keys: tuple[TokenConfig, ...] = ()
    allowed_hosts: tuple[str, ...] = Field((), description="Extra Host header values accepted ('name:port').")
    allowed_origins: tuple[str, ...] = Field((), description="Extra Origin header values accepted.")
    max_control_bytes: int = Field(256 * KIB, ge=KIB, description="Larger control-plane bodies get 413.")
    max_request_bytes: int = Field(
        128 * MIB, ge=KIB, description="Larger in-sandbox request bodies (file writes) get 413."
    )
    inside: InsideLimits = Field(
        default_factory=InsideLimits,
        description="What one request to a sandbox's envd or interpreter may cost (files, calls, cells).",
    )
    max_sandboxes: int = Field(64, ge=1, description="Sandboxes alive at once, every key together.")
    max_sandboxes_per_key: int = Field(16, ge=1, description="Sandboxes alive at once per API key.")
    max_requests_per_key: int = Field(
        64, ge=1, description="Requests in flight at once per API key (more get 429)."
    )
    default_timeout: int = Field(300, ge=1, description="Seconds a sandbox lives when create names none.")
    max_timeout: int = Field(
        86_400, ge=1, description="The longest lifetime a create or set_timeout may ask."
    )
    run_timeout: float = Field(
        3600.0, gt=0, le=86_400, description="The server's own cap on one run inside a sandbox, seconds."
    )
    idle_pause: float = Field(
        600.0,
        ge=0,
        description="A sandbox with no request for this long is paused (no CPU, memory kept) until its next "
        "request; 0: never.",
    )
    durable_home: bool = Field(
        True,
        description="Each sandbox's files live in a directory of the server's that outlives a replaced "
        "session (a run lost to a timeout or a dropped client), as an E2B sandbox's disk does; it costs "
        "the backend's warm pool (a worker or container of its own per sandbox, started ahead: "
        "warm_sandboxes). False: files lost with the session. On Docker the home is bind-mounted, owned by the container's uid (the server must be "
        "root, or that uid).",
    )
    warm_sandboxes: int = Field(
        1,
        ge=0,
        le=16,
        description="With durable_home: sandboxes started ahead, each on its own empty home, for creates "
        "asking the same environment and network as the last one, so a create need not wait for a cold "
        "worker or container (the backend's warm pool cannot serve a home of its own); 0: none.",
    )
    python_guards: bool = False
    internet: bool = True
    shutdown_grace: float = Field(3.0, ge=0, le=60)

    @field_validator("keys", mode="before")
    @classmethod
    def _named_keys(cls, value: Any) -> Any:
        # A bare string is a key without a name: named by its position, never by its text.
        if isinstance(value, list | tuple):
            return [
                {"name": f"key-{i}", "token": v} if isinstance(v, str) else v for i, v in enumerate(value, 1)
            ]
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ServeConfig:
        if len({k.token for k in self.keys}) != len(self.keys):
            raise ValueError("the same key is listed twice")
        if len({k.name for k in self.keys}) != len(self.keys):
            raise ValueError("two keys have the same name")
        if self.max_sandboxes_per_key > self.max_sandboxes:
            raise ValueError("max_sandboxes_per_key is above max_sandboxes")
        if self.default_timeout > self.max_timeout:
            raise ValueError("default_timeout is above max_timeout")
        return self


def load_config(path: str | pathlib.Path, **overrides: Any) -> ServeConfig:
    """Read a config file (``.json`` or ``.toml``); `overrides` (from flags) replace its top-level keys."""
    return make_config({**read_file(path, ServeConfigError), **overrides}, source=str(path))


def make_config(data: dict[str, Any], source: str = "the settings") -> ServeConfig:
    """Validate settings into a `ServeConfig`; a mistake becomes one `ServeConfigError` naming the field."""
    return validate(ServeConfig, data, source, ServeConfigError)
