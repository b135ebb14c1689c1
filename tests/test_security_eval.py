"""Attack class: code built from strings at runtime.

An allowed `eval`/`exec`/`compile` compiles through the same runtime guard; `typing.get_type_hints`
on string annotations may not compile them unguarded; and the stdlib code generators (dataclasses,
namedtuple), which compile text containing the code's field names, must not turn a crafted field
name into code that runs with the runner's real globals.
"""

from __future__ import annotations

import pytest
from support.security_helpers import ESCAPED, assert_refused, assert_usable, policy, run_once

pytestmark = pytest.mark.anyio

REFUSED = ("PolicyViolation", "PermissionError", "AttributeError", "NameError", "TypeError", "SyntaxError")
EVAL = ("eval", "exec", "compile")

GUARDED_EVAL = {
    "eval subclass walk": f"print('{ESCAPED}', eval('().__class__.__bases__[0].__subclasses__()'))",
    "eval runtime dunder": f"print('{ESCAPED}', eval(\"getattr((), '_' + '_class_' + '_')._\" + '_base__'))",
    "eval import": f"print('{ESCAPED}', eval(\"__import__('os')\"))",
    "eval with own globals": f"print('{ESCAPED}', eval('__builtins__', {{}}))",
    "eval of a banned builtin in own globals": f"print('{ESCAPED}', eval('globals()', {{'__builtins__': {{}}}}))",
    "exec import": f"exec('import os')\nprint('{ESCAPED}')",
    "exec format walk": f"exec(\"x = '{{0.__class__.__base__}}'.format(1)\")\nprint('{ESCAPED}', x)",
    "compile then eval": f"c = compile('().__class__.__base__', '<x>', 'eval')\nprint('{ESCAPED}', eval(c))",
    "eval of a code object": (
        f"def f():\n    pass\nprint('{ESCAPED}', eval(getattr(f, '_' + '_code_' + '_')))"
    ),
    "eval of bytes": f"print('{ESCAPED}', eval(b'().__class__.__base__'))",
    "tampering with the builtins table exec hands out": (
        "d = {}\nexec('x = 1', d)\nt = d['_' + '_builtins_' + '_']\n"
        "t['_write_'] = lambda o: o\nt['_getattr_'] = t['_getitem_'] = lambda o, n: 1\n"
        f"import math\nmath.pi = 3\nprint('{ESCAPED}', math.pi)"
    ),
    "exec frame walk": (f"exec(\"def g():\\n    yield 1\\nprint('{ESCAPED}', g().gi_frame)\")"),
}


@pytest.mark.parametrize("name", sorted(GUARDED_EVAL))
async def test_allowed_eval_is_still_guarded(executor_factory, name: str) -> None:
    result = await run_once(
        executor_factory, GUARDED_EVAL[name], policy=policy("math", allow_builtins=list(EVAL))
    )
    assert_refused(result, *REFUSED)


async def test_allowed_eval_still_evaluates(executor_factory) -> None:
    code = (
        "import math\n"
        "print(eval('1 + 2 * 3'), eval('math.sqrt(16)'), eval('x + 1', {'x': 1}))\n"
        "exec('y = [i * i for i in range(4)]')\nprint(y)\n"
        "print(type(compile('len(y)', '<s>', 'eval')).__name__)\n"
    )
    result = await run_once(executor_factory, code, policy=policy("math", allow_builtins=list(EVAL)))
    assert result.ok, result
    assert result.stdout == "7 4.0 2\n[0, 1, 4, 9]\ncode\n"


async def test_eval_is_refused_unless_allowed(executor_factory) -> None:
    result = await run_once(executor_factory, f"print('{ESCAPED}', eval('1'))", policy=policy())
    assert_refused(result, "PolicyViolation")
    assert "eval" in result.error.message


