"""Attack class: dunder access, subclass walking and frame walking.

The classic escapes go from any value to `object.__subclasses__()`, a function's `__globals__`, or a
frame (`gi_frame`, `tb_frame`, `f_back`) and from there to the real builtins. Each snippet prints
ESCAPED only if the step that matters succeeded; names are also built at runtime so that the static
check cannot see them and only the runtime guard stands in the way.
"""

from __future__ import annotations

import pytest
from support.security_helpers import ESCAPED, assert_refused, policy, run_once

pytestmark = pytest.mark.anyio

REFUSED = ("PolicyViolation", "AttributeError", "NameError", "TypeError", "PermissionError")

D = "'_' + '_'"  # builds a dunder at runtime: f"{D} + 'class' + {D}" is '__class__'

ATTACKS = {
    "subclasses literal": f"print('{ESCAPED}', ().__class__.__bases__[0].__subclasses__())",
    "subclasses via getattr at runtime": (
        f"c = getattr((), {D} + 'class' + {D})\n"
        f"b = getattr(c, {D} + 'base' + {D})\n"
        f"print('{ESCAPED}', getattr(b, {D} + 'subclasses' + {D})())"
    ),
    "type.__subclasses__": f"print('{ESCAPED}', type.__subclasses__(object))",
    "mro via runtime name": f"print('{ESCAPED}', getattr(int, 'm' + 'ro')())",
    "__mro__ via runtime name": f"print('{ESCAPED}', getattr(int, {D} + 'mro' + {D}))",
    "vars()": f"print('{ESCAPED}', vars())",
    "globals()": f"print('{ESCAPED}', globals())",
    "locals()": f"print('{ESCAPED}', locals())",
    "__builtins__": f"print('{ESCAPED}', __builtins__)",
    "function __globals__": f"def f():\n    pass\nprint('{ESCAPED}', f.__globals__)",
    "function __globals__ at runtime": (
        f"def f():\n    pass\nprint('{ESCAPED}', getattr(f, {D} + 'globals' + {D}))"
    ),
    "method __func__ / __self__": (
        f"class A:\n    def m(self):\n        pass\nprint('{ESCAPED}', getattr(A().m, {D} + 'func' + {D}))"
    ),
    "builtin __self__ (the builtins module)": f"print('{ESCAPED}', getattr(len, {D} + 'self' + {D}))",
    "function __code__": f"def f():\n    pass\nprint('{ESCAPED}', getattr(f, {D} + 'code' + {D}))",
    "closure cells": (
        "def outer():\n    x = 1\n    def inner():\n        return x\n    return inner\n"
        f"print('{ESCAPED}', getattr(outer(), {D} + 'closure' + {D}))"
    ),
    "generator gi_frame": (f"def g():\n    yield 1\nprint('{ESCAPED}', g().gi_frame.f_globals)"),
    "generator gi_frame at runtime": (
        "def g():\n    yield 1\n"
        f"fr = getattr(g(), 'gi_' + 'frame')\nprint('{ESCAPED}', getattr(fr, 'f_' + 'globals'))"
    ),
    "generator gi_code": "def g():\n    yield 1\n" + f"print('{ESCAPED}', getattr(g(), 'gi_' + 'code'))",
    "coroutine cr_frame": (
        f"async def c():\n    pass\nco = c()\nprint('{ESCAPED}', getattr(co, 'cr_' + 'frame'))"
    ),
    "exception __traceback__": (
        f"try:\n    1 / 0\nexcept Exception as e:\n    print('{ESCAPED}', e.__traceback__.tb_frame)"
    ),
    "exception __traceback__ at runtime": (
        "try:\n    1 / 0\nexcept Exception as e:\n"
        f"    tb = getattr(e, {D} + 'traceback' + {D})\n"
        f"    print('{ESCAPED}', getattr(tb, 'tb_' + 'frame'))"
    ),
    "traceback given to __exit__": (
        "class C:\n"
        "    def __enter__(self):\n        return self\n"
        "    def __exit__(self, kind, exc, tb):\n"
        f"        print('{ESCAPED}', getattr(tb, 'tb_' + 'frame').f_back)\n"
        "        return True\n"
        "with C():\n    1 / 0\n"
    ),
    "traceback given to __aexit__": (
        "class C:\n"
        "    async def __aenter__(self):\n        return self\n"
        "    async def __aexit__(self, kind, exc, tb):\n"
        f"        print('{ESCAPED}', getattr(tb, 'tb_' + 'frame'))\n"
        "        return True\n"
        "async def main():\n    async with C():\n        1 / 0\n"
        "main().send(None)\n"
    ),
    "suspended coroutine cr_frame": (
        "class T:\n    def __await__(self):\n        yield\n"
        "async def c():\n    await T()\n"
        f"co = c()\nco.send(None)\nprint('{ESCAPED}', getattr(co, 'cr_' + 'frame'))"
    ),
    "what a coroutine awaits (cr_await)": (
        "class T:\n    def __await__(self):\n        yield\n"
        "async def c():\n    await T()\n"
        f"co = c()\nco.send(None)\nprint('{ESCAPED}', getattr(co, 'cr_' + 'await'))"
    ),
    "async generator ag_frame": (
        f"async def g():\n    yield 1\nprint('{ESCAPED}', getattr(g(), 'ag_' + 'frame'))"
    ),
    "async generator ag_code": f"async def g():\n    yield 1\nprint('{ESCAPED}', getattr(g(), 'ag_' + 'code'))",
    "descriptor __set__ read at runtime (a write past _write_)": (
        f"s = getattr(property(lambda self: 1, lambda self, v: None), {D} + 'set' + {D})\n"
        f"print('{ESCAPED}', s)"
    ),
    "defining __get__ (a descriptor)": (
        f"class D:\n    def __get__(self, obj, owner):\n        print('{ESCAPED}', owner)\n"
        "class K:\n    d = D()\nK().d\n"
    ),
    "defining __set__": (
        f"class D:\n    def __set__(self, obj, value):\n        print('{ESCAPED}')\n"
        "class K:\n    d = D()\nK().d = 1\n"
    ),
    "defining __set_name__": (
        f"class D:\n    def __set_name__(self, owner, name):\n        print('{ESCAPED}', owner)\n"
        "class K:\n    d = D()\n"
    ),
    "defining __init_subclass__": (
        f"class B:\n    def __init_subclass__(cls, **kw):\n        print('{ESCAPED}', cls)\n"
        "class K(B):\n    pass\n"
    ),
    "defining __class_getitem__": (
        f"class K:\n    def __class_getitem__(cls, item):\n        print('{ESCAPED}', item)\nK[int]\n"
    ),
    "__reduce_ex__": f"print('{ESCAPED}', getattr(1, {D} + 'reduce_ex' + {D})(2))",
    "__dict__ of a class": f"print('{ESCAPED}', getattr(int, {D} + 'dict' + {D}))",
    "__getattribute__": f"print('{ESCAPED}', getattr(object, {D} + 'getattribute' + {D})(1, 'real'))",
    "object.__setattr__ on a module": (
        f"import math\nsa = getattr(object, {D} + 'setattr' + {D})\nsa(math, 'pi', 3)\nprint('{ESCAPED}', math.pi)"
    ),
    "setattr on a module": f"import math\nsetattr(math, 'pi', 3)\nprint('{ESCAPED}', math.pi)",
    "assignment to a module attribute": f"import math\nmath.pi = 3\nprint('{ESCAPED}', math.pi)",
    "metaclass": f"class M(type):\n    pass\nclass A(metaclass=M):\n    pass\nprint('{ESCAPED}')",
    "defining reserved names": f"_getattr_ = lambda o, n: 1\nprint('{ESCAPED}')",
    "str subclass name tricks": (
        "class S(str):\n"
        "    def startswith(self, *a):\n        return False\n"
        "    def endswith(self, *a):\n        return False\n"
        "    def __hash__(self):\n        return 1\n"
        "    def __eq__(self, other):\n        return False\n"
        "def f():\n    pass\n"
        f"print('{ESCAPED}', getattr(f, S({D} + 'globals' + {D})))"
    ),
    "hasattr probing a dunder": (
        f"def f():\n    pass\nif hasattr(f, {D} + 'globals' + {D}):\n    print('{ESCAPED}')\nraise SystemError('probe')"
    ),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_object_graph_walks_are_refused(executor_factory, name: str) -> None:
    result = await run_once(executor_factory, ATTACKS[name], policy=policy("math"))
    assert_refused(result, *REFUSED, "SystemError")


async def test_safe_dunders_still_work(executor_factory) -> None:
    code = (
        "class P:\n"
        "    def __init__(self, x):\n        self.x = x\n"
        "    def __repr__(self):\n        return f'P({self.x})'\n"
        "    def __eq__(self, other):\n        return self.x == other.x\n"
        "p = P(2)\n"
        "print(p, p.__class__.__name__, type(p).__qualname__, P.__init__.__name__, p == P(2))\n"
        "print(len.__name__, (1).__class__, __name__)\n"
    )
    result = await run_once(executor_factory, code, policy=policy())
    assert result.ok, result
    assert result.stdout == "P(2) P P __init__ True\nlen <class 'int'> __main__\n"
