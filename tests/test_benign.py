"""Benign Python keeps working under every layer (the other half of every security test).

Each snippet is ordinary code an agent writes; it must run unchanged and print exactly what CPython
prints. A guard that breaks one of these is a bug, however safe it is.
"""

from __future__ import annotations

import pytest

from sandboxes import Policy

pytestmark = pytest.mark.anyio

POLICY = Policy()  # the defaults: the stdlib computation modules, files in the working directory

SNIPPETS: dict[str, tuple[str, str]] = {
    "class with __init__, __repr__, __str__, __eq__, __hash__": (
        "class P:\n"
        "    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
        "    def __repr__(self):\n        return f'P({self.x!r}, {self.y!r})'\n"
        "    def __str__(self):\n        return f'<{self.x},{self.y}>'\n"
        "    def __eq__(self, other):\n        return (self.x, self.y) == (other.x, other.y)\n"
        "    def __hash__(self):\n        return hash((self.x, self.y))\n"
        "p = P(1, 'a')\nprint(repr(p), str(p), p == P(1, 'a'), len({p, P(1, 'a')}))\n",
        "P(1, 'a') <1,a> True 1\n",
    ),
    "inheritance and super().__init__": (
        "class A:\n    def __init__(self, x):\n        self.x = x\n    def who(self):\n        return 'A'\n"
        "class B(A):\n    def __init__(self, x, y):\n        super().__init__(x)\n        self.y = y\n"
        "    def who(self):\n        return 'B>' + super().who()\n"
        "class C(B):\n    pass\n"
        "c = C(1, 2)\nprint(c.x, c.y, c.who(), isinstance(c, A), issubclass(C, A), type(c).__name__)\n",
        "1 2 B>A True True C\n",
    ),
    "properties, classmethods, staticmethods, __slots__": (
        "class T:\n    __slots__ = ('_c',)\n"
        "    def __init__(self):\n        self._c = 0.0\n"
        "    @property\n    def f(self):\n        return self._c * 9 / 5 + 32\n"
        "    @f.setter\n    def f(self, v):\n        self._c = (v - 32) * 5 / 9\n"
        "    @classmethod\n    def boiling(cls):\n        t = cls()\n        t.f = 212\n        return t\n"
        "    @staticmethod\n    def unit():\n        return 'F'\n"
        "print(T.boiling().f, T.unit(), T.boiling()._c)\n",
        "212.0 F 100.0\n",
    ),
    "private names and name mangling": (
        "_cache = {}\n"
        "class K:\n    def __init__(self):\n        self.__secret = 42\n        self._half = 1\n"
        "    def _helper(self):\n        return self.__secret + self._half\n"
        "    def get(self):\n        return self._helper()\n"
        "_cache['k'] = K().get()\nprint(_cache, K()._K__secret)\n",
        "{'k': 43} 42\n",
    ),
    "name mangling across a class hierarchy": (
        "class _Base:\n    def __init__(self):\n        self.__v = 1\n"
        "    def get(self):\n        def inner():\n            return self.__v\n        return inner()\n"
        "class Sub(_Base):\n    def __init__(self):\n        super().__init__()\n        self.__v = 2\n"
        "    def mine(self):\n        return self.__v\n"
        "s = Sub()\nprint(s.get(), s.mine(), s._Base__v, s._Sub__v)\n",
        "1 2 1 2\n",
    ),
    "operator overloading and containers": (
        "class V:\n    def __init__(self, *c):\n        self.c = list(c)\n"
        "    def __add__(self, o):\n        return V(*[a + b for a, b in zip(self.c, o.c)])\n"
        "    def __radd__(self, o):\n        return self if o == 0 else NotImplemented\n"
        "    def __mul__(self, k):\n        return V(*[a * k for a in self.c])\n"
        "    def __len__(self):\n        return len(self.c)\n"
        "    def __getitem__(self, i):\n        return self.c[i]\n"
        "    def __iter__(self):\n        return iter(self.c)\n"
        "    def __contains__(self, x):\n        return x in self.c\n"
        "    def __repr__(self):\n        return f'V{tuple(self.c)}'\n"
        "print(sum([V(1, 2), V(3, 4)]), V(1, 2) * 3, len(V(1, 2, 3)), V(5, 6)[1], list(V(7, 8)), 8 in V(8))\n",
        "V(4, 6) V(3, 6) 3 6 [7, 8] True\n",
    ),
    "augmented assignment everywhere": (
        "class C:\n    def __init__(self):\n        self.n = 0\n"
        "c = C()\nc.n += 2\nc.n *= 5\nd = {'a': 1}\nd['a'] += 1\nl = [[1]]\nl[0] += [2]\n"
        "x = 1\nx <<= 3\nprint(c.n, d, l, x)\n",
        "10 {'a': 2} [[1, 2]] 8\n",
    ),
    "dataclasses": (
        "from dataclasses import dataclass, field, asdict, replace, InitVar\n"
        "@dataclass(order=True)\nclass Item:\n    name: str\n    qty: int = 0\n    tags: list = field(default_factory=list)\n"
        "@dataclass(frozen=True)\nclass Pt:\n    x: float\n    y: float = 0.0\n"
        "@dataclass\nclass Acc:\n    start: InitVar[int]\n    total: int = 0\n"
        "    def __post_init__(self, start):\n        self.total += start\n"
        "a = Item('a', 2)\nb = replace(a, qty=3)\n"
        "print(a, a < b, asdict(b), Pt(1.0), hash(Pt(1.0)) == hash(Pt(1.0)), Acc(5).total)\n"
        "try:\n    Pt(1.0).x = 2\nexcept Exception as e:\n    print(type(e).__name__)\n",
        "Item(name='a', qty=2, tags=[]) True {'name': 'a', 'qty': 3, 'tags': []} Pt(x=1.0, y=0.0) True 5\n"
        "FrozenInstanceError\n",
    ),
    "namedtuple, NamedTuple, enum": (
        "import collections, typing, enum\n"
        "P = collections.namedtuple('P', 'x y')\n"
        "class N(typing.NamedTuple):\n    a: int\n    b: str = 'z'\n"
        "class Color(enum.Enum):\n    RED = 1\n    GREEN = 2\n"
        "print(P(1, 2)._replace(x=3), N(1), N(2, 'q').b, Color.RED.name, Color(2), list(Color)[0].value)\n",
        "P(x=3, y=2) N(a=1, b='z') q RED Color.GREEN 1\n",
    ),
    "abstract base classes": (
        "import abc\n"
        "class Shape(abc.ABC):\n    @abc.abstractmethod\n    def area(self):\n        ...\n"
        "class Sq(Shape):\n    def __init__(self, s):\n        self.s = s\n    def area(self):\n        return self.s ** 2\n"
        "try:\n    Shape()\nexcept TypeError:\n    print('abstract')\nprint(Sq(3).area())\n",
        "abstract\n9\n",
    ),
    "generators, yield from, send, generator expressions": (
        "def count(n):\n    i = 0\n    while i < n:\n        got = yield i\n        i += 1 if got is None else got\n"
        "def chain(*its):\n    for it in its:\n        yield from it\n"
        "g = count(10)\nprint(next(g), g.send(3), next(g))\n"
        "print(list(chain(range(2), 'ab')), sum(x * x for x in range(4)), max((len(w), w) for w in ['a', 'bbb']))\n",
        "0 3 4\n[0, 1, 'a', 'b'] 14 (3, 'bbb')\n",
    ),
    "for/while ... else, break, continue": (
        "for n in range(2, 10):\n    for d in range(2, n):\n        if n % d == 0:\n            break\n"
        "    else:\n        print(n, end=' ')\n"
        "i = 0\nwhile i < 3:\n    i += 1\n    if i == 2:\n        continue\nelse:\n    print('done', i)\n",
        "2 3 5 7 done 3\n",
    ),
    "walrus": (
        "data = [1, 5, 12, 7]\nif (n := len(data)) > 3:\n    print(n)\n"
        "print([y for x in data if (y := x * 2) > 10])\n",
        "4\n[24, 14]\n",
    ),
    "match": (
        "class Pt:\n    __match_args__ = ('x', 'y')\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
        "def what(v):\n    match v:\n"
        "        case 0 | 1:\n            return 'small'\n"
        "        case [a, *rest] if a > 10:\n            return f'big head {rest}'\n"
        "        case {'op': 'add', 'args': [x, y]}:\n            return x + y\n"
        "        case Pt(0, y):\n            return f'on y axis {y}'\n"
        "        case Pt(x=x, y=y):\n            return (x, y)\n"
        "        case str() as s:\n            return s.upper()\n"
        "        case _:\n            return None\n"
        "print(what(1), what([11, 2, 3]), what({'op': 'add', 'args': [2, 3]}), what(Pt(0, 4)), what(Pt(1, 2)), what('hi'), what(2.5))\n",
        "small big head [2, 3] 5 on y axis 4 (1, 2) HI None\n",
    ),
    "f-strings": (
        "name, w, pi = 'x', 8, 3.14159\n"
        "print(f'{name!r:>{w}}|{pi:.2f}|{pi=:.1f}|{1_000_000:,}|{\"q\"}|{[i for i in range(3)]}|{{}}')\n",
        "     'x'|3.14|pi=3.1|1,000,000|q|[0, 1, 2]|{}\n",
    ),
    "exceptions: custom, chained, finally, else, re-raise": (
        "class AppError(Exception):\n    def __init__(self, code):\n        super().__init__(f'code {code}')\n        self.code = code\n"
        "def f():\n    try:\n        raise KeyError('k')\n    except KeyError as e:\n        raise AppError(7) from e\n"
        "try:\n    f()\nexcept AppError as e:\n    print(e, e.code, type(e.__cause__).__name__)\n"
        "try:\n    x = 1\nexcept Exception:\n    pass\nelse:\n    print('else')\nfinally:\n    print('finally')\n"
        "def g():\n    try:\n        1 / 0\n    except ZeroDivisionError:\n        raise\n"
        "try:\n    g()\nexcept ArithmeticError as e:\n    print(repr(e))\n",
        "code 7 7 KeyError\nelse\nfinally\nZeroDivisionError('division by zero')\n",
    ),
    "nonlocal and global": (
        "total = 0\n"
        "def make():\n    n = 0\n    def inc():\n        nonlocal n\n        global total\n        n += 1\n        total += 10\n        return n\n    return inc\n"
        "inc = make()\ninc()\nprint(inc(), total)\n",
        "2 20\n",
    ),
    "__name__ == '__main__'": (
        "def main():\n    print('main ran', __name__)\nif __name__ == '__main__':\n    main()\n",
        "main ran __main__\n",
    ),
    "closures, decorators, functools": (
        "import functools\n"
        "def logged(fn):\n    @functools.wraps(fn)\n    def wrapper(*a, **k):\n        return ('logged', fn(*a, **k))\n    return wrapper\n"
        "@logged\ndef add(a, b=1):\n    'adds'\n    return a + b\n"
        "@functools.lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
        "print(add(2, b=3), add.__name__, add.__doc__, fib(50), functools.reduce(lambda a, b: a * b, range(1, 6)), functools.partial(add, 1)())\n",
        "('logged', 5) add adds 12586269025 120 ('logged', 2)\n",
    ),
    "unpacking and star arguments": (
        "a, *b, c = range(5)\nfirst, (x, y) = 1, (2, 3)\n"
        "def f(*args, **kw):\n    return args, sorted(kw)\n"
        "print(a, b, c, x, y, f(*[1, 2], **{'k': 1, 'j': 2}), {**{'a': 1}, 'b': 2}, [*'ab', *range(2)])\n",
        "0 [1, 2, 3] 4 2 3 ((1, 2), ['j', 'k']) {'a': 1, 'b': 2} ['a', 'b', 0, 1]\n",
    ),
    "context managers": (
        "import contextlib\n"
        "class Res:\n    def __enter__(self):\n        print('open')\n        return self\n"
        "    def __exit__(self, kind, exc, tb):\n        print('close', kind.__name__ if kind else None)\n        return True\n"
        "with Res():\n    raise ValueError('x')\n"
        "@contextlib.contextmanager\ndef tag(n):\n    print(f'<{n}>')\n    yield n\n    print(f'</{n}>')\n"
        "with tag('b') as t:\n    print(t)\n",
        "open\nclose ValueError\n<b>\nb\n</b>\n",
    ),
    "stdlib computation modules": (
        "import json, re, math, itertools, collections, heapq, bisect, statistics, datetime, string, textwrap\n"
        "print(json.dumps({'a': [1, 2]}, sort_keys=True), re.findall(r'\\d+', 'a1b22'), math.gcd(12, 18))\n"
        "print(list(itertools.combinations('abc', 2))[:2], collections.Counter('aab').most_common(1))\n"
        "h = [5, 1, 3]\nheapq.heapify(h)\nprint(heapq.heappop(h), bisect.bisect([1, 3, 5], 4), statistics.mean([1, 2, 3]))\n"
        "print(datetime.date(2024, 2, 29).isoformat(), string.ascii_lowercase[:3], textwrap.shorten('a b c d e', 5))\n",
        "{\"a\": [1, 2]} ['1', '22'] 6\n[('a', 'b'), ('a', 'c')] [('a', 2)]\n1 2 2\n2024-02-29 abc [...]\n",
    ),
    "stdlib that reads system data or imports its own helpers": (
        "import datetime, time, zoneinfo, uuid, decimal, copy\n"
        "paris = zoneinfo.ZoneInfo('Europe/Paris')\n"
        "print(datetime.datetime(2024, 7, 1, tzinfo=paris).utcoffset(), datetime.datetime.strptime('2024-03-05', '%Y-%m-%d').day)\n"
        "print(time.strptime('12', '%H').tm_hour, len(str(uuid.uuid4())), decimal.Decimal('0.1') * 3, copy.deepcopy([{1}]))\n",
        "2:00:00 5\n12 36 0.3 [{1}]\n",
    ),
    "codecs a library loads lazily": (
        "print('b\u00fccher.de'.encode('idna'), b'\\x80'.decode('cp437'))\n"
        "open('f.txt', 'w', encoding='cp1252').write('\u00e9')\nprint(open('f.txt', encoding='cp1252').read())\n",
        "b'xn--bcher-kva.de' \u00c7\n\u00e9\n",
    ),
    "type hints and annotations": (
        "from typing import Optional\nimport typing\n"
        "limit: int = 5\n"
        "def f(xs: list[int], k: Optional[int] = None) -> dict[str, int]:\n    return {'n': len(xs[:k])}\n"
        "print(f([1, 2, 3], 2), typing.get_type_hints(f)['xs'], f.__annotations__['return'])\n",
        "{'n': 2} list[int] dict[str, int]\n",
    ),
    "del statements and assert": (
        "class O:\n    pass\no = O()\no.a = 1\ndel o.a\nd = {'k': 1}\ndel d['k']\nx = 1\ndel x\n"
        "assert not hasattr(o, 'a') and d == {}\n"
        "try:\n    assert 1 == 2, 'nope'\nexcept AssertionError as e:\n    print('assert', e)\n",
        "assert nope\n",
    ),
    "sorting, slicing, builtins": (
        "words = ['pear', 'Fig', 'apple']\n"
        "print(sorted(words, key=str.lower), words[::-1], list(enumerate('ab', 1)), dict(zip('ab', [1, 2])))\n"
        "print(any(map(str.isdigit, 'a1')), all([]), divmod(7, 2), round(2.675, 2), int('ff', 16), chr(65), ord('a'))\n"
        "print(getattr(words, 'count')('Fig'), hasattr(words, 'nope'), isinstance(1, (int, str)), min(3, 1, key=lambda v: -v))\n",
        "['apple', 'Fig', 'pear'] ['apple', 'Fig', 'pear'] [(1, 'a'), (2, 'b')] {'a': 1, 'b': 2}\n"
        "True True (3, 1) 2.67 255 A 97\n1 False True 3\n",
    ),
    "print options": (
        "print('a', 'b', sep='-', end='!\\n')\nprint()\nprint(*range(3))\n",
        "a-b!\n\n0 1 2\n",
    ),
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
async def test_benign_code_runs_unchanged(executor_factory, name: str) -> None:
    code, expected = SNIPPETS[name]
    async with executor_factory(policy=POLICY, timeout=10) as ex:
        result = await ex.run(code)
    assert result.ok, f"{name}: {result.error}\n{result.error.traceback if result.error else ''}"
    assert result.stdout == expected


async def test_state_is_kept_between_runs(executor_factory) -> None:
    async with executor_factory(policy=POLICY, timeout=10) as ex:
        await ex.run(
            "import math\nclass Box:\n    def __init__(self, v):\n        self.v = v\nb = Box(2)\ndef twice(x):\n    return 2 * x"
        )
        result = await ex.run("b.v = twice(b.v)\nprint(b.v, math.floor(2.5), type(b).__name__)")
        assert result.stdout == "4 2 Box\n", result
        await ex.reset()
        after = await ex.run("print(b)")
        assert after.error is not None and after.error.type == "NameError"


async def test_tracebacks_are_trimmed_to_user_code(executor_factory) -> None:
    code = "def inner(x):\n    return 1 / x\n\ndef outer():\n    return inner(0)\n\nouter()\n"
    async with executor_factory(policy=POLICY, timeout=10) as ex:
        result = await ex.run(code)
    assert result.error is not None and result.error.type == "ZeroDivisionError"
    trace = result.error.traceback or ""
    assert "<cell" in trace and "line 7" in trace and "line 5" in trace and "line 2" in trace
    assert "in inner" in trace and "return 1 / x" in trace
    for internal in ("runner.py", "guard.py", "audit.py", "RestrictedPython", "sandboxes"):
        assert internal not in trace, trace
    assert result.error.line == 2


async def test_exception_from_a_library_is_trimmed_too(executor_factory) -> None:
    async with executor_factory(policy=POLICY, timeout=10) as ex:
        result = await ex.run("import json\njson.loads('{bad')")
    assert result.error is not None and result.error.type == "JSONDecodeError"
    assert "runner.py" not in (result.error.traceback or "")
    assert result.error.line == 2
