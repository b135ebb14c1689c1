"""The protocols a class may define: each allowed dunder is accepted by both checks (the static policy
and the runtime guard) and the interpreter or the library really uses it (`x <<= 1` calls
`__ilshift__`, `math.floor(x)` calls `__floor__`, `async with` calls `__aenter__`...).

The hooks into attribute and class machinery that stay out (`__get__`, `__set_name__`...) are refused:
that half lives with the other attacks in the corpus (`benchmarks/corpus/introspection.toml`).
"""

from __future__ import annotations

import pytest
from support.security_helpers import run_once

from sandboxes.policy import DEFAULT_ALLOWED_DUNDERS

pytestmark = pytest.mark.anyio

BINARY = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "matmul": "@",
    "truediv": "/",
    "floordiv": "//",
    "mod": "%",
    "pow": "**",
    "lshift": "<<",
    "rshift": ">>",
    "and": "&",
    "or": "|",
    "xor": "^",
}
"""The data model's binary operators written as operators (divmod, the fourteenth, is a builtin)."""

NUMERIC_PROTOCOL = (
    *(f"__{op}__" for op in [*BINARY, "divmod"]),
    *(f"__r{op}__" for op in [*BINARY, "divmod"]),
    *(f"__i{op}__" for op in BINARY),
    *("__neg__", "__pos__", "__abs__", "__invert__"),
    *("__complex__", "__int__", "__float__", "__index__"),
    *("__round__", "__trunc__", "__floor__", "__ceil__"),
)
"""Python's data model, "Emulating numeric types", in full."""

OTHER_PROTOCOLS = (
    *("__aenter__", "__aexit__", "__aiter__", "__anext__", "__await__"),
    *("__bytes__", "__length_hint__", "__copy__", "__deepcopy__"),
)

DRIVE = """
def drive(coroutine):
    # Runs a coroutine to its end without an event loop: each await of a Ticker yields once.
    ticks = 0
    try:
        while True:
            coroutine.send(None)
            ticks += 1
    except StopIteration as stop:
        return stop.value, ticks
"""


def binary_case(op: str, symbol: str) -> tuple[str, str]:
    """A class with `__op__`, `__rop__` and `__iop__`, each used through the operator."""
    code = (
        "class N:\n"
        f"    def __{op}__(self, other):\n        return 'forward'\n"
        f"    def __r{op}__(self, other):\n        return 'reflected'\n"
        f"    def __i{op}__(self, other):\n        return 'in place'\n"
        "x = N()\n"
        f"print(x {symbol} 1, 1 {symbol} x, sep=', ')\n"
        f"x {symbol}= 1\nprint(x)\n"
        f"class Box:\n    def __init__(self):\n        self.n = N()\n"
        f"b = Box()\nb.n {symbol}= 1\nitems = [N()]\nitems[0] {symbol}= 1\nprint(b.n, items[0], sep=', ')\n"
    )
    return code, "forward, reflected\nin place\nin place, in place\n"


