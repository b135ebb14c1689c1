"""`ExecutionResult.value`: the value of the code's last expression, as a notebook cell has one.

The runner evaluates a trailing expression apart from the statements before it, under the same
guard, and sends back a bounded copy in the values codec's form (docs/values.md) when the codec
carries it within the output limit; else `value` is None, `value_repr` its repr() cut to head and
tail, and `value_error` says why. What the code prints or does must not change.
"""

from __future__ import annotations

import pytest
from support.needs import require

from sandboxes import HostExecutor, Policy
from sandboxes.backends.host import namespaces_available
from sandboxes.runtime.bounds import omission_marker

pytestmark = pytest.mark.anyio


async def test_every_backend_returns_the_last_expression_value(executor_factory):
    async with executor_factory(timeout=20) as ex:
        plain = await ex.run("x = 20\nx + 22")
        mixed = await ex.run("print('a')\n{'k': (1, 2.5, None), 's': 'é'}")
        not_json = await ex.run("{3, 1, 2}")
        statement = await ex.run("y = x")
        raised = await ex.run("x / 0")
        final = await ex.run("final_answer(answer=x)")
    assert (plain.value, plain.stdout) == (42, "")  # the value is not printed
    assert (mixed.value, mixed.stdout) == ({"k": (1, 2.5, None), "s": "é"}, "a\n")
    assert type(mixed.value["k"]) is tuple and not_json.value == {1, 2, 3}  # of their own types
    assert statement.ok and statement.value is None
    assert raised.error is not None and raised.error.type == "ZeroDivisionError" and raised.value is None
    assert (final.has_final_answer, final.final_answer, final.value) == (True, 20, None)


async def _values_and_output(ex: HostExecutor) -> list[tuple[object, str]]:
    found = []
    for code in (
        "n = 6\nn * 7",
        "class K:\n    def __repr__(self):\n        print('repr ran')\n        return 'K()'\nK()",
        "items = [1, 2]; (items,\n len(items))",
    ):
        result = await ex.run(code)
        assert result.ok, result.error
        found.append((result.value, result.value_repr, result.stdout))
    return found


async def test_the_value_with_and_without_the_python_guards():
    # an object the codec does not carry shows as its repr; what __repr__ prints is not the output
    expected = [(42, None, ""), (None, "K()", ""), (([1, 2], 2), None, "")]
    async with HostExecutor(timeout=10) as guarded:
        assert await _values_and_output(guarded) == expected
    require(
        None if namespaces_available() else "bubblewrap cannot create namespaces here", "python_guards=False"
    )
    async with HostExecutor(policy=Policy(python_guards=False), timeout=10) as plain:
        assert plain.isolation == "namespaces"
        assert await _values_and_output(plain) == expected


async def test_output_and_effects_do_not_change():
    async with HostExecutor(timeout=10) as ex:
        calls = await ex.run(
            "log = []\ndef f():\n    log.append(1)\n    print('f')\n    return len(log)\nf()"
        )
        again = await ex.run("log")
    assert (calls.value, calls.stdout) == (1, "f\n")  # the expression ran once
    assert again.value == [1]


async def test_long_values_are_cut_head_and_tail():
    async with HostExecutor(timeout=10, output_limit=1_000) as ex:
        text = await ex.run("'a' * 500 + 'b' * 100_000 + 'z' * 500")
        numbers = await ex.run("list(range(50_000))")
        small = await ex.run("list(range(10))")
    assert text.truncated and text.value == "a" * 500 + omission_marker(100_000) + "z" * 500
    assert numbers.truncated and numbers.value is None and numbers.value_repr is not None
    assert numbers.value_repr.startswith("[0, 1, 2, ") and numbers.value_repr.endswith(", 49998, 49999]")
    assert omission_marker(len(str(list(range(50_000)))) - 1_000) in numbers.value_repr
    assert numbers.value_error is not None and "past the output limit of 1,000" in numbers.value_error
    assert not small.truncated and small.value == list(range(10)) and small.value_repr is None


async def test_errors_in_the_last_expression_point_at_it():
    async with HostExecutor(timeout=10) as ex:
        same_line = await ex.run("y = 1; y / 0")
        later_line = await ex.run("y = 2\n\n(y +\n   undefined_name)")
    assert same_line.error is not None and same_line.error.line == 1
    assert "y = 1; y / 0" in (same_line.error.traceback or "")
    assert later_line.error is not None and later_line.error.type == "NameError"
    assert later_line.error.line == 4


async def test_a_hostile_repr_cannot_break_the_reply_or_end_the_run():
    async with HostExecutor(timeout=10) as ex:
        raising = await ex.run("class A:\n    def __repr__(self):\n        raise ValueError('no')\nA()")
        ending = await ex.run("class B:\n    def __repr__(self):\n        final_answer('sneaky')\nB()")
        after = await ex.run("print('still here')")
    assert raising.ok and raising.value is None and raising.value_repr == "<unprintable value of type A>"
    assert ending.ok and not ending.has_final_answer and ending.final_answer is None
    assert ending.value_repr == "<unprintable value of type B>"
    assert after.stdout == "still here\n"


async def test_a_starred_tuple_has_its_value_and_code_that_does_not_parse_its_error():
    async with HostExecutor(timeout=10) as ex:
        starred = await ex.run("a = [1]\n*a, 2")  # valid as a statement, not as eval() text: split as a tree
        broken = await ex.run("x = (1,\n")
    assert starred.ok and starred.value == (1, 2)
    assert broken.error is not None and broken.error.type == "SyntaxError"


async def test_final_answer_takes_its_value_by_keyword_too():
    async with HostExecutor(timeout=10) as ex:
        by_keyword = await ex.run("final_answer(answer=[1, 2])")
        by_position = await ex.run("final_answer('done')")
        two = await ex.run("final_answer(1, answer=2)")
    assert (by_keyword.has_final_answer, by_keyword.final_answer) == (True, [1, 2])
    assert (by_position.has_final_answer, by_position.final_answer) == (True, "done")
    assert two.error is not None and "takes one value" in two.error.message and not two.has_final_answer
