"""Attack class: format-string tricks.

`str.format` resolves ``{0.attr}`` and ``{0[key]}`` in C, below any attribute guard. Every way to
reach it (a literal, `str.format` unbound, `format_map`, `super(S, s).format`, `map`, a stored bound
method) must go through the guard; `string.Formatter` and `operator.attrgetter`/`methodcaller`, which
do the same walk in Python without the guard, are refused even when their module is allowed.
"""

from __future__ import annotations

import pytest
from support.security_helpers import ESCAPED, assert_refused, policy, run_once

pytestmark = pytest.mark.anyio

REFUSED = ("PolicyViolation", "AttributeError", "TypeError")
WALK = "{0.__class__.__base__.__subclasses__}"

ATTACKS = {
    "literal format": ((), f"s = '{WALK}'.format(1)\nprint('{ESCAPED}', s)"),
    "format of a variable": ((), f"t = '{WALK}'\nprint('{ESCAPED}', t.format(1))"),
    "unbound str.format": ((), f"print('{ESCAPED}', str.format('{WALK}', 1))"),
    "format_map": (
        (),
        f"print('{ESCAPED}', '{{x.__class__.__base__.__subclasses__}}'.format_map({{'x': 1}}))",
    ),
    "unbound str.format_map": (
        (),
        f"print('{ESCAPED}', str.format_map('{{x.__class__.__base__.__subclasses__}}', {{'x': 1}}))",
    ),
    "map(str.format)": ((), f"print('{ESCAPED}', list(map(str.format, ['{WALK}'], [1])))"),
    "stored bound method": ((), f"f = '{WALK}'.format\nprint('{ESCAPED}', f(1))"),
    "super(S, s).format": (
        (),
        f"class S(str):\n    pass\ns = S('{WALK}')\nprint('{ESCAPED}', super(S, s).format(1))",
    ),
    "str subclass format": ((), f"class S(str):\n    pass\nprint('{ESCAPED}', S('{WALK}').format(1))"),
    "getattr(str, 'format')": ((), f"print('{ESCAPED}', getattr(str, 'for' + 'mat')('{WALK}', 1))"),
    "index into globals": (
        (),
        f"def f():\n    pass\nprint('{ESCAPED}', '{{0.__globals__}}'.format(f))",
    ),
    "frame through a generator": (
        (),
        f"def g():\n    yield 1\nprint('{ESCAPED}', '{{0.gi_frame.f_globals}}'.format(g()))",
    ),
    "module private through format": (
        ("random",),
        f"import random\nprint('{ESCAPED}', '{{0._os}}'.format(random))",
    ),
    "module through format item": (
        ("typing",),
        f"import typing\nprint('{ESCAPED}', '{{0[m].sys}}'.format({{'m': typing}}))",
    ),
    "string.Formatter": (
        ("string",),
        f"import string\nprint('{ESCAPED}', string.Formatter().format('{WALK}', 1))",
    ),
    "from string import Formatter": (
        ("string",),
        f"from string import Formatter\nprint('{ESCAPED}', Formatter().vformat('{WALK}', (1,), {{}}))",
    ),
    "operator.attrgetter": (
        ("operator",),
        f"import operator\nprint('{ESCAPED}', operator.attrgetter('__class__.__base__')(1))",
    ),
    "from operator import attrgetter": (
        ("operator",),
        f"from operator import attrgetter\nprint('{ESCAPED}', attrgetter('__class__.__base__')(1))",
    ),
    "operator.methodcaller": (
        ("operator",),
        f"import operator\nprint('{ESCAPED}', operator.methodcaller('__reduce_ex__', 2)(1))",
    ),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_format_string_walks_are_refused(executor_factory, name: str) -> None:
    imports, code = ATTACKS[name]
    result = await run_once(executor_factory, code, policy=policy(*imports))
    assert_refused(result, *REFUSED)


async def test_ordinary_formatting_works(executor_factory) -> None:
    code = (
        "import string\n"
        "class P:\n    def __init__(self):\n        self.x = 3\n"
        "p = P()\n"
        "print('{} {:>4} {x}'.format(1, 'ab', x=2), '{0}{1}{0}'.format('a', 'b'))\n"
        "print('{p.x} {d[k]} {l[1]}'.format(p=p, d={'k': 'v'}, l=[5, 6]))\n"
        "print('{a}-{b}'.format_map({'a': 1, 'b': 2}), str.format('{}!', 'hi'))\n"
        "print(f'{p.x:03d} {3.14159:.2f}', '%s=%d' % ('n', 4), format(255, 'x'))\n"
        "print(string.Template('$who is $what').substitute(who='it', what='fine'))\n"
    )
    result = await run_once(executor_factory, code, policy=policy("string"))
    assert result.ok, result
    assert result.stdout == "1   ab 2 aba\n3 v 6\n1-2 hi!\n003 3.14 n=4 ff\nit is fine\n"
