"""Attack class: direct and indirect imports.

Every way to reach a module outside the allowlist: the import statement, `__import__`, `importlib`,
module attributes that are other modules (`random._os`, `typing.sys`, `queue.threading`), the names
`from x import y` binds, submodules, and a `str` subclass that lies to the checks.
"""

from __future__ import annotations

import pytest
from support.security_helpers import ESCAPED, assert_refused, assert_usable, policy, run_once

pytestmark = pytest.mark.anyio

REFUSED = ("PolicyViolation", "PermissionError", "AttributeError", "ImportError", "ModuleNotFoundError")

INDIRECT = {
    # name: (allowed imports, code); each prints ESCAPED only if it got hold of the forbidden module
    "import os": ((), f"import os\nprint('{ESCAPED}', os.getpid())"),
    "import os.path as p": ((), f"import os.path as p\nprint('{ESCAPED}', p)"),
    "from os import system": ((), f"from os import system\nprint('{ESCAPED}', system)"),
    "relative import": ((), f"from . import os\nprint('{ESCAPED}', os)"),
    "__import__": ((), f"m = __import__('os')\nprint('{ESCAPED}', m)"),
    "importlib": ((), f"import importlib\nprint('{ESCAPED}', importlib.import_module('os'))"),
    "random._os": (("random",), f"import random\nprint('{ESCAPED}', random._os)"),
    "getattr random _os": (("random",), f"import random\nprint('{ESCAPED}', getattr(random, '_' + 'os'))"),
    "typing.sys": (("typing",), f"import typing\nprint('{ESCAPED}', typing.sys.modules)"),
    "from typing import sys": (("typing",), f"from typing import sys\nprint('{ESCAPED}', sys)"),
    "typing.sys via getattr": (
        ("typing",),
        f"import typing\nprint('{ESCAPED}', getattr(typing, 's' + 'ys'))",
    ),
    "queue.threading": (("queue",), f"import queue\nprint('{ESCAPED}', queue.threading)"),
    "from queue import threading": (
        ("queue",),
        f"from queue import threading\nprint('{ESCAPED}', threading)",
    ),
    "dataclasses.sys": (("dataclasses",), f"import dataclasses\nprint('{ESCAPED}', dataclasses.sys)"),
    "dataclasses.inspect": (("dataclasses",), f"import dataclasses\nprint('{ESCAPED}', dataclasses.inspect)"),
    "from collections import abc (not allowed)": (
        ("collections",),
        f"from collections import abc\nprint('{ESCAPED}', abc)",
    ),
    "collections.abc attribute (not allowed)": (
        ("collections",),
        f"import collections\nprint('{ESCAPED}', collections.abc)",
    ),
    "sys.modules through a dict": (
        ("typing",),
        f"import typing\nd = {{'m': typing}}\nprint('{ESCAPED}', d['m'].sys)",
    ),
    "module in a list": (("typing",), f"import typing\nprint('{ESCAPED}', [typing.sys][0])"),
    "private module attribute": (("json",), f"import json\nprint('{ESCAPED}', json._default_decoder)"),
    "from import star": (("math",), f"from math import *\nprint('{ESCAPED}')"),
    "str subclass lying about its name": (
        ("math",),
        "class S(str):\n"
        "    def startswith(self, *a):\n        return False\n"
        "    def endswith(self, *a):\n        return False\n"
        "    def __eq__(self, other):\n        return False\n"
        "    def __hash__(self):\n        return 1\n"
        "import math\n"
        f"print('{ESCAPED}', getattr(math, S('_' + '_loader_' + '_')))",
    ),
}


@pytest.mark.parametrize("name", sorted(INDIRECT))
async def test_import_routes_are_closed(executor_factory, name: str) -> None:
    imports, code = INDIRECT[name]
    result = await run_once(executor_factory, code, policy=policy(*imports))
    assert_refused(result, *REFUSED)


async def test_allowed_submodule_import_works(executor_factory) -> None:
    code = "from collections import abc\nimport collections.abc as cabc\nprint(abc is cabc, issubclass(list, abc.Sequence))"
    result = await run_once(executor_factory, code, policy=policy("collections", "collections.abc"))
    assert result.ok, result
    assert result.stdout == "True True\n"


