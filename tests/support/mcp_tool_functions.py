"""Tool functions the MCP server tests hand to `kodeagent mcp --tool` (they run in the server process)."""

from __future__ import annotations

import sys


def double(x: int) -> int:
    """Twice x."""
    return x * 2


def noisy(text: str) -> str:
    """Prints to stdout and stderr (which must not reach the MCP channel), then answers."""
    print("NOISE-ON-STDOUT", text)
    sys.stdout.flush()
    print("NOISE-ON-STDERR", text, file=sys.stderr)
    return text.upper()
