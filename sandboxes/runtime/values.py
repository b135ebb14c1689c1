"""The one codec for every value that crosses the sandbox boundary, both ways: a tagged JSON form.

Final answers, the last expression's value, tool arguments and results, variables sent in: each
crosses as JSON in which plain JSON stays itself (str-keyed dicts, lists, str, bool, None, finite
floats, ints within +-2**53) and every other type is one object tagged with `TAG`::

    {"$kodeagent": "tuple", "value": [1, 2]}
    {"$kodeagent": "dict", "value": [[1, "a"], [2, "b"]]}    (a dict with other keys, or with TAG)
    {"$kodeagent": "bytes", "value": "<base64>"}
    {"$kodeagent": "numpy.ndarray", "npy": "<base64 of the .npy file>"}

(the table of every type is in docs/values.md). A dict of the data that holds the key `TAG` is sent
as the tagged ``dict`` form, so no data can pass for a tag.

Why not pickle: the runner is inside the sandbox, and unpickling its bytes would run its code in the
parent. Decoding here executes nothing and makes only the declared type; everything is bounded
(`Limits`: depth, element count, bytes, pixels) and checked *before* what it costs is allocated: an
array's shape times its item size and an image's pixels (read from its PNG header) are checked
before the array or image exists. Encoding uses exact type checks (`type(v) is dict`), never a
value's own methods, so a subclass the code made cannot run code in the encoder; what it cannot
carry is refused with `Uncarriable`, naming the value's path and type (``answer['rows'][3]: a socket
object cannot leave the sandbox``), never turned into a string.

numpy, pandas and PIL are never imported here: an array is recognised only when numpy is already in
`sys.modules` (the value could not exist otherwise), and a decoder imports them on meeting their tag.
Where one is missing the value decodes to `EncodedValue` (its tag and fields), which encodes back to
the same form. Standard library only: this file runs inside every sandbox.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import io
import json
import math
import pathlib
import struct
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

TAG = "$kodeagent"
"""The key that marks a tagged value."""

JSON_INT_LIMIT = 2**53
"""Ints beyond +-this are tagged (as hex): JSON readers other than Python's lose their precision."""


class CodecError(Exception):
    """Base of the codec's errors."""


class Uncarriable(CodecError, TypeError):
    """A value (or a part of it) that the codec does not carry; `path` says where, `kind` its type."""

    def __init__(self, path: str, kind: str, why: str = "") -> None:
        self.path, self.kind = path, kind
        super().__init__(f"{path}: {why or f'a {kind} object cannot cross the sandbox boundary'}")


class Malformed(CodecError, ValueError):
    """An encoded value that is not the codec's form, or is past its bounds (hostile or corrupt input)."""


@dataclass(frozen=True)
class Limits:
    """What one encoded value may hold at most; checked before the memory is taken."""

    depth: int = 100
    """Nesting of containers."""
    items: int = 10_000_000
    """Elements of all containers together (a dict's pair counts once)."""
    bytes: int = 64 << 20
    """Bytes of all strings, bytes, arrays and images (decoded pixels) together."""
    pixels: int = 32_000_000
    """Pixels of one image."""


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class EncodedValue:
    """A value whose library this side lacks (numpy, pandas or PIL), as it came: `type` is its tag
    (``"numpy.ndarray"``, ``"pandas.DataFrame"``, ``"PIL.Image"``...) and `fields` the rest of its
    tagged form, still encoded. It encodes back to that same form, so it can be passed on."""

    type: str
    fields: dict[str, Any] = field(repr=False)
    reason: str = ""

    def payload(self) -> bytes | None:
        """The raw bytes it carries (the ``.npy`` file, the PNG), when it carries one field of them."""
        for key in ("npy", "png"):
            data = self.fields.get(key)
            if isinstance(data, str):
                return base64.b64decode(data)
        return None


# ---------------------------------------------------------------------- encoding


def encode(
    value: Any,
    limits: Limits = DEFAULT_LIMITS,
    path: str = "value",
    crossing: str = "cross the sandbox boundary",
) -> Any:
    """`value` in the tagged JSON form (new containers: the original may change afterwards), or
    `Uncarriable` naming the first part that cannot be carried (or makes it pass `limits`);
    `crossing` says where it was going ("leave the sandbox")."""
    encoder = _Encoder(limits, crossing)
    try:
        return encoder.encode(value, (path,), 0)
    except RecursionError:
        raise Uncarriable(path, "value", "nested too deeply to carry") from None
    except RuntimeError as exc:  # a container changed size while it was read (the code's threads)
        raise Uncarriable(path, "value", f"it changed while it was being sent ({exc})") from None


