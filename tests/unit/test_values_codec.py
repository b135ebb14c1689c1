"""The values codec (`sandboxes/runtime/values.py`) on its own: every type of the table round-trips
through real JSON text; hostile encoded values are refused with `Malformed` before they cost memory;
what cannot be carried is refused naming its path and type; the code's subclasses run nothing."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import math
import pathlib
import struct
import threading
import tracemalloc
import uuid
import zlib
import zoneinfo
from collections import OrderedDict, defaultdict, namedtuple
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxes.runtime import values
from sandboxes.runtime.values import TAG, EncodedValue, Limits, Malformed, Uncarriable, decode, encode


def through_json(value: Any, **options: Any) -> Any:
    """`value` encoded, written as strict JSON text (no NaN), parsed and decoded: what crosses."""
    text = json.dumps(encode(value), allow_nan=False)
    return decode(json.loads(text), **options)


STANDARD = [
    None,
    True,
    False,
    0,
    -(2**53),
    2**53 + 1,
    -(2**200),
    1.5,
    -0.0,
    "é\u2028x",
    b"\x00\xffbytes",
    bytearray(b"ab"),
    [1, [2, [3]]],
    (1, "a", (2,)),
    (),
    {"a": 1, "b": [None]},
    {1: "one", (2, 3): "pair", None: 0, b"k": 1.5, frozenset({1}): "f"},
    {TAG: "bytes", "value": "AA=="},  # data that looks like a tag stays data
    {"outer": {TAG: "tuple", "value": [1]}},
    set(),
    {1, "x", (2, 3)},
    frozenset({b"a", 2}),
    1 + 2j,
    dt.datetime(2024, 2, 29, 23, 59, 59, 999_999),
    dt.datetime(2024, 1, 2, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))),
    dt.datetime(2024, 1, 2, tzinfo=dt.UTC),
    dt.date(1, 1, 1),
    dt.time(23, 59, 1, 5),
    dt.time(1, 2, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    dt.timedelta(days=-3, seconds=5, microseconds=7),
    decimal.Decimal("-1.2300"),
    decimal.Decimal("Infinity"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    pathlib.Path("/workspace/out.csv"),
    pathlib.PurePosixPath("relative/name"),
]


@pytest.mark.parametrize("value", STANDARD, ids=lambda v: type(v).__name__)
def test_every_standard_type_round_trips_with_its_own_type(value: Any) -> None:
    decoded = through_json(value)
    assert type(decoded) is type(value) and decoded == value
    if isinstance(value, dict):  # nested types too, key by key
        for key in value:
            assert type(value[key]) is type(decoded[key])
    if isinstance(value, dt.datetime | dt.time):
        assert decoded.utcoffset() == value.utcoffset()


def test_non_finite_floats_and_decimals_round_trip() -> None:
    assert math.isnan(through_json(float("nan")))
    assert through_json([float("inf"), float("-inf")]) == [float("inf"), float("-inf")]
    assert through_json(decimal.Decimal("NaN")).is_nan()


def test_a_zoned_datetime_keeps_its_zone() -> None:
    value = dt.datetime(2024, 7, 1, 12, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
    decoded = through_json(value)
    assert decoded == value and decoded.tzinfo == zoneinfo.ZoneInfo("Europe/Paris")
    assert decoded.utcoffset() == dt.timedelta(hours=2)


def test_plain_json_is_its_own_encoding() -> None:
    plain = {"id": 7, "tags": ["a", "b"], "score": 0.5, "ok": True, "none": None}
    encoded = encode(plain)
    assert encoded == plain and encoded is not plain  # a copy: the original may change afterwards
    assert encode([1, "x"]) == [1, "x"]


def test_subclasses_cross_as_their_base_type_without_running_their_methods() -> None:
    ran: list[str] = []

    class Loud(dict):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            ran.append("iter")
            return super().__iter__()

        def items(self) -> Any:
            ran.append("items")
            return super().items()

        def keys(self) -> Any:
            ran.append("keys")
            return super().keys()

    class Text(str):
        def __str__(self) -> str:
            ran.append("str")
            return "forged"

    class Items(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            ran.append("list iter")
            return iter(["forged"])

    point = namedtuple("point", "x y")
    decoded = through_json(
        [Loud(a=1), Text("real"), Items([1]), point(1, 2), defaultdict(int, k=1), OrderedDict(z=0)]
    )
    assert decoded == [{"a": 1}, "real", [1], (1, 2), {"k": 1}, {"z": 0}]
    assert [type(v) for v in decoded] == [dict, str, list, tuple, dict, dict]
    assert ran == []


def test_what_cannot_be_carried_is_refused_naming_its_path_and_type() -> None:
    class Handle:
        pass

    with pytest.raises(Uncarriable) as refused:
        encode({"rows": [1, 2, 3, Handle()]}, path="answer", crossing="leave the sandbox")
    assert str(refused.value).startswith("answer['rows'][3]: a ")
    assert "Handle object cannot leave the sandbox" in str(refused.value)
    with pytest.raises(Uncarriable, match=r"value\[0\]: a _thread.lock object cannot"):
        encode([threading.Lock()])  # not `print`: another test may have wrapped it in a function
    with pytest.raises(Uncarriable, match="nested more than"):
        loop: list[Any] = []
        loop.append(loop)
        encode(loop)
    with pytest.raises(Uncarriable, match="tzinfo"):

        class Zone(dt.tzinfo):
            def utcoffset(self, _: Any) -> dt.timedelta:
                raise AssertionError("the encoder ran the code's tzinfo")

        encode(dt.datetime(2024, 1, 1, tzinfo=Zone()))


# ---------------------------------------------------------------------- numpy, pandas, PIL

np = pytest.importorskip("numpy")


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.array([1.5, np.nan, np.inf]),
        np.array(["a", "bcd"]),
        np.array([True, False]),
        np.array(["2020-01-01", "2021-06-30"], dtype="datetime64[D]"),
        np.zeros((0, 3)),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    ],
    ids=lambda a: str(a.dtype),
)
def test_numpy_arrays_round_trip(array: Any) -> None:
    decoded = through_json(array)
    assert type(decoded) is np.ndarray and decoded.dtype == array.dtype and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


def test_numpy_scalars_round_trip_as_numpy_scalars() -> None:
    for scalar in (np.int64(5), np.float32(1.5), np.bool_(True), np.str_("s"), np.datetime64("2020-01-01")):
        decoded = through_json(scalar)
        assert type(decoded) is type(scalar) and decoded == scalar


def test_an_object_array_is_refused_both_ways() -> None:
    with pytest.raises(Uncarriable, match="dtype object"):
        encode(np.array([1, "x"], dtype=object))
    # a forged .npy with an object dtype (what np.save writes with allow_pickle=True)
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    forged = {TAG: "numpy.ndarray", "npy": base64.b64encode(buffer.getvalue()).decode()}
    with pytest.raises(Malformed, match="object"):
        decode(forged)


def _npy(descr: str, shape: tuple[int, ...], data: bytes) -> dict[str, Any]:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    raw = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data
    return {TAG: "numpy.ndarray", "npy": base64.b64encode(raw).decode()}


def test_an_array_whose_shape_claims_more_than_its_data_is_refused_before_allocating() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(Malformed, match="needs"):
            decode(_npy("<f8", (1 << 20, 1 << 20), b"\x00" * 64))  # 8 TB claimed, 64 bytes sent
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20
    with pytest.raises(Malformed, match="simple dtype"):
        decode(_npy([("a", "<i4")], (1,), b"\x00" * 4))  # type: ignore[arg-type]
    with pytest.raises(Malformed):
        decode({TAG: "numpy.ndarray", "npy": base64.b64encode(b"\x93NUMPY\x01\x00\xff\xff{").decode()})


def _png(width: int, height: int, rows: bytes) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_images_round_trip_and_a_png_bomb_is_refused_from_its_header() -> None:
    image_module = pytest.importorskip("PIL.Image")
    image = image_module.new("RGBA", (7, 5), (10, 20, 30, 40))
    decoded = through_json(image)
    assert decoded.size == (7, 5) and decoded.mode == "RGBA" and decoded.getpixel((3, 3)) == (10, 20, 30, 40)
    # 100,000 x 100,000 pixels of zeros compress to a few KB; the header alone refuses it
    bomb = _png(100_000, 100_000, b"")
    tracemalloc.start()
    try:
        with pytest.raises(Malformed, match="100000x100000 pixels"):
            decode({TAG: "PIL.Image", "png": base64.b64encode(bomb).decode()})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20
    with pytest.raises(Malformed, match="not a PNG"):
        decode({TAG: "PIL.Image", "png": base64.b64encode(b"GIF89a" + b"\x00" * 40).decode()})


def test_pandas_frames_and_series_round_trip() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {
            "n": [1, 2, 3],
            "text": ["a", None, "c"],
            "x": [0.5, float("nan"), 2.0],
            "when": pd.to_datetime(["2020-01-01", "2021-01-01", "2022-01-01"]),
            7: [(1,), {2}, b"z"],
        },
        index=["r1", "r2", "r3"],
    )
    pd.testing.assert_frame_equal(through_json(frame), frame)
    series = pd.Series([1.5, 2.5], name="s", index=pd.RangeIndex(10, 12))
    pd.testing.assert_series_equal(through_json(series), series)
    with pytest.raises(Uncarriable, match="MultiIndex"):
        encode(frame.set_index(["n", "text"]))
    forged = json.loads(json.dumps(encode(series)))
    forged["index"]["range"] = [0, 10**12, 1]  # an index far longer than its values
    with pytest.raises(Malformed):
        decode(forged)


# ---------------------------------------------------------------------- hostile encoded values


@pytest.mark.parametrize(
    ("forged", "why"),
    [
        ({TAG: "pickle", "value": "gASV"}, "unknown type tag"),
        ({TAG: ["tuple"], "value": []}, "unknown type tag"),
        ({TAG: "tuple", "value": "not a list"}, "needs a list"),
        ({TAG: "set", "value": [[1]]}, "cannot be a list"),
        ({TAG: "dict", "value": [[{"a": 1}, 2]]}, "cannot be a dict"),
        ({TAG: "dict", "value": [[1]]}, "pairs"),
        ({TAG: "int", "value": "12"}, "hex"),
        ({TAG: "int", "value": "0x" + "f" * 2_000_000}, "longer than"),
        ({TAG: "float", "value": "1e400"}, "'nan'"),
        ({TAG: "bytes", "value": "!!!"}, "malformed 'bytes'"),
        ({TAG: "datetime", "value": "not a date"}, "malformed 'datetime'"),
        ({TAG: "timedelta", "value": [10**12, 0, 0]}, "malformed 'timedelta'"),
        ({TAG: "decimal", "value": "1+1"}, "not a number"),
        ({TAG: "uuid", "value": "x" * 10}, "malformed 'uuid'"),
    ],
)
def test_a_forged_tag_is_refused(forged: dict[str, Any], why: str) -> None:
    with pytest.raises(Malformed, match=why):
        decode(forged)


def test_bounds_are_checked_before_the_values_are_made() -> None:
    deep: Any = "leaf"
    for _ in range(150):
        deep = [deep]
    with pytest.raises(Malformed, match="nested more than 100"):
        decode(deep)
    with pytest.raises(Malformed, match="more than 1,000 elements"):
        decode(list(range(2_000)), Limits(items=1_000))
    with pytest.raises(Malformed, match="more than 1,000 bytes"):
        decode({TAG: "bytes", "value": "A" * 4_000}, Limits(bytes=1_000))
    with pytest.raises(Malformed, match="elements"):
        decode({TAG: "tuple", "value": [0] * 2_000}, Limits(items=1_000))


def test_a_missing_library_gives_an_encoded_value_that_encodes_back() -> None:
    encoded = json.loads(json.dumps(encode(np.arange(3))))
    fallback = decode(encoded, importer=lambda name: None)
    assert isinstance(fallback, EncodedValue) and fallback.type == "numpy.ndarray"
    assert fallback.payload() is not None and fallback.payload().startswith(b"\x93NUMPY")  # type: ignore[union-attr]
    assert encode(fallback) == encoded
    np.testing.assert_array_equal(decode(encode(fallback)), np.arange(3))


# ---------------------------------------------------------------------- properties

json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-values.JSON_INT_LIMIT, values.JSON_INT_LIMIT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
hashable = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
typed = st.recursive(
    json_like
    | st.integers()
    | st.binary(max_size=20)
    | st.datetimes()
    | st.dates()
    | st.timedeltas()
    | st.uuids(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.sets(hashable, max_size=3)
        | st.dictionaries(hashable, inner, max_size=3)
        | st.dictionaries(st.sampled_from([TAG, "value", "x"]), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_like)
def test_plain_json_round_trips_as_itself(value: Any) -> None:
    assert through_json(value) == value
    assert json.dumps(encode(value)) == json.dumps(value)


@settings(max_examples=300, deadline=None)
@given(typed)
def test_typed_values_round_trip_with_their_types(value: Any) -> None:
    decoded = through_json(value)
    assert decoded == value
    _same_types(decoded, value)


def _same_types(decoded: Any, value: Any) -> None:
    assert type(decoded) is type(value)
    if isinstance(value, list | tuple):
        for left, right in zip(decoded, value, strict=True):
            _same_types(left, right)
    elif isinstance(value, dict):
        for key, item in value.items():
            _same_types(decoded[key], item)
