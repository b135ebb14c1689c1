"""The e2b backend against the real E2B service. Runs only when E2B_API_KEY is set (costs sandbox time).

Everything else about the backend is tested on the loopback stand-in; these tests check that what
the stand-in imitates holds on the real service: the template's Python, installing the runner's
dependency, the timeout killing the code, and the lifetime calls.
"""

from __future__ import annotations

import os

import anyio
import pytest

from sandboxes import Policy, SandboxFileError
from sandboxes.backends.e2b import E2BExecutor

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.e2b,
    pytest.mark.e2b_live,
    pytest.mark.skipif(
        not os.environ.get("E2B_API_KEY"), reason="E2B_API_KEY is not set: live E2B tests skipped"
    ),
]

TEMPLATE = os.environ.get("E2B_TEMPLATE", "base")


async def test_live_state_capture_and_files():
    async with E2BExecutor(template=TEMPLATE, timeout=60, env={"TZ": "UTC"}) as ex:
        first = await ex.run("x = 20\nprint('hello from e2b')")
        second = await ex.run("print(x + 22)")
        await ex.upload("in.txt", "3 4")
        third = await ex.run("open('out.txt', 'w').write(str(sum(map(int, open('in.txt').read().split()))))")
        produced = await ex.download("out.txt")
    assert first.ok and first.stdout == "hello from e2b\n", first.error
    assert second.stdout == "42\n"
    assert third.ok and produced == b"7"


async def test_live_timeout_stops_the_code_and_the_session_recovers():
    policy = Policy(allowed_imports=["time"])
    async with E2BExecutor(template=TEMPLATE, policy=policy, timeout=3) as ex:
        slow = await ex.run("import time\ntime.sleep(6)\nopen('late.txt', 'w').write('x')")
        after = await ex.run("print('ok')")
        await anyio.sleep(5)  # past the moment the code would have written the file
        with pytest.raises(SandboxFileError):
            await ex.download("late.txt")
    assert slow.timed_out and slow.state_lost
    assert after.ok and after.stdout == "ok\n"


async def test_live_pip_packages():
    policy = Policy(allowed_imports=["six"])
    async with E2BExecutor(template=TEMPLATE, timeout=120, pip_packages=["six"], policy=policy) as ex:
        result = await ex.run("import six\nprint(six.__name__)")
    assert result.ok and result.stdout == "six\n", result.error
