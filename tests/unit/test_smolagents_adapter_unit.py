"""The smolagents adapter's pure parts (no worker): what it refuses before a sandbox opens, how it
maps imports and errors, and how the runner cuts a snippet before its last expression."""

from __future__ import annotations

import ast
import importlib.util
import threading

import pytest
from support.needs import in_ci

from sandboxes import ExecutionError, ExecutionResult, Policy
from sandboxes.runtime.cells import split_last_expression

if importlib.util.find_spec("smolagents") is None:  # CI installs the extra: there this is a failure
    reason = "the smolagents adapter needs its extra: pip install 'kodeagent[smolagents]'"
    if in_ci():
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)

import smolagents  # noqa: E402

from sandboxes.adapters.smolagents import (  # noqa: E402
    CodeExecutionError,
    KodeagentExecutor,
    _error_text,
)


def test_the_policy_allows_what_code_agent_announces():
    from smolagents.utils import BASE_BUILTIN_MODULES

    ex = KodeagentExecutor(["numpy", "pandas.*"], policy=Policy(files="none"))
    assert ex.authorized_imports == sorted({*BASE_BUILTIN_MODULES, "numpy", "pandas.*"})
    assert ex.policy.allowed_imports == tuple(ex.authorized_imports)
    assert ex.policy.files == "none"  # the rest of the given policy is kept
    problem = ex.policy.check("import os")
    assert problem is not None and "'os' is not allowed" in problem.message
    assert ex.policy.check("import numpy\nimport pandas.io\nimport queue") is None


def test_imports_are_not_given_twice_and_options_are_checked():
    with pytest.raises(ValueError, match="additional_authorized_imports"):
        KodeagentExecutor(policy=Policy(allowed_imports=["math"]))
    with pytest.raises(TypeError, match="list of module names"):
        KodeagentExecutor("numpy")
    with pytest.raises(TypeError, match="tools"):
        KodeagentExecutor(tools={"f": print})
    with pytest.raises(ValueError, match="module pattern"):
        KodeagentExecutor(["not a module"])


def test_bad_tool_names_are_refused_before_a_session_opens():
    ex = KodeagentExecutor()
    for name in ("ToolError", "_private", "class", "no spaces"):
        with pytest.raises(ValueError, match="tool"):
            ex.send_tools({name: print})
    with pytest.raises(TypeError, match="not callable"):
        ex.send_tools({"f": 3})
    assert ex.isolation == "not started"


def test_variables_the_codec_cannot_carry_are_refused_by_path_and_type_before_a_session():
    ex = KodeagentExecutor()
    for value, part in (
        ({"when": threading.Lock()}, "data['when']: a _thread.lock object cannot enter the sandbox"),
        # a builtin no other test rebinds (`print` may be wrapped by then: its type name changes)
        ([1, len], "data[1]: a builtin_function_or_method object cannot enter the sandbox"),
    ):
        with pytest.raises(TypeError) as info:
            ex.send_variables({"data": value})
        assert part in str(info.value)
    for name in ("final_answer", "_hidden", "for", "PolicyViolation", "not a name"):
        with pytest.raises(ValueError, match=repr(name)):
            ex.send_variables({name: 1})
    assert ex._variables == {}
    assert ex.isolation == "not started"


def test_variables_are_kept_as_the_codecs_copy_of_them():
    ex = KodeagentExecutor()
    original = {"k": (1, [2, {3: None}]), "s": {"é"}, "b": b"\x00"}
    ex.send_variables({"v": original})
    kept = ex._variables["v"]
    assert kept == original and type(kept["k"]) is tuple and type(kept["s"]) is set
    original["k"][1].append(3)
    assert kept["k"][1] == [2, {3: None}]
    assert ex.isolation == "not started"


def test_a_tool_and_a_variable_cannot_share_a_name():
    ex = KodeagentExecutor()
    ex.send_variables({"lookup": 1})  # CodeAgent sends its variables before its tools
    with pytest.raises(ValueError, match="share the names lookup"):
        ex.send_tools({"lookup": print})
    assert ex.isolation == "not started"


def test_error_text_puts_the_output_first_and_keeps_smolagents_import_hint():
    result = ExecutionResult(
        error=ExecutionError(
            type="PolicyViolation", message="import of 'os' is not allowed. Allowed imports: math"
        )
    )
    text = _error_text(result, "partial output")
    assert text.startswith("partial output\nExecuting code yielded an error:\n")
    # smolagents' own words, which CodeAgent looks for to advise the user
    assert "PolicyViolation: Import of os is not allowed. Allowed imports: math" in text
    error = CodeExecutionError(text, result)
    assert isinstance(error, smolagents.local_python_executor.InterpreterError)
    assert isinstance(error, smolagents.utils.AgentError)  # what its remote executors raise
    assert error.result is result and error.message == text


@pytest.mark.parametrize(
    "source",
    [
        "x = 1\nx",
        "x = 1; x + 1",
        "(1 +\n 2)",
        "é = 'é'; é",
        "a = 1\r\nb = 2\r\na + b  # sum\n",
        "print(1)\n# done\n",
    ],
)
def test_the_last_expression_is_cut_off_in_place(source):
    tree = ast.parse(source)
    statements, last = tree.body[:-1], tree.body[-1].value  # type: ignore[attr-defined]
    split = split_last_expression(tree)
    assert split is not None
    body, expression = split
    # The same nodes: each keeps its line and column, so tracebacks point at the code as written.
    assert body.body == statements and expression.body is last
    compile(body, "<cell>", "exec")
    assert (
        eval(compile(expression, "<cell>", "eval"), {"x": 1, "a": 1, "b": 2, "print": str, "é": "é"})
        is not None
    )


@pytest.mark.parametrize("source", ["x = 1", "if x:\n    y", "", "for i in r:\n    i"])
def test_code_not_ending_in_an_expression_is_not_cut(source):
    assert split_last_expression(ast.parse(source)) is None
