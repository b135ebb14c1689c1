"""A tiny MCP server over stdio, for the MCP tool tests: two tools, one of which fails on request."""

from __future__ import annotations

try:  # mcp 2.x
    from mcp.server.mcpserver import MCPServer
except ImportError:  # mcp 1.x named it FastMCP
    from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[no-redef]

app = MCPServer("kodeagent-test")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def shout(text: str, fail: bool = False) -> str:
    """Upper-case a text; with fail=True, raise instead."""
    if fail:
        raise ValueError("asked to fail")
    return text.upper()


if __name__ == "__main__":
    app.run("stdio")
