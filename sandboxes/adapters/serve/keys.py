"""The server's API keys: its config's, else `KODEAGENT_SERVE_KEY`, else one generated in E2B's form
(``e2b_`` and 40 hex digits, so code that checks the form of `E2B_API_KEY` takes it)."""

from __future__ import annotations

import os
import secrets

from ..mcp.config import TokenConfig
from .config import ServeConfig, ServeConfigError

KEY_VARIABLE = "KODEAGENT_SERVE_KEY"


def generate_key() -> str:
    """A new key in E2B's form: ``e2b_`` + 40 hex digits (160 random bits)."""
    return "e2b_" + secrets.token_hex(20)


def with_keys(config: ServeConfig) -> tuple[ServeConfig, str | None]:
    """The config with at least one key: its own, else `KODEAGENT_SERVE_KEY`, else a generated one
    (returned second, to be shown to the user once)."""
    if config.keys:
        return config, None
    given = os.environ.get(KEY_VARIABLE, "").strip()
    key = given or generate_key()
    try:
        keys = (TokenConfig(name="default", token=key),)
    except ValueError as exc:
        raise ServeConfigError(f"{KEY_VARIABLE}: {exc}") from None
    return config.model_copy(update={"keys": keys}), None if given else key
