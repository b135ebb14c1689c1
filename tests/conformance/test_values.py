"""Values cross the sandbox boundary whole, on every backend: final answers, the last expression's
value, tool arguments and results keep their types (docs/values.md); what cannot be carried is said,
never turned into a string; and a runner that forges encoded values (code without the Python-level
guards holds its runner) gets them refused by the parent before they cost memory, the session intact.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import pathlib
import subprocess
import sys
import uuid
from typing import Any

import pytest

from sandboxes import Limits, Policy
from sandboxes.runtime.values import TAG, decode

pytestmark = pytest.mark.anyio

BUILD = """
import datetime, decimal, uuid, pathlib
values = {
    'tuple': (1, 'a', (2,)),
    'int keys': {1: 'one', (2, 3): 'pair'},
    'set': {1, 2},
    'frozenset': frozenset({'x'}),
    'bytes': b'\\x00\\xff',
    'big': 2 ** 100,
    'nan-free floats': [float('inf'), -0.0],
    'datetime': datetime.datetime(2024, 2, 29, 12, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
    'date': datetime.date(2020, 1, 1),
    'time': datetime.time(1, 2, 3),
    'timedelta': datetime.timedelta(days=2, seconds=3),
    'decimal': decimal.Decimal('1.10'),
    'uuid': uuid.UUID(int=7),
    'path': pathlib.PurePosixPath('a/b'),
    'tag-like data': {'$kodeagent': 'bytes', 'value': 'AA=='},
}
"""

EXPECTED = {
    "tuple": (1, "a", (2,)),
    "int keys": {1: "one", (2, 3): "pair"},
    "set": {1, 2},
    "frozenset": frozenset({"x"}),
    "bytes": b"\x00\xff",
    "big": 2**100,
    "nan-free floats": [float("inf"), -0.0],
    "datetime": dt.datetime(2024, 2, 29, 12, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    "date": dt.date(2020, 1, 1),
    "time": dt.time(1, 2, 3),
    "timedelta": dt.timedelta(days=2, seconds=3),
    "decimal": decimal.Decimal("1.10"),
    "uuid": uuid.UUID(int=7),
    "path": pathlib.PurePosixPath("a/b"),
    "tag-like data": {TAG: "bytes", "value": "AA=="},
}


def _assert_typed(found: Any) -> None:
    assert found == EXPECTED
    for name, value in EXPECTED.items():
        assert type(found[name]) is type(value), name


async def test_values_keep_their_types_both_ways_on_every_backend(executor_factory: Any) -> None:
    received: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def echo(*args: Any, **kwargs: Any) -> Any:
        received.append((args, kwargs))
        return {"args": args, "kwargs": kwargs}

    policy = Policy(allowed_imports=[*Policy().allowed_imports, "pathlib"])
    async with executor_factory(timeout=60, policy=policy, tools={"echo": echo}) as ex:
        value = await ex.run(BUILD + "values")
        final = await ex.run("final_answer(values)")
        through_tool = await ex.run(
            "back = echo(values['tuple'], values['set'], when=values['datetime'], raw=values['bytes'])\n"
            "print(type(back['args']).__name__, type(back['args'][0]).__name__, "
            "type(back['args'][1]).__name__, type(back['kwargs']['raw']).__name__)\n"
            "back"
        )
        missing = await ex.run("class Handle:\n    pass\nh = Handle()\nh")
        refused = await ex.run("final_answer({'rows': [1, 2, h]})")
        refused_call = await ex.run("try:\n    echo(h)\nexcept TypeError as exc:\n    print(exc)")
        after = await ex.run("values['tuple']")
    assert value.ok, value.error
    _assert_typed(value.value)
    assert final.has_final_answer, final.error
    _assert_typed(final.final_answer)
    # the tool ran in this process on values of their own types, and its result went back typed
    assert received[0] == (
        ((1, "a", (2,)), {1, 2}),
        {"when": EXPECTED["datetime"], "raw": b"\x00\xff"},
    )
    assert through_tool.stdout == "tuple tuple set bytes\n", through_tool.error
    assert through_tool.value == {"args": ((1, "a", (2,)), {1, 2}), "kwargs": received[0][1]}
    # what the codec does not carry: shown by its repr, said why, never turned into a string
    assert missing.ok and missing.value is None
    assert missing.value_repr is not None and "Handle object at" in missing.value_repr
    assert missing.value_error is not None and "Handle object cannot leave the sandbox" in missing.value_error
    assert refused.error is not None and refused.error.type == "TypeError" and not refused.has_final_answer
    assert "answer['rows'][2]: a Handle object cannot leave the sandbox" in refused.error.message
    assert (
        "arguments of tool 'echo': args[0]: a Handle object cannot leave the sandbox" in refused_call.stdout
    )
    assert len(received) == 1  # the refused call never reached the tool
    assert after.value == (1, "a", (2,)) and not after.state_lost


NUMPY_PANDAS_PIL_POLICY = Policy(
    allowed_imports=[*Policy().allowed_imports, "numpy", "numpy.*", "pandas", "pandas.*", "PIL", "PIL.*"],
    limits=Limits(memory_mb=1024),
)


async def test_numpy_pandas_and_pil_values_cross_where_the_sandbox_has_them(executor_factory: Any) -> None:
    pytest.importorskip("numpy")
    pytest.importorskip("pandas")
    pytest.importorskip("PIL.Image")
    got: list[Any] = []
    async with executor_factory(
        timeout=60, policy=NUMPY_PANDAS_PIL_POLICY, tools={"keep": keeper(got)}
    ) as ex:
        probe = await ex.run("import numpy, pandas, PIL.Image")
        if probe.error is not None:
            # Docker's `py` image has none of them: tests/backends/docker/test_docker_datascience.py
            # runs these same checks on the image that has them.
            pytest.skip(f"this backend's sandbox lacks numpy, pandas or PIL: {probe.error}")
        await check_numpy_pandas_pil_cross(ex, got)


def keeper(got: list[Any]) -> Any:
    """A tool that keeps what it was given and returns it."""

    def keep(value: Any) -> Any:
        got.append(value)
        return value

    return keep


async def check_numpy_pandas_pil_cross(ex: Any, got: list[Any]) -> None:
    """numpy arrays and scalars, DataFrames and PIL images come back as themselves, both as values and
    through a tool (`keep`, recording into `got`); an object array is refused, not stringified."""
    import numpy as np
    import pandas as pd
    import PIL.Image as image_module

    array = await ex.run("import numpy as np\nnp.arange(6, dtype=np.int16).reshape(2, 3)")
    scalar = await ex.run("final_answer(np.int64(5))")
    frame = await ex.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    image = await ex.run("from PIL import Image\nImage.new('RGB', (4, 3), (1, 2, 3))")
    back = await ex.run("a = keep(np.ones(2))\ntype(a).__name__, a.dtype.name")
    objects = await ex.run("np.array([1, 'x'], dtype=object)")
    assert array.ok, array.error
    assert type(array.value) is np.ndarray and array.value.dtype == np.int16
    np.testing.assert_array_equal(array.value, np.arange(6).reshape(2, 3))
    assert type(scalar.final_answer) is np.int64 and scalar.final_answer == 5
    pd.testing.assert_frame_equal(frame.value, pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}))
    assert isinstance(image.value, image_module.Image) and image.value.size == (4, 3)
    assert image.value.getpixel((0, 0)) == (1, 2, 3)
    assert type(got[0]) is np.ndarray and back.value == ("ndarray", "float64")
    assert objects.value is None and objects.value_error is not None and "dtype object" in objects.value_error


async def test_in_json_a_result_takes_the_one_tagged_form(executor_factory: Any) -> None:
    async with executor_factory(timeout=30) as ex:
        result = await ex.run("(1, b'x', {2: None})")
    dumped = json.loads(result.model_dump_json())
    assert dumped["value"] == {
        TAG: "tuple",
        "value": [
            1,
            {TAG: "bytes", "value": base64.b64encode(b"x").decode()},
            {TAG: "dict", "value": [[2, None]]},
        ],
    }
    assert decode(dumped["value"]) == (1, b"x", {2: None})


# ---------------------------------------------------------------------- variables sent in

SENT = {f"v_{name.replace(' ', '_').replace('-', '_')}": name for name in EXPECTED}
"""A variable name for each row of `EXPECTED`."""

SAME_INSIDE = (
    "checks = [\n"
    + "".join(
        f"    ({row!r}, type({name}) is type(values[{row!r}]) and {name} == values[{row!r}]),\n"
        for name, row in SENT.items()
    )
    + "]\n"
    "nested = [row for row in values if not (type(sent[row]) is type(values[row]) and sent[row] == values[row])]\n"
    "[row for row, same in checks if not same], nested"
)
"""Inside: the rows whose variable is not of its own type and equal to the value built there."""


async def test_variables_sent_in_keep_their_types_on_every_backend(executor_factory: Any) -> None:
    policy = Policy(allowed_imports=[*Policy().allowed_imports, "pathlib"])

    class Handle:
        pass

    async with executor_factory(timeout=60, policy=policy) as ex:
        await ex.send_variables({name: EXPECTED[row] for name, row in SENT.items()} | {"sent": EXPECTED})
        inside = await ex.run(BUILD + SAME_INSIDE)
        with pytest.raises(
            TypeError, match=r"bad\['rows'\]\[1\]: a \S*Handle object cannot enter the sandbox"
        ):
            await ex.send_variables({"good": 1, "bad": {"rows": [1, Handle()]}})
        unsent = await ex.run("good")
        after = await ex.run("v_tuple")
    assert inside.ok, inside.error
    assert inside.value == ([], [])  # inside, each is of its own type and equal to the value built there
    assert len(SENT) == len(EXPECTED)
    assert unsent.error is not None and unsent.error.type == "NameError"  # refused whole, before sending
    assert after.value == (1, "a", (2,)) and not after.state_lost


async def test_numpy_pandas_and_pil_variables_arrive_as_such_where_the_code_may_import_them(
    executor_factory: Any,
) -> None:
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    image_module = pytest.importorskip("PIL.Image")
    allowed = Policy(
        allowed_imports=[*Policy().allowed_imports, "numpy", "numpy.*", "pandas", "pandas.*", "PIL", "PIL.*"]
    )
    sent = {
        "array": np.arange(6, dtype=np.int16).reshape(2, 3),
        "scalar": np.int64(5),
        "frame": pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}),
        "image": image_module.new("RGB", (4, 3), (1, 2, 3)),
    }
    async with executor_factory(timeout=60, policy=allowed) as ex:
        probe = await ex.run("import numpy, pandas, PIL.Image")
        if probe.error is not None:
            pytest.skip(f"this backend's sandbox lacks numpy, pandas or PIL: {probe.error}")
        await ex.send_variables(sent)
        inside = await ex.run(
            "import numpy as np, pandas as pd\nfrom PIL import Image\n"
            "(type(array) is np.ndarray and array.dtype == np.int16 and array.tolist() == [[0, 1, 2], [3, 4, 5]],"
            " type(scalar) is np.int64 and scalar == 5,"
            " type(frame) is pd.DataFrame and frame.equals(pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})),"
            " isinstance(image, Image.Image) and image.size == (4, 3) and image.getpixel((0, 0)) == (1, 2, 3))"
        )
    assert inside.value == (True, True, True, True), inside.error
    async with executor_factory(timeout=60) as ex:  # numpy is not the code's to import: it stays encoded
        await ex.send_variables({"array": sent["array"]})
        kept = await ex.run("type(array).__name__, array.type")
    assert kept.value == ("EncodedValue", "numpy.ndarray"), kept.error


# ---------------------------------------------------------------------- a runner that forges values

FIND_RUNNER = (
    "import gc\n"
    "runner = next(o for o in gc.get_objects() if type(o).__name__ == 'Runner' and hasattr(o, 'channel'))\n"
)

PNG_BOMB = (
    "import struct, zlib, base64\n"
    "def chunk(kind, body):\n"
    "    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))\n"
    "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 200000, 200000, 8, 0, 0, 0, 0))\n"
    "png += chunk(b'IDAT', zlib.compress(b'\\x00' * 1_000_000)) + chunk(b'IEND', b'')\n"
    "forged = {'$kodeagent': 'PIL.Image', 'png': base64.b64encode(png).decode()}\n"
)

FORGED_VALUES = {
    "an unknown tag": ("forged = {'$kodeagent': 'pickle', 'value': 'gASV'}\n", "unknown type tag"),
    # (plain JSON is taken as parsed: the line limit and the parser's depth bound it already)
    "nesting past the bound": (
        "forged = []\nfor _ in range(200):\n    forged = {'$kodeagent': 'tuple', 'value': [forged]}\n",
        "nested more than",
    ),
    "an array claiming terabytes": (
        "import struct, base64\n"
        "h = repr({'descr': '<f8', 'fortran_order': False, 'shape': (1 << 20, 1 << 20)}).encode() + b'\\n'\n"
        "npy = b'\\x93NUMPY\\x01\\x00' + struct.pack('<H', len(h)) + h + b'\\x00' * 64\n"
        "forged = {'$kodeagent': 'numpy.ndarray', 'npy': base64.b64encode(npy).decode()}\n",
        "needs 8,796,093,022,208 bytes",
    ),
    "a PNG bomb": (PNG_BOMB, "200000x200000 pixels"),
    "a set of lists": ("forged = {'$kodeagent': 'set', 'value': [[1], [2]]}\n", "cannot be a list"),
}


@pytest.mark.parametrize("attack", sorted(FORGED_VALUES))
async def test_a_forged_value_is_refused_and_the_session_goes_on(
    executor_factory: Any, backend: str, attack: str
) -> None:
    if backend == "hostprocess":
        pytest.skip("python_guards=False is refused at this level (tests/test_result_bounds.py)")
    forge, why = FORGED_VALUES[attack]
    called: list[Any] = []
    async with executor_factory(
        policy=Policy(python_guards=False), timeout=30, tools={"lookup": lambda *a: called.append(a)}
    ) as ex:
        assert (await ex.run("x = 42")).ok
        # the runner's own reply carries the forged form, as a replaced runner's would
        value = await ex.run(
            FIND_RUNNER + forge + "runner.reply_value = lambda v: (forged, None, None, 0)\n'anything'"
        )
        final = await ex.run(
            FIND_RUNNER + forge + "runner.final, runner.has_final = forged, True\n"
            "raise type(runner).__mro__[0].__init__.__globals__['tools'].FinalAnswerSignal"
        )
        tool = await ex.run(
            FIND_RUNNER
            + forge
            + "reply = runner.channel.call('lookup', [forged], {}, 1 << 30)\nprint(reply['error'])"
        )
        undone = await ex.run(FIND_RUNNER + "del runner.reply_value")
        after = await ex.run("x")
    assert undone.ok, undone.error
    assert value.ok and value.value is None and not value.state_lost, value
    assert value.value_error is not None and why in value.value_error, value.value_error
    assert final.error is not None and final.error.type == "UncarriableValue", final
    assert why in final.error.message and not final.has_final_answer and final.final_answer is None
    assert tool.ok and "UncarriableValue" in tool.stdout and why in tool.stdout, tool
    assert called == []  # the tool never ran on arguments that did not decode
    assert after.value == 42 and not after.state_lost  # the same session: the wire itself was sound


LIBRARIES = Policy(
    allowed_imports=[*Policy().allowed_imports, "numpy", "numpy.*", "pandas", "pandas.*", "PIL", "PIL.*"]
)
"""A policy under which a define decodes arrays and images as such (so their bounds are checked)."""


@pytest.mark.parametrize("attack", sorted(FORGED_VALUES))
async def test_a_forged_define_is_refused_before_it_costs_memory(executor_factory: Any, attack: str) -> None:
    forge, why = FORGED_VALUES[attack]
    scope: dict[str, Any] = {}
    exec(forge, scope)  # the forged form, made here: a define the parent's encoder never wrote
    async with executor_factory(timeout=30, policy=LIBRARIES) as ex:
        assert (await ex.run("x = 42")).ok
        has_libraries = (await ex.run("import numpy, PIL.Image")).ok
        refused = await ex.session.define({"fine": 1, "forged": scope["forged"]})
        unbound = await ex.run("fine")
        after = await ex.run("x")
    if not has_libraries and refused is None:  # this sandbox lacks them: the value stayed encoded
        assert why in ("needs 8,796,093,022,208 bytes", "200000x200000 pixels")
    else:
        assert refused is not None and why in refused, refused
        assert unbound.error is not None and unbound.error.type == "NameError"  # all or none
    assert after.value == 42 and not after.state_lost  # the same session, intact


GUARDED_NAMES = (
    "_getattr_",
    "__builtins__",
    "_print_",
    "final_answer",
    "ToolError",
    "lookup",
    "for",
    "a b",
    "",
)


async def test_a_define_binds_no_name_the_sandbox_guards_even_unchecked_by_the_parent(
    executor_factory: Any,
) -> None:
    async with executor_factory(timeout=30, tools={"lookup": lambda: "looked up"}) as ex:
        session = ex.session
        refusals = {name: await session.define({"fine": 1, name: 0}) for name in GUARDED_NAMES}
        not_a_mapping = await session.define(["fine"])  # type: ignore[arg-type]
        intact = await ex.run("fine = 'x'.upper()\nfine, lookup(), callable(final_answer)")
    for name, refused in refusals.items():
        assert refused is not None and repr(name) in refused, (name, refused)
    assert not_a_mapping is not None and "JSON object" in not_a_mapping
    assert intact.value == ("X", "looked up", True), intact.error  # the guard's hooks and the tools are whole


def test_import_sandboxes_imports_no_optional_library() -> None:
    probe = (
        "import sys\nimport sandboxes\nfrom sandboxes.runtime import values\n"
        "values.decode(values.encode({'a': (1, b'x', {2})}))\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'PIL') if m in sys.modules))"
    )
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"
