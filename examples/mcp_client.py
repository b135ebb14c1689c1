"""Serve the sandbox over MCP (`kodeagent mcp`, stdio) and call it as any MCP client does.

    python examples/mcp_client.py          # pip install -e '.[mcp]'

The client starts the server as a desktop assistant would (the `mcpServers` entry on the MCP page)
and calls `run_python`; variables persist across calls in the caller's default session.
"""

import shutil
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def server() -> StdioServerParameters:
    command = shutil.which("kodeagent")
    args = ["mcp", "--allow-import", "statistics", "--timeout", "30"]
    if command is None:  # not on PATH (e.g. a source checkout): the same command through python -m
        command, args = sys.executable, ["-m", "kodeagent_cli", *args]
    return StdioServerParameters(command=command, args=args)


async def main() -> None:
    async with stdio_client(server()) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        print("tools:", ", ".join(sorted(t.name for t in tools.tools)))
        await session.call_tool("run_python", {"code": "import statistics\nxs = [3, 1, 4, 1, 5]"})
        result = await session.call_tool("run_python", {"code": "statistics.mean(xs)"})
        print("run_python:", result.content[0].text)  # type: ignore[union-attr]


if __name__ == "__main__":
    anyio.run(main)