async def test_package_star_pattern_allows_submodules(executor_factory) -> None:
    code = "import json.decoder\nfrom json import decoder\nprint(decoder.JSONDecodeError.__name__)"
    result = await run_once(executor_factory, code, policy=policy("json.*"))
    assert result.ok, result
    assert result.stdout == "JSONDecodeError\n"


async def test_refusal_names_what_is_allowed(executor_factory) -> None:
    result = await run_once(executor_factory, "import socket", policy=policy("math", "json"))
    assert_refused(result, "PolicyViolation")
    assert "socket" in result.error.message and "math, json" in result.error.message


async def test_future_import_is_allowed(executor_factory) -> None:
    code = "from __future__ import annotations\ndef f(x: int) -> int:\n    return x\nprint(f(3))"
    result = await run_once(executor_factory, code, policy=policy())
    assert result.ok, result
    assert result.stdout == "3\n"


async def test_refused_import_leaves_the_session_usable(executor_factory) -> None:
    async with executor_factory(policy=policy("random"), timeout=10) as ex:
        await ex.run("x = 5")
        assert_refused(await ex.run(f"import random\nprint('{ESCAPED}', random._os)"), "PolicyViolation")
        result = await ex.run("print(x)")
        assert result.ok and result.stdout == "5\n"
        await assert_usable(ex)


POLLUTION = {
    # Library code that sets attributes on whatever object it is given must not reach a real module:
    # modules are shared with the runner (json writes its replies) and the audit hook (os.path).
    "update_wrapper onto json (forges the runner's reply)": (
        ("json", "functools"),
        "import json, functools\n"
        "real = json.dumps\n"
        "def dumps(obj, *a, **k):\n"
        "    if isinstance(obj, dict) and obj.get('op') == 'reply':\n"
        f"        obj.update(stdout='{ESCAPED}', has_final_answer=True, final_answer='{ESCAPED}')\n"
        "    return real(obj, *a, **k)\n"
        "def carrier():\n    pass\n"
        "carrier.dumps = dumps\n"
        "functools.update_wrapper(json, carrier, assigned=(), updated=('_' + '_dict_' + '_',))\n",
    ),
    "update_wrapper onto os.path (blinds the file guard)": (
        ("os", "os.path", "functools"),
        "import os, functools\n"
        "def carrier():\n    pass\n"
        "carrier.realpath = lambda p, *a, **k: os.getcwd()\n"
        "functools.update_wrapper(os.path, carrier, assigned=(), updated=('_' + '_dict_' + '_',))\n"
        f"print('{ESCAPED}', open('/etc/hostname').read())\n",
    ),
    "update_wrapper assigning module attributes": (
        ("math", "functools"),
        "import math, functools\n"
        "def pi():\n    pass\n"
        "functools.update_wrapper(math, pi)\n"
        f"print('{ESCAPED}', math.pi)\n",
    ),
    "dataclass applied to a module": (
        ("json", "dataclasses"),
        f"import json, dataclasses\ndataclasses.dataclass(json)\nprint('{ESCAPED}')\n",
    ),
    "copy of a module then modify": (
        ("json", "copy"),
        f"import json, copy\nj = copy.copy(json)\nj.dumps = None\nprint('{ESCAPED}')\n",
    ),
}


@pytest.mark.parametrize("name", sorted(POLLUTION))
async def test_library_code_cannot_modify_modules(executor_factory, name: str) -> None:
    imports, code = POLLUTION[name]
    async with executor_factory(policy=policy(*imports, "json"), timeout=10) as ex:
        result = await ex.run(code)
        assert_refused(result)
        # The runner's own modules still work: the next reply is genuine.
        after = await ex.run("import json\nprint(json.dumps([1]))")
        assert after.ok and after.stdout == "[1]\n" and not after.has_final_answer, after
        await assert_usable(ex)


async def test_modules_still_behave_like_modules(executor_factory) -> None:
    code = (
        "import math, json\nimport math as m2\nfrom json import dumps\n"
        "print(math is m2, repr(math).startswith(\"<module 'math'\"), math.__name__, 'sqrt' in dir(math))\n"
        "print(dumps is json.dumps, getattr(math, 'tau') == 2 * math.pi, hasattr(math, 'nope'))\n"
    )
    result = await run_once(executor_factory, code, policy=policy("math", "json"))
    assert result.ok, result
    assert result.stdout == "True True math True\nTrue True False\n"
