"""What the model reads when code fails: the texts CPython gives, not the sandbox's internals.

A syntax error shows the offending line with a caret under the problem (as CPython's traceback
does); a refused name shows the line too. An error the guarded code raises reads as the same code's
error in plain CPython: each case runs in two real workers, one with the Python-level guards and one
without (`python_guards=False`, plain CPython), and the last line of both tracebacks must match.
"""

from __future__ import annotations

import pytest

from sandboxes import HostExecutor, Policy

pytestmark = pytest.mark.anyio

SAME_AS_CPYTHON = {
    "** of a non-mapping": "def g(**kw):\n    return kw\ng(**1)",
    "* of a non-iterable": "def g(*a):\n    return a\ng(*1)",
    "* into a builtin": "print(*1)",
    "** into a builtin": "dict(**[1])",
    "getattr without arguments": "getattr()",
    "getattr with one argument": "getattr(1)",
    "getattr with four arguments": "getattr(1, 'real', 2, 3)",
    "getattr of a non-str name": "getattr(1, 2)",
    "hasattr with one argument": "hasattr(1)",
    "setattr with four arguments": "class A: pass\nsetattr(A(), 'x', 1, 2)",
    "delattr with one argument": "delattr(1)",
    "unpacking a non-iterable": "a, b = 1",
    "unpacking too many": "a, b = 1, 2, 3",
    "unpacking too few": "a, b, c = [1]",
    "unpacking in a for loop": "for a, b in [1]:\n    pass",
    "unpacking in a comprehension": "[a for a, b in [1]]",
    "starred unpacking": "a, *b = 1",
    "nested unpacking": "(a, b), c = 1, 2",
    "format without arguments": "'{}'.format()",
    "format index out of range": "'{1}'.format(0)",
    "format of a missing key": "'{a}'.format()",
    "str.format on a non-str": "str.format(1)",
    "user function arity": "def f(x):\n    pass\nf()",
    "method arity": "class A:\n    def m(self, y):\n        pass\nA().m()",
    "in-place on a missing attribute": "class A: pass\na = A()\na.y += 1",
    "in-place type error": "x = [1]\nx[0] += 'a'",
}


def last_line(result) -> str:
    assert result.error is not None, result
    return (result.error.traceback or str(result.error)).rstrip("\n").splitlines()[-1]


async def test_guarded_errors_read_as_cpythons_own():
    async with (
        HostExecutor(timeout=20) as guarded,
        HostExecutor(timeout=20, policy=Policy(python_guards=False)) as plain,
    ):
        differ = {}
        for name, code in SAME_AS_CPYTHON.items():
            ours, cpython = last_line(await guarded.run(code)), last_line(await plain.run(code))
            if ours != cpython:
                differ[name] = (ours, cpython)
    assert differ == {}


async def test_a_guard_error_names_the_users_function_not_the_guards_internals():
    async with HostExecutor(timeout=20) as ex:
        result = await ex.run("def f(**kw):\n    return kw\nf(**[1])")
        passed = await ex.run("def f(*a, **kw):\n    return a, kw\nf(*[1, 2], **{'k': 3})")
    text = result.error.traceback
    assert "f() argument after ** must be a mapping, not list" in text
    assert "_kodeagent" not in text and "Guard" not in text and "<lambda>" not in text
    assert passed.ok and passed.value == ((1, 2), {"k": 3})


async def test_getattr_with_too_many_arguments_is_refused_as_cpython_refuses_it():
    async with HostExecutor(timeout=20) as ex:
        result = await ex.run("getattr(1, 'nope', 'default', 'extra')")
        default = await ex.run("getattr(1, 'nope', 'default')")
    assert result.error is not None and result.error.type == "TypeError"
    assert result.error.message == "getattr expected at most 3 arguments, got 4"
    assert default.value == "default"


@pytest.mark.parametrize("python_guards", [True, False], ids=["guarded", "plain"])
async def test_a_syntax_error_shows_the_line_with_a_caret(python_guards):
    async with HostExecutor(timeout=20, policy=Policy(python_guards=python_guards)) as ex:
        result = await ex.run('x = 1\nprint("Missing parenthesis')
    error = result.error
    assert error is not None and error.type == "SyntaxError" and error.line == 2
    lines = error.traceback.splitlines()
    assert lines[-3:] == [
        '    print("Missing parenthesis',
        "          ^",
        "SyntaxError: unterminated string literal (detected at line 2)",
    ]
    assert lines[-4].endswith(", line 2")


async def test_an_indentation_error_keeps_its_name_and_underlines_the_statement():
    async with HostExecutor(timeout=20) as ex:
        result = await ex.run("if True:\nprint(1)")
    assert result.error.type == "SyntaxError"  # the platform's kind; the text names the real class
    assert result.error.traceback.splitlines()[-3:] == [
        "    print(1)",
        "    ^^^^^",
        "IndentationError: expected an indented block after 'if' statement on line 1",
    ]


async def test_a_syntax_error_on_a_huge_line_shows_a_window_of_it():
    code = "x = [" + "1, " * 50_000 + "2 3]"
    async with HostExecutor(timeout=20) as ex:
        result = await ex.run(code)
    text = result.error.traceback
    assert len(text) < 600
    source, caret = text.splitlines()[-3:-1]
    assert source.startswith("    ...") and "2 3]" in source
    assert source[caret.index("^")] in "23"  # the caret is under the problem in the window


async def test_a_refused_name_shows_its_line_and_marks_the_expression():
    async with HostExecutor(timeout=20) as ex:
        result = await ex.run("y = 'é'\nz = ().__subclasses__")
    error = result.error
    assert error.type == "PolicyViolation" and error.line == 2
    assert error.traceback.splitlines()[-3:] == [
        "    z = ().__subclasses__",
        "        ^^^^^^^^^^^^^^^^^",
        "PolicyViolation: access to the attribute '__subclasses__' is not allowed",
    ]


async def test_exec_of_bad_text_raises_a_syntax_error_the_code_can_catch():
    policy = Policy(allow_builtins=["exec"])
    async with HostExecutor(timeout=20, policy=policy) as ex:
        caught = await ex.run(
            "try:\n    exec('y = (')\nexcept SyntaxError as e:\n    print('caught', e.lineno)"
        )
        raised = await ex.run("exec('y = (')")
    assert caught.stdout == "caught 1\n"
    text = raised.error.traceback
    assert raised.error.type == "SyntaxError"
    assert text.splitlines()[-3:] == ["    y = (", "        ^", "SyntaxError: '(' was never closed"]
    assert 'File "<cell' in text  # the call in the code, then where the text failed


async def test_a_timeout_says_what_happened_and_what_was_lost():
    async with HostExecutor(timeout=1) as ex:
        result = await ex.run("while True:\n    pass")
    assert result.timed_out and result.state_lost
    assert str(result.error) == (
        "Timeout: the code ran longer than 1 s and was stopped; variables from earlier runs are lost"
    )