class _Key:
    """A dict key in a path, formatted only if the path is ever shown."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


def _where(chain: tuple[Any, ...]) -> str:
    """The path of a part (``answer['rows'][3]``) from its chain: (parent chain, index, _Key or text)."""
    parts: list[str] = []
    while len(chain) == 2:
        chain, part = chain
        if type(part) is int:
            parts.append(f"[{part}]")
        elif type(part) is _Key:
            parts.append(_key_text(part.key))
        else:
            parts.append(part)
    parts.append(chain[0])
    return "".join(reversed(parts))


def _key_text(key: Any) -> str:
    if type(key) is str or type(key) is int:
        text = repr(key)
        return f"[{text if len(text) <= 60 else text[:57] + '...'}]"
    return f"[<{type(key).__name__} key>]"


def _tagged(kind: str, **fields: Any) -> dict[str, Any]:
    return {TAG: kind, **fields}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class _Encoder:
    def __init__(self, limits: Limits, crossing: str) -> None:
        self.limits = limits
        self.crossing = crossing
        self.items = 0
        self.bytes = 0

    def count(self, items: int, chain: tuple[Any, ...]) -> None:
        self.items += items
        if self.items > self.limits.items:
            raise Uncarriable(_where(chain), "value", f"more than {self.limits.items:,} elements to carry")

    def size(self, size: int, chain: tuple[Any, ...]) -> None:
        self.bytes += size
        if self.bytes > self.limits.bytes:
            raise Uncarriable(_where(chain), "value", f"more than {self.limits.bytes:,} bytes to carry")

    def encode(self, value: Any, chain: tuple[Any, ...], depth: int) -> Any:
        kind = type(value)
        if kind is str:
            self.size(len(value), chain)
            return value
        if value is None or kind is bool:
            return value
        if kind is int:
            if -JSON_INT_LIMIT <= value <= JSON_INT_LIMIT:
                return value
            text = hex(value)
            self.size(len(text), chain)
            return _tagged("int", value=text)
        if kind is float:
            if math.isfinite(value):
                return value
            return _tagged("float", value=repr(value))  # 'nan', 'inf', '-inf'
        if depth >= self.limits.depth:
            raise Uncarriable(
                _where(chain), _type_name(kind), f"nested more than {self.limits.depth} levels deep"
            )
        if kind is list:
            self.count(len(value), chain)
            return self.elements(value, chain, depth)
        if kind is dict:
            return self.mapping(value, list(value.items()), chain, depth)
        if kind is tuple or kind is set or kind is frozenset:
            self.count(len(value), chain)
            name = kind.__name__
            return _tagged(
                name,
                value=[
                    self.encode(item, (chain, f"[{index}]"), depth + 1) for index, item in enumerate(value)
                ],
            )
        simple = _SIMPLE.get(kind)
        if simple is not None:
            encoded = simple(value, _where(chain))
            self.size(len(str(encoded.get("value", ""))), chain)
            return encoded
        if kind is complex:
            return _tagged(
                "complex",
                value=[self.encode(value.real, chain, depth + 1), self.encode(value.imag, chain, depth + 1)],
            )
        found = self.extension(value, chain, depth)  # numpy's float64 and str_ are subclasses too
        if found is not _UNKNOWN:
            return found
        if issubclass(kind, dict):  # a subclass of the code's: its items as dict's own C code reads them
            return self.mapping(None, list(dict.items(value)), chain, depth)
        for base, convert in _BASES:
            # read by the base type's C methods, which call nothing of the subclass
            if issubclass(kind, base):
                return self.encode(convert(value), chain, depth)
        name = _type_name(kind)
        raise Uncarriable(_where(chain), name, f"a {name} object cannot {self.crossing}")

    def elements(self, value: Any, chain: tuple[Any, ...], depth: int) -> list[Any]:
        """The elements of a list, tuple or set, scalars inline (the common case, kept fast)."""
        out: list[Any] = []
        append = out.append
        for index, item in enumerate(value):
            kind = type(item)
            if kind is str:
                self.size(len(item), chain)
                append(item)
            elif item is None or kind is bool or (kind is float and math.isfinite(item)):
                append(item)
            elif kind is int and -JSON_INT_LIMIT <= item <= JSON_INT_LIMIT:
                append(item)
            else:
                append(self.encode(item, (chain, index), depth + 1))
        return out

    def mapping(
        self, exact: dict[Any, Any] | None, pairs: list[tuple[Any, Any]], chain: tuple[Any, ...], depth: int
    ) -> Any:
        """A dict by its items: plain when every key is an exact str and none is `TAG` (tested on
        `exact`, a dict whose keys are then all str: `in` compares nothing of the code's), else the
        tagged list of pairs."""
        self.count(len(pairs), chain)
        plain = True
        for key, _ in pairs:
            if type(key) is not str or key == TAG:
                plain = False
                break
        if plain:
            for key, _ in pairs:
                self.size(len(key), chain)
            out: dict[str, Any] = {}
            for key, item in pairs:
                kind = type(item)
                if kind is str:
                    self.size(len(item), chain)
                    out[key] = item
                elif item is None or kind is bool or (kind is float and math.isfinite(item)):
                    out[key] = item
                elif kind is int and -JSON_INT_LIMIT <= item <= JSON_INT_LIMIT:
                    out[key] = item
                else:
                    out[key] = self.encode(item, (chain, _Key(key)), depth + 1)
            return out
        encoded = []
        for key, item in pairs:
            where = (chain, _Key(key))
            encoded.append(
                [self.encode(key, (where, " (the key)"), depth + 1), self.encode(item, where, depth + 1)]
            )
        return _tagged("dict", value=encoded)

    def extension(self, value: Any, chain: tuple[Any, ...], depth: int) -> Any:
        kind = type(value)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if kind is numpy.ndarray:
                return _tagged("numpy.ndarray", npy=_b64(self.npy(numpy, value, chain)))
            if kind in _numpy_scalar_types(numpy):
                return _tagged("numpy.scalar", npy=_b64(self.npy(numpy, numpy.asarray(value), chain)))
        pandas = sys.modules.get("pandas")
        if pandas is not None:
            if kind is pandas.DataFrame:
                return self.dataframe(pandas, value, chain, depth)
            if kind is pandas.Series:
                return self.series(pandas, value, chain, depth)
        pil = sys.modules.get("PIL.Image")
        if pil is not None and _is_pil_image(pil, kind):
            return self.image(value, chain)
        return _UNKNOWN

    def npy(self, numpy: Any, array: Any, chain: tuple[Any, ...]) -> bytes:
        if array.dtype.hasobject:
            raise Uncarriable(
                _where(chain), "numpy.ndarray", "a numpy array of dtype object cannot cross (use .tolist())"
            )
        self.size(int(array.nbytes) + 128, chain)
        buffer = io.BytesIO()
        numpy.save(buffer, array, allow_pickle=False)
        return buffer.getvalue()

    def column(self, pandas: Any, values: Any, chain: tuple[Any, ...], depth: int) -> dict[str, Any]:
        """One column (or an index) by dtype: numpy's own dtypes as `.npy`, others element by element."""
        numpy = sys.modules["numpy"]
        dtype = values.dtype
        if isinstance(dtype, numpy.dtype) and not dtype.hasobject:
            return {"dtype": str(dtype), "npy": _b64(self.npy(numpy, numpy.asarray(values), chain))}
        items = list(values.tolist() if hasattr(values, "tolist") else values)
        self.count(len(items), chain)
        return {
            "dtype": str(dtype),
            "values": [self.element(pandas, item, (chain, i), depth + 1) for i, item in enumerate(items)],
        }

    def element(self, pandas: Any, item: Any, chain: tuple[Any, ...], depth: int) -> Any:
        if item is pandas.NA:
            return _tagged("pandas.NA")
        if item is pandas.NaT:
            return _tagged("pandas.NaT")
        kind = type(item)
        if kind is pandas.Timestamp:
            item = item.to_pydatetime()
        elif kind is pandas.Timedelta:
            item = item.to_pytimedelta()
        return self.encode(item, chain, depth)

    def index(self, pandas: Any, index: Any, chain: tuple[Any, ...], depth: int) -> dict[str, Any]:
        if type(index) is pandas.MultiIndex:
            raise Uncarriable(
                _where(chain), "pandas.MultiIndex", "a MultiIndex cannot cross (reset_index() first)"
            )
        name = self.encode(index.name, (chain, ".name"), depth + 1)
        if type(index) is pandas.RangeIndex:
            return {"name": name, "range": [index.start, index.stop, index.step]}
        return {"name": name, **self.column(pandas, index, chain, depth)}

    def dataframe(self, pandas: Any, frame: Any, chain: tuple[Any, ...], depth: int) -> dict[str, Any]:
        columns = list(frame.columns)
        self.count(len(columns), chain)
        if type(frame.columns) is pandas.MultiIndex:
            raise Uncarriable(_where(chain), "pandas.DataFrame", "MultiIndex columns cannot cross")
        return _tagged(
            "pandas.DataFrame",
            columns=[self.encode(label, (chain, ".columns"), depth + 1) for label in columns],
            index=self.index(pandas, frame.index, (chain, ".index"), depth),
            data=[
                self.column(pandas, frame.iloc[:, i], (chain, _Key(label)), depth)
                for i, label in enumerate(columns)
            ],
        )

    def series(self, pandas: Any, series: Any, chain: tuple[Any, ...], depth: int) -> dict[str, Any]:
        return _tagged(
            "pandas.Series",
            name=self.encode(series.name, (chain, ".name"), depth + 1),
            index=self.index(pandas, series.index, (chain, ".index"), depth),
            data=self.column(pandas, series, chain, depth),
        )

    def image(self, image: Any, chain: tuple[Any, ...]) -> dict[str, Any]:
        width, height = image.size
        if width * height > self.limits.pixels:
            raise Uncarriable(
                _where(chain),
                "PIL.Image",
                f"an image of {width}x{height} pixels is past the {self.limits.pixels:,} carried",
            )
        self.size(width * height * 4, chain)
        buffer = io.BytesIO()
        try:
            image.save(buffer, format="PNG")
        except (OSError, ValueError, KeyError) as exc:
            raise Uncarriable(
                _where(chain), "PIL.Image", f"an image of mode {image.mode!r} cannot be saved as PNG ({exc})"
            ) from None
        return _tagged("PIL.Image", png=_b64(buffer.getvalue()))


_UNKNOWN = object()
"""What `_Encoder.extension` returns for a type of no optional library."""


def _type_name(kind: type) -> str:
    module = getattr(kind, "__module__", "")
    name = getattr(kind, "__qualname__", "?")
    name = name if type(name) is str else "?"
    return name if module in ("builtins", "__main__", None) or type(module) is not str else f"{module}.{name}"


def _is_pil_image(pil: Any, kind: type) -> bool:
    """A class of PIL's own (Image.Image or one of its plugins' subclasses), never the code's: every
    class up to Image.Image must be the attribute of a PIL module that its name says it is."""
    base = pil.Image
    if not isinstance(kind, type) or not issubclass(kind, base):
        return False
    for cls in kind.__mro__:
        if cls is base:
            return True
        module = cls.__dict__.get("__module__")
        if type(module) is not str or not module.startswith("PIL."):
            return False
        owner = sys.modules.get(module)
        if owner is None or getattr(owner, cls.__name__, None) is not cls:
            return False
    return False


_numpy_scalars: dict[int, frozenset[type]] = {}


def _numpy_scalar_types(numpy: Any) -> frozenset[type]:
    found = _numpy_scalars.get(id(numpy))
    if found is None:
        found = frozenset(
            kind
            for kind in set(numpy.sctypeDict.values())
            if isinstance(kind, type) and issubclass(kind, numpy.generic) and kind is not numpy.object_
        )
        _numpy_scalars[id(numpy)] = found
    return found


def _datetime(value: _dt.datetime, where: str) -> dict[str, Any]:
    zone = _zone_key(value.tzinfo, where, "datetime")
    encoded = _tagged("datetime", value=value.isoformat())
    if zone:
        encoded["zone"] = zone
    return encoded


def _zone_key(tzinfo: Any, where: str, what: str) -> str | None:
    """None for no tzinfo or a fixed offset (in the ISO text); a ZoneInfo's key; else refused: a
    tzinfo of the code's own would run its methods in the encoder."""
    if tzinfo is None or type(tzinfo) is _dt.timezone:
        return None
    zoneinfo = sys.modules.get("zoneinfo")
    if zoneinfo is not None and type(tzinfo) is zoneinfo.ZoneInfo and what == "datetime":
        key = tzinfo.key
        return key if type(key) is str else None
    raise Uncarriable(where, what, f"a {what} with a tzinfo of type {_type_name(type(tzinfo))} cannot cross")


def _time(value: _dt.time, where: str) -> dict[str, Any]:
    _zone_key(value.tzinfo, where, "time")
    return _tagged("time", value=value.isoformat())


_BASES: tuple[tuple[type, Any], ...] = (
    (str, str.__str__),
    (bool, bool),
    (int, int.__index__),
    (float, float.__float__),
    (list, list.copy),
    (tuple, lambda v: tuple.__getitem__(v, slice(None))),
    (set, set.copy),
    (frozenset, frozenset.copy),
)
"""Subclasses of the builtin types (a namedtuple, an IntEnum, a defaultdict) cross as their base
type, read by the base type's own methods, which call nothing the subclass defines."""

_SIMPLE: dict[type, Any] = {
    bytes: lambda v, where: _tagged("bytes", value=_b64(v)),
    bytearray: lambda v, where: _tagged("bytearray", value=_b64(bytes(v))),
    _dt.datetime: _datetime,
    _dt.date: lambda v, where: _tagged("date", value=v.isoformat()),
    _dt.time: _time,
    _dt.timedelta: lambda v, where: _tagged("timedelta", value=[v.days, v.seconds, v.microseconds]),
    decimal.Decimal: lambda v, where: _tagged("decimal", value=str(v)),
    uuid.UUID: lambda v, where: _tagged("uuid", value=str(v)),
    pathlib.PosixPath: lambda v, where: _tagged("path", value=str(v)),
    pathlib.PurePosixPath: lambda v, where: _tagged("purepath", value=str(v)),
}
"""Encoders of exact standard-library types to one tagged text (or list)."""


def shown(value: Any) -> str:
    """A decoded value as text for a reader (a model, a terminal): its JSON when it is plain JSON,
    else its repr(), which shows its type (``(1, 2)``, ``{1: 'a'}``, ``b'x'``); never the tagged form."""
    try:
        encoded = encode(value)
    except Uncarriable:
        return repr(value)
    if encoded == value and _plain(encoded):
        return json.dumps(encoded, ensure_ascii=False)
    return repr(value)


def _plain(value: Any) -> bool:
    if type(value) is list:
        return all(_plain(item) for item in value)
    if type(value) is dict:
        return TAG not in value and all(_plain(item) for item in value.values())
    return value is None or type(value) in (str, int, float, bool)


# ---------------------------------------------------------------------- decoding


def decode(data: Any, limits: Limits = DEFAULT_LIMITS, importer: Any = None) -> Any:
    """The value that `data` (parsed JSON in the tagged form) encodes, or `Malformed` saying what is
    wrong with it. Nothing is executed; each tag makes only its type; bounds are checked before the
    memory they cost is taken. `importer(name)` imports numpy, pandas or PIL when their tag is met
    (default: `importlib.import_module`; None back, or ImportError: the value stays an `EncodedValue`)."""
    decoder = _Decoder(limits, importer)
    try:
        return decoder.decode(data, 0)
    except RecursionError:
        raise Malformed("the value is nested too deeply") from None


class _Decoder:
    def __init__(self, limits: Limits, importer: Any) -> None:
        self.limits = limits
        self.importer = importer
        self.items = 0
        self.bytes = 0

    def count(self, items: int) -> None:
        self.items += items
        if self.items > self.limits.items:
            raise Malformed(f"the value holds more than {self.limits.items:,} elements")

    def size(self, size: int) -> None:
        self.bytes += size
        if self.bytes > self.limits.bytes:
            raise Malformed(f"the value holds more than {self.limits.bytes:,} bytes")

    def module(self, name: str) -> Any:
        try:
            if self.importer is not None:
                return self.importer(name)
            import importlib

            return importlib.import_module(name)
        except ImportError:
            return None

    def decode(self, data: Any, depth: int) -> Any:
        kind = type(data)
        if kind is str:
            self.size(len(data))
            return data
        if data is None or kind is bool or kind is int or kind is float:
            return data
        if depth >= self.limits.depth:
            raise Malformed(f"the value is nested more than {self.limits.depth} levels deep")
        if kind is list:
            self.count(len(data))
            out: list[Any] = []
            append = out.append
            for item in data:
                inner = type(item)
                if inner is str:
                    self.size(len(item))
                    append(item)
                elif item is None or inner is int or inner is float or inner is bool:
                    append(item)
                else:
                    append(self.decode(item, depth + 1))
            return out
        if kind is dict:
            if TAG in data:
                return self.tagged(data, depth)
            self.count(len(data))
            found: dict[str, Any] = {}
            for key, item in data.items():
                self.size(len(key))
                inner = type(item)
                if inner is str:
                    self.size(len(item))
                    found[key] = item
                elif item is None or inner is int or inner is float or inner is bool:
                    found[key] = item
                else:
                    found[key] = self.decode(item, depth + 1)
            return found
        raise Malformed(f"a {kind.__name__} is not JSON")

    # -------------------------------------------------------------- tagged forms

    def tagged(self, data: dict[str, Any], depth: int) -> Any:
        tag = data[TAG]
        handler = _DECODERS.get(tag) if type(tag) is str else None
        if handler is None:
            shown = repr(tag)[:60]
            raise Malformed(f"unknown type tag {shown}")
        try:
            return handler(self, data, depth)
        except CodecError:
            raise
        except (ValueError, TypeError, KeyError, OverflowError, IndexError, struct.error) as exc:
            raise Malformed(f"a malformed {tag!r} value: {str(exc)[:200]}") from None

    def text(self, data: dict[str, Any], key: str = "value", limit: int | None = None) -> str:
        value = data.get(key)
        if type(value) is not str:
            raise Malformed(f"a {data[TAG]!r} value needs the text field {key!r}")
        if limit is not None and len(value) > limit:
            raise Malformed(f"a {data[TAG]!r} value's {key!r} is longer than {limit} characters")
        self.size(len(value))
        return value

    def items_of(self, data: dict[str, Any], depth: int) -> list[Any]:
        value = data.get("value")
        if type(value) is not list:
            raise Malformed(f"a {data[TAG]!r} value needs a list")
        self.count(len(value))
        return [self.decode(item, depth + 1) for item in value]

    def binary(self, data: dict[str, Any], key: str) -> bytes:
        text = data.get(key)
        if type(text) is not str:
            raise Malformed(f"a {data[TAG]!r} value needs the base64 field {key!r}")
        self.size(len(text) * 3 // 4)
        return base64.b64decode(text, validate=True)

    def fallback(self, data: dict[str, Any], why: str) -> EncodedValue:
        for value in data.values():  # its payloads still count against the bounds
            if type(value) is str:
                self.size(len(value))
        return EncodedValue(str(data[TAG]), {k: v for k, v in data.items() if k != TAG}, why)

    def npy(self, raw: bytes, numpy: Any) -> Any:
        dtype, shape, offset = _npy_header(raw)
        element = numpy.dtype(dtype)
        if element.hasobject:
            raise Malformed(f"a .npy of dtype {dtype!r} is refused (object dtypes never cross)")
        count = math.prod(shape)
        if count * element.itemsize != len(raw) - offset:
            raise Malformed(
                f"a .npy of shape {shape} and dtype {dtype!r} needs {count * element.itemsize:,} bytes of "
                f"data, not {len(raw) - offset:,}"
            )
        return numpy.load(io.BytesIO(raw), allow_pickle=False)

    def column(self, data: Any, numpy: Any, pandas: Any, depth: int) -> Any:
        if type(data) is not dict:
            raise Malformed("a pandas column must be an object")
        dtype = data.get("dtype")
        if type(dtype) is not str or len(dtype) > 100:
            raise Malformed("a pandas column needs a dtype name")
        if "npy" in data:
            raw = self.binary(data, "npy")
            return self.npy(raw, numpy)
        values = data.get("values")
        if type(values) is not list:
            raise Malformed("a pandas column needs 'npy' or 'values'")
        self.count(len(values))
        decoded = [self.element(item, pandas, depth + 1) for item in values]
        return pandas.array(
            decoded, dtype=object if dtype == "object" else pandas.api.types.pandas_dtype(dtype)
        )

    def element(self, item: Any, pandas: Any, depth: int) -> Any:
        if type(item) is dict and item.get(TAG) == "pandas.NA":
            return pandas.NA
        if type(item) is dict and item.get(TAG) == "pandas.NaT":
            return pandas.NaT
        return self.decode(item, depth)

    def index(self, data: Any, numpy: Any, pandas: Any, depth: int) -> Any:
        if type(data) is not dict:
            raise Malformed("a pandas index must be an object")
        name = self.decode(data.get("name"), depth + 1)
        if "range" in data:
            bounds = data["range"]
            if type(bounds) is not list or len(bounds) != 3 or any(type(b) is not int for b in bounds):
                raise Malformed("a RangeIndex needs [start, stop, step] as ints")
            span = range(*bounds)
            self.count(len(span))
            return pandas.RangeIndex(span.start, span.stop, span.step, name=name)
        return pandas.Index(self.column(data, numpy, pandas, depth), name=name)


def _npy_header(raw: bytes) -> tuple[str, tuple[int, ...], int]:
    """The dtype text, shape and data offset of a `.npy` file, read without numpy and without
    evaluating anything: the header is a Python dict literal whose three keys are checked here."""
    if raw[:6] != b"\x93NUMPY" or len(raw) < 10:
        raise Malformed("not a .npy file")
    major = raw[6]
    if major == 1:
        (length,), start = struct.unpack("<H", raw[8:10]), 10
    elif major in (2, 3):
        (length,), start = struct.unpack("<I", raw[8:12]), 12
    else:
        raise Malformed(f"a .npy of version {major} is not known")
    if length > 4096 or start + length > len(raw):
        raise Malformed("a .npy header is too long or cut")
    header = raw[start : start + length].decode("latin-1" if major < 3 else "utf-8")
    fields = _literal_dict(header.strip())
    dtype, order, shape = fields.get("descr"), fields.get("fortran_order"), fields.get("shape")
    if type(dtype) is not str:
        raise Malformed("a .npy's dtype must be a simple dtype (no structured or object dtypes)")
    if type(order) is not bool or type(shape) is not tuple or any(type(n) is not int or n < 0 for n in shape):
        raise Malformed("a .npy header needs fortran_order and a shape of counts")
    if len(shape) > 32:
        raise Malformed("a .npy has more than 32 dimensions")
    return dtype, shape, start + length


def _literal_dict(text: str) -> dict[str, Any]:
    """A `.npy` header's dict literal: str keys; str, bool or tuple-of-int values (ast.literal_eval
    evaluates nothing, and the text is at most 4 KB)."""
    import ast

    try:
        found = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise Malformed("a .npy header that is not a dict literal") from None
    if type(found) is not dict:
        raise Malformed("a .npy header that is not a dict literal")
    return found


def _png_size(raw: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, read before anything is decoded."""
    if raw[:8] != b"\x89PNG\r\n\x1a\n" or raw[12:16] != b"IHDR" or len(raw) < 33:
        raise Malformed("not a PNG file")
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


def _decode_int(self: _Decoder, data: dict[str, Any], depth: int) -> int:
    text = self.text(data, limit=1_000_000)
    if not (text.startswith("0x") or text.startswith("-0x")):
        raise Malformed("a tagged int is hex text")
    return int(text, 16)


def _decode_float(self: _Decoder, data: dict[str, Any], depth: int) -> float:
    text = self.text(data, limit=10)
    if text not in ("nan", "inf", "-inf"):
        raise Malformed("a tagged float is 'nan', 'inf' or '-inf'")
    return float(text)


def _decode_dict(self: _Decoder, data: dict[str, Any], depth: int) -> dict[Any, Any]:
    pairs = data.get("value")
    if type(pairs) is not list:
        raise Malformed("a tagged dict needs a list of [key, value] pairs")
    self.count(len(pairs))
    found: dict[Any, Any] = {}
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2:
            raise Malformed("a tagged dict needs a list of [key, value] pairs")
        key = self.decode(pair[0], depth + 1)
        _hashable(key, "a dict key")
        found[key] = self.decode(pair[1], depth + 1)
    return found


def _hashable(value: Any, what: str) -> None:
    kind = type(value)
    if kind in (list, dict, set, bytearray) or kind is EncodedValue:
        raise Malformed(f"{what} cannot be a {kind.__name__}")
    if kind is tuple:
        for item in value:
            _hashable(item, what)


def _decode_set(self: _Decoder, data: dict[str, Any], depth: int) -> Any:
    items = self.items_of(data, depth)
    for item in items:
        _hashable(item, "a set element")
    return set(items) if data[TAG] == "set" else frozenset(items)


def _decode_datetime(self: _Decoder, data: dict[str, Any], depth: int) -> _dt.datetime:
    value = _dt.datetime.fromisoformat(self.text(data, limit=64))
    zone = data.get("zone")
    if zone is not None:
        if type(zone) is not str or len(zone) > 255 or value.tzinfo is None:
            raise Malformed("a datetime's zone is the key of a time zone, with an offset in its text")
        try:
            import zoneinfo

            value = value.astimezone(zoneinfo.ZoneInfo(zone))
        except (ValueError, OSError, zoneinfo.ZoneInfoNotFoundError):
            pass  # no such zone here: the fixed offset of the text stays
    return value


def _decode_image(self: _Decoder, data: dict[str, Any], depth: int) -> Any:
    raw = self.binary(data, "png")
    width, height = _png_size(raw)
    if width * height > self.limits.pixels:
        raise Malformed(f"a PNG of {width}x{height} pixels is past the {self.limits.pixels:,} decoded")
    self.size(width * height * 8)  # at most 8 bytes a pixel (RGBA of 16 bits)
    pil = self.module("PIL.Image")
    if pil is None:
        return self.fallback(data, "PIL is not installed here")
    image = pil.open(io.BytesIO(raw), formats=["PNG"])
    if image.size != (width, height):
        raise Malformed("a PNG whose size is not its header's")
    image.load()
    return image


def _decode_array(self: _Decoder, data: dict[str, Any], depth: int) -> Any:
    raw = self.binary(data, "npy")
    _npy_header(raw)  # checked even when numpy is missing here
    numpy = self.module("numpy")
    if numpy is None:
        return self.fallback(data, "numpy is not installed here")
    array = self.npy(raw, numpy)
    if data[TAG] == "numpy.scalar":
        if array.shape != ():
            raise Malformed("a numpy scalar's .npy has the shape ()")
        scalar = array[()]
        return scalar if type(scalar) is array.dtype.type else array.dtype.type(scalar)  # str_, bytes_
    return array


def _decode_frame(self: _Decoder, data: dict[str, Any], depth: int) -> Any:
    numpy, pandas = self.module("numpy"), self.module("pandas")
    if numpy is None or pandas is None:
        return self.fallback(data, "pandas is not installed here")
    index = self.index(data.get("index"), numpy, pandas, depth)
    if data[TAG] == "pandas.Series":
        values = self.column(data.get("data"), numpy, pandas, depth)
        if len(values) != len(index):
            raise Malformed("a Series whose index and values differ in length")
        return pandas.Series(values, index=index, name=self.decode(data.get("name"), depth + 1), copy=False)
    labels, columns = data.get("columns"), data.get("data")
    if type(labels) is not list or type(columns) is not list or len(labels) != len(columns):
        raise Malformed("a DataFrame needs as many column labels as columns")
    self.count(len(labels))
    names = [self.decode(label, depth + 1) for label in labels]
    for name in names:
        _hashable(name, "a column label")
    decoded = [self.column(column, numpy, pandas, depth) for column in columns]
    if any(len(column) != len(index) or getattr(column, "ndim", 1) != 1 for column in decoded):
        raise Malformed("a DataFrame whose columns are not one-dimensional, of its index's length")
    frame = pandas.DataFrame(dict(enumerate(decoded)), index=index, copy=False)
    frame.columns = pandas.Index(names) if names else frame.columns
    return frame


def _simple(make: Any, limit: int) -> Any:
    return lambda self, data, depth: make(self.text(data, limit=limit))


def _decode_timedelta(self: _Decoder, data: dict[str, Any], depth: int) -> _dt.timedelta:
    parts = data.get("value")
    if type(parts) is not list or len(parts) != 3 or any(type(p) is not int for p in parts):
        raise Malformed("a timedelta is [days, seconds, microseconds]")
    return _dt.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2])


def _decode_complex(self: _Decoder, data: dict[str, Any], depth: int) -> complex:
    parts = self.items_of(data, depth)
    if len(parts) != 2 or any(type(p) not in (int, float) for p in parts):
        raise Malformed("a complex is [real, imag]")
    return complex(parts[0], parts[1])


def _decode_decimal(self: _Decoder, data: dict[str, Any], depth: int) -> decimal.Decimal:
    text = self.text(data, limit=100_000)
    try:
        return decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise Malformed("a decimal's text is not a number") from None


def _decode_no_value(self: _Decoder, data: dict[str, Any], depth: int) -> Any:
    # pandas.NA and NaT belong in a pandas column only (`_Decoder.element`); elsewhere, what pandas has
    pandas = self.module("pandas")
    if pandas is None:
        return self.fallback(data, "pandas is not installed here")
    return pandas.NA if data[TAG] == "pandas.NA" else pandas.NaT


_DECODERS: dict[str, Any] = {
    "int": _decode_int,
    "float": _decode_float,
    "dict": _decode_dict,
    "tuple": lambda self, data, depth: tuple(self.items_of(data, depth)),
    "set": _decode_set,
    "frozenset": _decode_set,
    "bytes": lambda self, data, depth: self.binary(data, "value"),
    "bytearray": lambda self, data, depth: bytearray(self.binary(data, "value")),
    "complex": _decode_complex,
    "datetime": _decode_datetime,
    "date": _simple(_dt.date.fromisoformat, 16),
    "time": _simple(_dt.time.fromisoformat, 32),
    "timedelta": _decode_timedelta,
    "decimal": _decode_decimal,
    "uuid": _simple(uuid.UUID, 64),
    "path": _simple(pathlib.PosixPath, 100_000),
    "purepath": _simple(pathlib.PurePosixPath, 100_000),
    "numpy.ndarray": _decode_array,
    "numpy.scalar": _decode_array,
    "pandas.DataFrame": _decode_frame,
    "pandas.Series": _decode_frame,
    "pandas.NA": _decode_no_value,
    "pandas.NaT": _decode_no_value,
    "PIL.Image": _decode_image,
}
"""Each tag's decoder: it makes that type and nothing else."""


def encode_fallback(value: EncodedValue) -> dict[str, Any]:
    """An `EncodedValue` in its tagged form again."""
    return {TAG: value.type, **value.fields}


_SIMPLE[EncodedValue] = lambda v, where: encode_fallback(v)
