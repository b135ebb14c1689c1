"""Attack class: direct and indirect imports.

Every way to reach a module outside the allowlist: the import statement, `__import__`, `importlib`,
module attributes that are other modules (`random._os`, `typing.sys`, `queue.threading`), the names
`from x import y` binds, submodules, and a `str` subclass that lies to the checks.
"""

from __future__ import annotations

import pytest
from security_helpers import ESCAPED, assert_refused, assert_usable, policy, run_once

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
    "typing.sys via getattr": (("typing",), f"import typing\nprint('{ESCAPED}', getattr(typing, 's' + 'ys'))"),
    "queue.threading": (("queue",), f"import queue\nprint('{ESCAPED}', queue.threading)"),
    "from queue import threading": (("queue",), f"from queue import threading\nprint('{ESCAPED}', threading)"),
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