CASES: dict[str, tuple[str, str]] = {
    f"binary {op} ({symbol})": binary_case(op, symbol) for op, symbol in BINARY.items()
}
CASES["divmod and its reflection"] = (
    "class N:\n"
    "    def __divmod__(self, other):\n        return ('q', 'r')\n"
    "    def __rdivmod__(self, other):\n        return ('rq', 'rr')\n"
    "print(divmod(N(), 7), divmod(7, N()))\n",
    "('q', 'r') ('rq', 'rr')\n",
)
CASES["unary and conversions"] = (
    "class N:\n"
    "    def __neg__(self):\n        return 'neg'\n"
    "    def __pos__(self):\n        return 'pos'\n"
    "    def __abs__(self):\n        return 'abs'\n"
    "    def __invert__(self):\n        return 'invert'\n"
    "    def __int__(self):\n        return 4\n"
    "    def __float__(self):\n        return 4.5\n"
    "    def __complex__(self):\n        return 1j\n"
    "    def __index__(self):\n        return 2\n"
    "n = N()\n"
    "print(-n, +n, abs(n), ~n, int(n), float(n), complex(n), [10, 20, 30][n], bin(n))\n",
    "neg pos abs invert 4 4.5 1j 30 0b10\n",
)
CASES["rounding: math.floor, math.ceil, math.trunc, round"] = (
    "import math\n"
    "class Money:\n"
    "    def __init__(self, cents):\n        self.cents = cents\n"
    "    def __floor__(self):\n        return self.cents // 100\n"
    "    def __ceil__(self):\n        return -(-self.cents // 100)\n"
    "    def __trunc__(self):\n        return int(self.cents / 100)\n"
    "    def __round__(self, digits=None):\n        return ('round', digits)\n"
    "m = Money(-250)\n"
    "print(math.floor(m), math.ceil(m), math.trunc(m), round(m), round(m, 1))\n",
    "-3 -2 -2 ('round', None) ('round', 1)\n",
)
CASES["await (__await__)"] = (
    DRIVE + "class Ticker:\n"
    "    def __await__(self):\n        yield 'tick'\n        return 'woken'\n"
    "async def main():\n    first = await Ticker()\n    second = await Ticker()\n    return first, second\n"
    "print(drive(main()))\n",
    "(('woken', 'woken'), 2)\n",
)
CASES["async with (__aenter__, __aexit__)"] = (
    DRIVE + "seen = []\n"
    "class Resource:\n"
    "    async def __aenter__(self):\n        seen.append('enter')\n        return 'resource'\n"
    "    async def __aexit__(self, kind, exc, tb):\n"
    "        seen.append((kind.__name__ if kind else None, str(exc)))\n        return True\n"
    "async def main():\n"
    "    async with Resource() as r:\n        seen.append(r)\n"
    "    async with Resource() as r:\n        raise ValueError('swallowed')\n"
    "    return 'done'\n"
    "print(drive(main()), seen)\n",
    "('done', 0) ['enter', 'resource', (None, 'None'), 'enter', ('ValueError', 'swallowed')]\n",
)
CASES["async for (__aiter__, __anext__) and async generators"] = (
    DRIVE + "class Countdown:\n"
    "    def __init__(self, n):\n        self.n = n\n"
    "    def __aiter__(self):\n        return self\n"
    "    async def __anext__(self):\n"
    "        if self.n == 0:\n            raise StopAsyncIteration\n"
    "        self.n -= 1\n        return self.n, -self.n\n"
    "async def pairs():\n    yield 'a'\n    yield 'b'\n"
    "async def main():\n"
    "    out = []\n"
    "    async for value, negated in Countdown(2):\n        out.append(value + negated)\n"
    "    return out, [x async for x in Countdown(3)], [p async for p in pairs()]\n"
    "print(drive(main()))\n",
    "(([0, 0], [(2, -2), (1, -1), (0, 0)], ['a', 'b']), 0)\n",
)
CASES["bytes()"] = (
    "class Packet:\n    def __bytes__(self):\n        return b'\\x01\\x02'\nprint(bytes(Packet()))\n",
    "b'\\x01\\x02'\n",
)
CASES["length hint (list() asks an iterator)"] = (
    "asked = []\n"
    "class Items:\n"
    "    def __init__(self):\n        self.left = 2\n"
    "    def __iter__(self):\n        return self\n"
    "    def __next__(self):\n"
    "        if not self.left:\n            raise StopIteration\n"
    "        self.left -= 1\n        return self.left\n"
    "    def __length_hint__(self):\n        asked.append('hint')\n        return self.left\n"
    "print(list(Items()), asked)\n",
    "[1, 0] ['hint']\n",
)
CASES["copy.copy and copy.deepcopy"] = (
    "import copy\n"
    "class Node:\n"
    "    def __init__(self, items):\n        self.items = items\n"
    "    def __copy__(self):\n        return Node(['shallow'])\n"
    "    def __deepcopy__(self, memo):\n        return Node([copy.deepcopy(i, memo) for i in self.items] + ['deep'])\n"
    "n = Node([[1]])\n"
    "print(copy.copy(n).items, copy.deepcopy(n).items, copy.deepcopy({'k': n})['k'].items)\n",
    "['shallow'] [[1], 'deep'] [[1], 'deep']\n",
)


def test_the_allowed_dunders_hold_the_whole_numeric_protocol_and_the_other_protocols() -> None:
    missing = [name for name in (*NUMERIC_PROTOCOL, *OTHER_PROTOCOLS) if name not in DEFAULT_ALLOWED_DUNDERS]
    assert missing == []


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_class_defining_the_protocol_is_accepted_and_the_protocol_works(
    executor_factory, name: str
) -> None:
    code, expected = CASES[name]
    result = await run_once(executor_factory, code)
    assert result.ok, result.error
    assert result.stdout == expected