STRING_ANNOTATIONS = {
    "get_type_hints on a string annotation": (
        "import typing\n"
        'def f(x: "().__class__.__base__.__subclasses__()"):\n    pass\n'
        f"print('{ESCAPED}', typing.get_type_hints(f))"
    ),
    "get_type_hints on a class": (
        "import typing\n"
        "class C:\n    x: \"__import__('os').getpid()\"\n"
        f"print('{ESCAPED}', typing.get_type_hints(C))"
    ),
    "ForwardRef evaluated by hand": (
        "import typing\n"
        "r = typing.ForwardRef(\"__import__('os')\")\n"
        f"print('{ESCAPED}', typing.get_type_hints(type('K', (), {{'__annotations__': {{'a': r}}}})))"
    ),
}


@pytest.mark.parametrize("name", sorted(STRING_ANNOTATIONS))
async def test_string_annotations_are_not_evaluated_unguarded(executor_factory, name: str) -> None:
    result = await run_once(executor_factory, STRING_ANNOTATIONS[name], policy=policy("typing"))
    assert_refused(result, *REFUSED)


async def test_get_type_hints_on_real_annotations_works(executor_factory) -> None:
    code = "import typing\ndef f(x: int, y: list[str]) -> None:\n    pass\nprint(typing.get_type_hints(f))"
    result = await run_once(executor_factory, code, policy=policy("typing"))
    assert result.ok, result
    assert result.stdout == "{'x': <class 'int'>, 'y': list[str], 'return': <class 'NoneType'>}\n"


INJECTED = "__class__,print('" + ESCAPED + "', __import__('os').getpid())"
CODEGEN = {
    "dataclass __eq__ field name": (
        "from dataclasses import dataclass\n"
        "class X:\n    'doc'\n"
        f"    __annotations__ = {{{INJECTED!r}: int}}\n"
        "X = dataclass(X, init=False, repr=False, eq=True)\n"
        "print(X() == X())\n"
    ),
    "dataclass __repr__ field name": (
        "from dataclasses import dataclass\n"
        "class X:\n    'doc'\n"
        "    __annotations__ = {\"x!r}{print('" + ESCAPED + "')}{self.x\": int}\n"
        "X = dataclass(X, init=False, eq=False)\n"
        "x = X()\nx.x = 1\nprint(repr(x))\n"
    ),
    "dataclass annotations set afterwards": (
        "from dataclasses import dataclass\n"
        "class X:\n    'doc'\n"
        f"X.__annotations__ = {{{INJECTED!r}: int}}\n"
        "X = dataclass(X, init=False, repr=False, eq=True)\n"
        "print(X() == X())\n"
    ),
    "dataclass built with type()": (
        "from dataclasses import dataclass\n"
        f"X = type('X', (), {{'__doc__': 'd', '__annotations__': {{{INJECTED!r}: int}}}})\n"
        "X = dataclass(X, init=False, repr=False, eq=True)\n"
        "print(X() == X())\n"
    ),
    "dataclass field renamed after the fact": (
        "from dataclasses import dataclass, fields\n"
        "@dataclass\nclass B:\n    a: int = 0\n"
        f"fields(B)[0].name = {INJECTED!r}\n"
        "@dataclass(eq=True, init=False, repr=False)\nclass C(B):\n    'doc'\n"
        "print(C() == C())\n"
    ),
    "make_dataclass with a bad name": (
        f"import dataclasses\nX = dataclasses.make_dataclass('X', [{INJECTED!r}])\nprint(X(1) == X(1))\n"
    ),
    "namedtuple with a bad field": (
        f"import collections\nP = collections.namedtuple('P', [{INJECTED!r}])\nprint(P(1))\n"
    ),
}


@pytest.mark.parametrize("name", sorted(CODEGEN))
async def test_code_generators_do_not_run_crafted_names(executor_factory, name: str) -> None:
    imports = ("dataclasses", "collections")
    async with executor_factory(policy=policy(*imports), timeout=10) as ex:
        result = await ex.run(CODEGEN[name])
        assert_refused(result, *REFUSED, "ValueError")
        await assert_usable(ex)
