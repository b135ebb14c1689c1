"""Tools from an MCP server over stdio: a real server process (`tests/support/mcp_demo_server.py`), its schemas
and its errors as kodeagent tools."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kodeagent import ToolArgumentError, ToolExecutionError, mcp_stdio_tools

pytestmark = pytest.mark.anyio
HERE = Path(__file__).parent / "support"


async def test_mcp_stdio_tools() -> None:
    async with mcp_stdio_tools(
        sys.executable, [str(HERE / "mcp_demo_server.py")], name_prefix="demo_"
    ) as tools:
        by_name = {t.name: t for t in tools}
        assert set(by_name) == {"demo_add", "demo_shout"}
        add = by_name["demo_add"]
        assert add.required == ["a", "b"]
        assert "required" in add.describe()
        assert await add.ainvoke({"a": 2, "b": 40}) == 42
        assert await add.call_from_sandbox(1, 2) == 3
        with pytest.raises(ToolArgumentError, match="b: Field required"):
            await add.ainvoke({"a": 2})
        shout = by_name["demo_shout"]
        assert await shout.ainvoke({"text": "hi"}) == "HI"
        with pytest.raises(ToolExecutionError, match="shout"):
            await shout.ainvoke({"text": "hi", "fail": True})
