"""Tools: schemas from type hints and docstrings, validation before the call, sync/async (tools from
an MCP server: `tests/test_tools_mcp.py`)."""

from __future__ import annotations

import threading
from typing import Literal

import anyio
import pytest
from pydantic import BaseModel

from kodeagent import Tool, ToolArgumentError, ToolDefinitionError, tool
from kodeagent.tools import as_tool, parse_docstring, to_jsonable

pytestmark = pytest.mark.anyio


@tool
def get_price(symbol: str, days: int = 1) -> float:
    """Latest price of a stock. Args: symbol: ticker, e.g. AAPL. days: how many days to average."""
    return {"AAPL": 200.0, "MSFT": 410.5}[symbol] * days


def convert(amount: float, unit: Literal["m", "km"] = "m", tags: list[str] | None = None) -> dict:
    """Convert a distance.

    Args:
        amount (float): the distance, in metres.
        unit: the target unit.
            Either metres or kilometres.
        tags: labels to carry along.

    Returns:
        The converted value.
    """
    return {"value": amount / 1000 if unit == "km" else amount, "tags": tags or []}


def test_schema_from_hints_and_one_line_docstring() -> None:
    schema = get_price.openai_schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "get_price"
    assert function["description"] == "Latest price of a stock."
    params = function["parameters"]
    assert params["required"] == ["symbol"]
    assert params["properties"]["symbol"] == {"type": "string", "description": "ticker, e.g. AAPL."}
    assert params["properties"]["days"]["type"] == "integer"
    assert params["properties"]["days"]["default"] == 1
    assert params["additionalProperties"] is False


def test_plain_function_google_docstring() -> None:
    t = as_tool(convert)
    props = t.parameters["properties"]
    assert t.description == "Convert a distance."
    assert props["amount"]["description"] == "the distance, in metres."
    assert props["unit"]["description"] == "the target unit. Either metres or kilometres."
    assert props["unit"]["enum"] == ["m", "km"]
    assert t.required == ["amount"]
    assert "Returns" not in props["tags"]["description"]


def test_sphinx_docstring() -> None:
    summary, params = parse_docstring("Do it.\n\n:param x: the x value\n:param y: the y value\n", ["x", "y"])
    assert summary == "Do it."
    assert params == {"x": "the x value", "y": "the y value"}


def test_description_marks_required_arguments() -> None:
    text = get_price.describe()
    assert "symbol (string, required)" in text
    assert "days (integer, optional, default 1)" in text


def test_decorated_function_still_callable_directly() -> None:
    assert get_price("AAPL") == 200.0
    assert get_price.__name__ == "get_price"
    assert get_price.__doc__ and "Latest price" in get_price.__doc__


def test_validation_reports_every_problem() -> None:
    with pytest.raises(ToolArgumentError) as info:
        get_price.validate({"days": "many", "extra": 1})
    message = str(info.value)
    assert "symbol: Field required" in message
    assert "days:" in message
    assert "extra:" in message


def test_validation_accepts_json_text_and_coerces() -> None:
    assert get_price.validate('{"symbol": "AAPL", "days": "2"}') == {"symbol": "AAPL", "days": 2}
    with pytest.raises(ToolArgumentError, match="not valid JSON"):
        get_price.validate("{symbol: AAPL")
    with pytest.raises(ToolArgumentError, match="must be a JSON object"):
        get_price.validate("[1, 2]")


async def test_sync_tool_runs_in_a_worker_thread() -> None:
    seen: list[int] = []

    def where() -> str:
        """Record the calling thread."""
        seen.append(threading.get_ident())
        return "ok"

    assert await as_tool(where).ainvoke({}) == "ok"
    assert seen and seen[0] != threading.get_ident()


async def test_async_tool_and_pydantic_arguments() -> None:
    class Point(BaseModel):
        x: int
        y: int

    @tool
    async def norm1(p: Point) -> int:
        """Manhattan norm of a point."""
        await anyio.sleep(0)
        return abs(p.x) + abs(p.y)

    assert norm1.is_async
    assert await norm1.ainvoke({"p": {"x": 3, "y": -4}}) == 7
    with pytest.raises(ToolArgumentError, match=r"p\.y"):
        await norm1.ainvoke({"p": {"x": 3}})


async def test_sandbox_calls_map_positional_arguments() -> None:
    assert await get_price.call_from_sandbox("MSFT", 2) == 821.0
    with pytest.raises(ToolArgumentError, match="two values"):
        await get_price.call_from_sandbox("MSFT", symbol="AAPL")
    with pytest.raises(ToolArgumentError, match="at most 2"):
        await get_price.call_from_sandbox("MSFT", 1, 3)


def test_results_become_json() -> None:
    class P(BaseModel):
        a: int

    assert to_jsonable(P(a=1)) == {"a": 1}
    assert to_jsonable({"s": {1, 2}}) in ({"s": [1, 2]}, {"s": [2, 1]})
    assert to_jsonable(object()).startswith("<object object")


def test_bad_tool_definitions() -> None:
    with pytest.raises(ToolDefinitionError):
        Tool(lambda *items: None)
    with pytest.raises(ToolDefinitionError, match="identifier"):
        Tool(get_price.func, name="get-price")
    with pytest.raises(ToolDefinitionError):
        Tool(42)  # type: ignore[arg-type]


def test_python_signature_for_codeact() -> None:
    assert get_price.python_signature() == "get_price(symbol: str, days: int = 1) -> float"
    t = as_tool(convert)
    assert t.python_signature() == (
        "convert(amount: float, unit: Literal['m', 'km'] = 'm', tags: list[str] | None = None) -> dict"
    )
    assert get_price.describe(style="python").startswith("- `get_price(symbol: str, days: int = 1) -> float`")
