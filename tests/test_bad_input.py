"""Bad input: every malformed or hostile snippet gives a clear result, the executor stays usable, and
nothing hangs (each session has a short timeout; a hang would show as `timed_out`, which these
tests do not accept)."""

from __future__ import annotations

import pytest
from support.security_helpers import assert_usable

from sandboxes import Policy

pytestmark = pytest.mark.anyio

POLICY = Policy(allowed_imports=["os"])
TEN_MB = 10 * 1024 * 1024


async def check(ex, code, *, error_type: str | None, state_kept: bool = True):
    """Run `code` in a session holding `kept`; check the error type and that the session answers."""
    await ex.run("kept = 'yes'")
    result = await ex.run(code)
    assert not result.timed_out, result
    if error_type is None:
        assert result.ok, result
    else:
        assert result.error is not None and result.error.type == error_type, result
        assert result.error.message or error_type in ("GeneratorExit",), result
    after = await ex.run("print(kept)")
    if state_kept:
        assert not result.state_lost
        assert after.stdout == "yes\n", after
    await assert_usable(ex)
    return result


CASES: dict[str, tuple[str | bytes, str | None]] = {
    "empty": ("", None),
    "whitespace": ("   \n\t\n  \n", None),
    "only a comment": ("# nothing here", None),
    "NUL byte": ("print(1)\x00print(2)", "InvalidCode"),
    "NUL byte in bytes": (b"x = 1\x00", "InvalidCode"),
    "invalid UTF-8 bytes": (b"print('\xff\xfe')", "InvalidCode"),
    "valid UTF-8 bytes": ("print('\u00e9\u4e2d')".encode(), None),
    "lone surrogate printed": ("print('\\ud800')", None),
    "10 MB of code": ("x = 1\n" * (TEN_MB // 6), "InvalidCode"),
    "10 MB string literal": ('s = "' + "a" * TEN_MB + '"', "InvalidCode"),
    "deeply nested parentheses": ("x = " + "(" * 10_000 + "1" + ")" * 10_000, "SyntaxError"),
    "deeply nested lists": ("x = " + "[" * 5_000 + "]" * 5_000, "SyntaxError"),
    "long operator chain": ("x = " + "1 + " * 100_000 + "1", "InvalidCode"),
    "deeply nested not": ("x = " + "not " * 100_000 + "1", "InvalidCode"),
    "deeply nested lambdas": ("f = " + "lambda: " * 1_000 + "1", "RecursionError"),
    "deeply nested blocks": (
        "".join("    " * i + "if True:\n" for i in range(120)) + "    " * 120 + "pass\n",
        "SyntaxError",
    ),
    "syntax error": ("def f(:\n    pass", "SyntaxError"),
    "indentation error": ("if True:\nprint(1)", "SyntaxError"),
    "SystemExit": ("raise SystemExit(3)", "SystemExit"),
    "exit()": ("exit(1)", "PolicyViolation"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    "GeneratorExit": ("raise GeneratorExit", "GeneratorExit"),
    "BaseException": ("raise BaseException('base')", "BaseException"),
    "os._exit": ("import os\nos._exit(0)", "PolicyViolation"),
    "exception with a hostile __str__": (
        "class E(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise E()",
        "E",
    ),
    "exception with a huge message": ("raise ValueError('x' * 10_000_000)", "ValueError"),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_bad_input_gives_a_clear_result(executor_factory, name: str) -> None:
    code, error_type = CASES[name]
    async with executor_factory(policy=POLICY, timeout=10) as ex:
        await check(ex, code, error_type=error_type)


async def test_error_messages_say_what_is_wrong(executor_factory) -> None:
    async with executor_factory(policy=POLICY, timeout=10) as ex:
        nul = await ex.run("x = 1\ny = 2\x00")
        assert "NUL" in nul.error.message and nul.error.line == 2
        utf = await ex.run(b"ok = 1\n\xff")
        assert "UTF-8" in utf.error.message
        big = await ex.run("#" * (2 * 1024 * 1024))
        assert "max_code_bytes" in big.error.message
        syntax = await ex.run("x = 1\ny = (\n")
        assert syntax.error.type == "SyntaxError" and syntax.error.line is not None
        deep = await ex.run("x = " + "not " * 100_000 + "1")
        assert deep.error.message.rstrip(": ") != "the code cannot be parsed"


async def test_larger_code_runs_when_the_limit_allows_it(executor_factory) -> None:
    policy = Policy(allowed_imports=[], max_code_bytes=20 * 1024 * 1024)
    async with executor_factory(policy=policy, timeout=30) as ex:
        result = await ex.run('data = "' + "a" * TEN_MB + '"\nprint(len(data))')
        assert result.ok, result
        assert result.stdout == f"{TEN_MB}\n"


async def test_worker_killing_itself_is_replaced(executor_factory) -> None:
    policy = Policy(allowed_imports=["os", "signal"], subprocess=True)
    async with executor_factory(policy=policy, timeout=10) as ex:
        for code in ("import os\nos.abort()", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"):
            await ex.run("kept = 1")
            result = await ex.run(code)
            assert not result.timed_out
            assert result.state_lost and result.error is not None, result
            assert result.error.type == "WorkerCrashed", result
            after = await ex.run("print('kept' in dir())")
            assert after.ok and after.stdout == "False\n"
            await assert_usable(ex)
        # os._exit is a private attribute, refused before it runs even when processes are allowed:
        # the worker lives on, and so does its state.
        await check(ex, "import os\nos._exit(3)", error_type="PolicyViolation")


async def test_code_of_the_wrong_type_is_a_usage_error(executor_factory) -> None:
    async with executor_factory(policy=POLICY, timeout=10) as ex:
        with pytest.raises(TypeError):
            await ex.run(123)  # type: ignore[arg-type]
        await assert_usable(ex)
