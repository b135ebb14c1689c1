"""The tools contract, on every backend: a tool runs in the parent with JSON values, a blocking one
cannot outlast the timeout, and a tool's exception keeps its type in the code: a builtin one arrives as a `ToolError` that is also
that builtin (`except KeyError:` and `except ToolError:` both catch it), any other as a plain
`ToolError` naming its class; the bridge's own refusals (`ToolCallRefused`, `ToolResultTooLarge`)
stay plain `ToolError`.

The mapping is by name from a table the runner builds from `builtins`, so the attacks are names: a
tool's own class called `KeyError` must not become the builtin, and no name the parent sends may be
looked up anywhere (`Runner`, `ToolError` itself, a module).
"""

from __future__ import annotations

from typing import Any

import pytest
from support.security_helpers import run_once

from sandboxes import HostExecutor, Policy
from sandboxes.runtime import bounds
from sandboxes.runtime.runner import tools  # the runtime's tool side, as the runner loaded it
from sandboxes.toolbridge import exception_type_name

ToolError, tool_error_class = tools.ToolError, tools.tool_error_class

pytestmark = pytest.mark.anyio


class RateLimited(Exception):
    """A tool's own exception class."""


class KeyError(Exception):  # noqa: A001  # a tool's own class that only shares the builtin's name
    """Not the builtin."""


def lookup(key: str) -> int:
    return {"a": 1}[key]


def parse(text: str) -> int:
    return int(text)


def limited() -> None:
    raise RateLimited("slow down")


def impostor() -> None:
    raise KeyError("not the builtin")


def missing_file() -> None:
    open("/nonexistent/kodeagent-tool-errors")


def huge() -> str:
    return "x" * (bounds.TOOL_MESSAGE_LIMIT + 1)


def long_message() -> None:
    raise ValueError("m" * 100_000)


TOOLS = {
    "lookup": lookup,
    "parse": parse,
    "limited": limited,
    "impostor": impostor,
    "missing_file": missing_file,
    "huge": huge,
    "long_message": long_message,
}

SHOW = "def show(e):\n    print(type(e).__name__, isinstance(e, ToolError), e.args)\n"


async def run_with_tools(executor_factory: Any, code: str) -> str:
    result = await run_once(executor_factory, SHOW + code, tools=TOOLS, timeout=30)
    assert result.ok, result.error
    return result.stdout


async def test_a_tools_key_error_is_caught_by_except_key_error(executor_factory) -> None:
    out = await run_with_tools(
        executor_factory,
        "try:\n    lookup('zz')\nexcept KeyError as e:\n    show(e)\n    print(isinstance(e, LookupError), str(e))\n",
    )
    assert out == (
        "ToolKeyError True (\"tool 'lookup' failed: KeyError: 'zz'\",)\n"
        "True tool 'lookup' failed: KeyError: 'zz'\n"
    )


async def test_a_tools_value_error_is_caught_by_except_value_error_and_except_tool_error(
    executor_factory,
) -> None:
    out = await run_with_tools(
        executor_factory,
        "try:\n    parse('x')\nexcept ValueError as e:\n    show(e)\n"
        "try:\n    parse('y')\nexcept ToolError as e:\n    print(isinstance(e, ValueError), str(e))\n",
    )
    assert out == (
        "ToolValueError True (\"tool 'parse' failed: ValueError: invalid literal for int() with base 10: 'x'\",)\n"
        "True tool 'parse' failed: ValueError: invalid literal for int() with base 10: 'y'\n"
    )


async def test_an_os_error_subclass_keeps_its_place_in_the_hierarchy(executor_factory) -> None:
    out = await run_with_tools(
        executor_factory,
        "try:\n    missing_file()\nexcept OSError as e:\n    show(e)\n    print(isinstance(e, FileNotFoundError))\n",
    )
    first, second = out.splitlines()
    assert first.startswith("ToolFileNotFoundError True (\"tool 'missing_file' failed: FileNotFoundError: ")
    assert second == "True"


async def test_a_tools_own_exception_is_a_plain_tool_error_naming_its_class(executor_factory) -> None:
    out = await run_with_tools(
        executor_factory,
        "for tool in (limited, impostor):\n"
        "    try:\n        tool()\n"
        "    except (KeyError, Exception) as e:\n"
        "        show(e)\n        print(isinstance(e, KeyError))\n",
    )
    assert out == (
        f"ToolError True (\"tool 'limited' failed: {__name__}.RateLimited: slow down\",)\nFalse\n"
        f"ToolError True (\"tool 'impostor' failed: {__name__}.KeyError: not the builtin\",)\nFalse\n"
    )


async def test_an_uncaught_tool_error_names_the_tool_and_the_type(executor_factory) -> None:
    result = await run_once(executor_factory, "lookup('zz')", tools=TOOLS, timeout=30)
    assert result.error is not None
    assert result.error.type == "ToolKeyError"
    assert result.error.message == "tool 'lookup' failed: KeyError: 'zz'"


