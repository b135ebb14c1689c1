"""A faithful local stand-in for E2B: control-plane REST API, sandbox proxy and envd, on loopback.

The unmodified `e2b` SDK drives it through its own options (``api_url``, ``sandbox_url``,
``api_key``); commands run as real local processes in a per-sandbox directory. See `server.StandIn`.
"""

from .server import DEFAULT_API_KEY, StandIn

__all__ = ["DEFAULT_API_KEY", "StandIn"]
