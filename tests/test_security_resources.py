"""Attack class: resource exhaustion (memory, output, file size, CPU).

Each attack must come back as a clear result (`oom`, `truncated`, an error, `timed_out`) and leave
the executor usable; the test proves the effect was bounded (the file is not larger than the limit,
the output kept is head and tail of what was printed).

Not attack-corpus entries (whose `resources` class holds the same runaways as "came back and
still answers"): these tests check the limits' contract, which flag the result carries, what output
is kept, a file's size on disk, and the session after `reset()`.
"""

from __future__ import annotations

import pytest
from support.security_helpers import assert_usable

from sandboxes import Limits, Policy

pytestmark = pytest.mark.anyio

SMALL_MEMORY = Policy(allowed_imports=[], limits=Limits(memory_mb=512))

MEMORY = {
    "one huge allocation": "x = bytearray(10 ** 11)",
    "string multiplication": "s = 'a' * (10 ** 10)",
    "list of big strings": "keep = []\nwhile True:\n    keep.append(' ' * 10 ** 7)",
    # Small pieces leave the runner less than one piece of room when the limit is hit: without the
    # runner's own reserve it could not even read the output pipe, and the session died with it.
    "list of small strings": "keep = []\nwhile True:\n    keep.append(' ' * 10 ** 5)",
    "big integer": "n = 1 << (10 ** 11)",
    "nested lists": "x = [[0] * 10 ** 6 for _ in range(10 ** 4)]",
}


@pytest.mark.parametrize("name", sorted(MEMORY))
async def test_memory_exhaustion_is_oom_and_the_executor_survives(executor_factory, name: str) -> None:
    async with executor_factory(policy=SMALL_MEMORY, timeout=20) as ex:
        await ex.run("kept = 'state'")
        result = await ex.run(MEMORY[name])
        assert not result.ok
        assert result.oom or result.timed_out, result
        if result.oom and not result.state_lost:
            assert (await ex.run("print(kept)")).stdout == "state\n"
        await assert_usable(ex)
        # Once the session lets go of what the code kept, a moderate allocation works again.
        await ex.reset()
        again = await ex.run("x = bytearray(50 * 1024 * 1024)\nprint(len(x))")
        assert again.ok and again.stdout == f"{50 * 1024 * 1024}\n", again


async def test_100_mb_of_output_is_truncated_head_and_tail(executor_factory) -> None:
    code = "print('HEAD' + 'x' * (100 * 1024 * 1024) + 'TAIL')"
    async with executor_factory(policy=Policy(allowed_imports=[]), timeout=30, output_limit=10_000) as ex:
        result = await ex.run(code)
        assert result.ok, result.error
        assert result.truncated
        assert result.stdout.startswith("HEADxxx") and result.stdout.endswith("xxxTAIL\n")
        assert len(result.stdout) < 20_000
        assert "omitted" in result.stdout
        await assert_usable(ex)


async def test_many_small_writes_are_truncated_too(executor_factory) -> None:
    code = "for i in range(200000):\n    print(i)\nprint('END')"
    async with executor_factory(policy=Policy(allowed_imports=[]), timeout=30, output_limit=1000) as ex:
        result = await ex.run(code)
        assert result.ok and result.truncated
        assert result.stdout.startswith("0\n1\n2\n") and result.stdout.endswith("199999\nEND\n")


async def test_binary_and_invalid_utf8_output_is_decoded_safely(executor_factory) -> None:
    code = "import os\nos.write(1, bytes(range(256)))\nos.write(2, b'\\xff\\xfe\\x00bad')\nprint('\\udcff')"
    async with executor_factory(policy=Policy(allowed_imports=["os"]), timeout=10) as ex:
        result = await ex.run(code)
        assert isinstance(result.stdout, str) and isinstance(result.stderr, str)
        assert "bad" in result.stderr
        await assert_usable(ex)


async def test_file_size_limit(executor_factory) -> None:
    policy = Policy(allowed_imports=["os", "os.path"], limits=Limits(max_file_mb=1))
    code = "f = open('big.bin', 'wb')\nfor _ in range(10):\n    f.write(b'x' * 1024 * 1024)\n    f.flush()\nprint('wrote all')"
    async with executor_factory(policy=policy, timeout=10) as ex:
        result = await ex.run(code)
        assert not result.ok and "wrote all" not in result.stdout, result
        size = await ex.run("import os\nprint(os.path.getsize('big.bin'))")
        assert int(size.stdout) <= 1024 * 1024, size
        await assert_usable(ex)


async def test_cpu_burn_is_stopped_by_the_timeout(executor_factory) -> None:
    async with executor_factory(policy=Policy(allowed_imports=[]), timeout=1.5) as ex:
        result = await ex.run("while True:\n    pass")
        assert result.timed_out and result.state_lost
        await assert_usable(ex)


async def test_deep_recursion_is_an_error_not_a_crash(executor_factory) -> None:
    async with executor_factory(policy=Policy(allowed_imports=[]), timeout=10) as ex:
        await ex.run("kept = 1")
        result = await ex.run("def f(n):\n    return f(n + 1)\nf(0)")
        assert result.error is not None and result.error.type == "RecursionError", result
        assert not result.state_lost
        assert (await ex.run("print(kept)")).stdout == "1\n"