async def test_the_message_stays_bounded(executor_factory) -> None:
    out = await run_with_tools(
        executor_factory,
        "try:\n    long_message()\nexcept ValueError as e:\n    print(type(e).__name__, len(str(e)))\n",
    )
    name, length = out.split()
    assert name == "ToolValueError"
    assert int(length) < bounds.ERROR_MESSAGE_LIMIT + 200


async def test_a_result_too_large_is_a_plain_tool_error(executor_factory) -> None:
    out = await run_with_tools(
        executor_factory,
        "try:\n    huge()\nexcept ToolError as e:\n    print(type(e) is ToolError, 'ToolResultTooLarge' in str(e))\n",
    )
    assert out == "True True\n"


async def test_a_call_the_parent_refuses_is_a_plain_tool_error() -> None:
    """The code holds its runner (no guards) and tags a call with an ended run: the parent answers
    `ToolCallRefused`, which the code sees as plain `ToolError`."""
    code = (
        "import gc\n"
        "runner = next(o for o in gc.get_objects() if type(o).__name__ == 'Runner' and hasattr(o, 'channel'))\n"
        "runner.channel.run -= 1\n"
        "try:\n    lookup('a')\nexcept ToolError as e:\n    print(type(e) is ToolError, 'ToolCallRefused' in str(e))\n"
        "runner.channel.run += 1\n"
    )
    async with HostExecutor(policy=Policy(python_guards=False), timeout=30, tools=TOOLS) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert result.stdout == "True True\n"


async def test_the_code_cannot_change_a_mapped_class(executor_factory) -> None:
    """`ToolKeyError` belongs to the runner, as `ToolError` does: the guard refuses writes to it."""
    code = (
        "try:\n    lookup('zz')\nexcept KeyError as e:\n    kind = type(e)\n"
        "try:\n    kind.injected = 1\nexcept Exception as e:\n    print(type(e).__name__)\n"
        "try:\n    ToolError.injected = 1\nexcept Exception as e:\n    print(type(e).__name__)\n"
    )
    out = await run_with_tools(executor_factory, code)
    assert out == "PolicyViolation\nPolicyViolation\n"


# ------------------------------------------------------------------------------------ the two halves of the mapping


@pytest.mark.parametrize(
    "name",
    [
        "ToolError",
        "Runner",
        "ToolResultTooLarge",
        "ToolCallRefused",
        "os.system",
        "__import__",
        "sys",
        "",
        "SystemExit",
    ],
)
def test_a_name_outside_the_builtin_exceptions_is_plain_tool_error(name: str) -> None:
    assert tool_error_class(name) is ToolError


def test_builtin_exceptions_map_to_one_class_each_that_is_both() -> None:
    kind = tool_error_class("KeyError")
    assert kind is tool_error_class("KeyError")
    assert issubclass(kind, ToolError) and issubclass(kind, LookupError) and kind.__name__ == "ToolKeyError"
    # One that cannot be made from a message alone stays ToolError rather than failing the call.
    assert tool_error_class("UnicodeDecodeError") is ToolError


def test_the_parent_names_builtins_bare_and_everything_else_by_module() -> None:
    assert exception_type_name(ValueError("x")) == "ValueError"
    assert exception_type_name(KeyError("x")) == f"{__name__}.KeyError"
    assert exception_type_name(RateLimited()) == f"{__name__}.RateLimited"


async def test_tools_run_in_the_parent_with_json_values(executor_factory):
    seen: list[tuple] = []

    def add(a: int, b: int = 0) -> int:
        seen.append((a, b))
        return a + b

    async def lookup(key: str) -> dict:
        return {"key": key, "found": True}

    def broken() -> None:
        raise RuntimeError("backend down")

    tools = {"add": add, "lookup": lookup, "broken": broken}
    code = (
        "print(add(2, b=3))\nprint(lookup('k')['found'])\n"
        "try:\n    broken()\nexcept Exception as exc:\n    print('caught', type(exc).__name__, 'backend down' in str(exc))"
    )
    async with executor_factory(timeout=10, tools=tools) as ex:
        result = await ex.run(code)
    assert result.ok, result.error
    assert result.stdout == "5\nTrue\ncaught ToolRuntimeError True\n"
    assert seen == [(2, 3)]


async def test_a_blocking_sync_tool_cannot_outlast_the_timeout(executor_factory):
    import time

    def slow() -> str:
        time.sleep(5)
        return "late"

    async with executor_factory(timeout=1.5, tools={"slow": slow}) as ex:
        result = await ex.run("print(slow())")
        after = await ex.run("print('next')")
    assert result.timed_out and "late" not in result.stdout
    assert result.tools_running == ["slow"]  # it could not be stopped: the result says so
    assert result.error is not None and "tool 'slow' was still running" in result.error.message
    assert after.stdout == "next\n" and after.tools_running == []
