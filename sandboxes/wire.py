"""Messages from the sandbox side, checked against their `TypedDict` before any field is used.

Everything a runner (or a session host, relay or node agent) sends is hostile input: code without the
Python-level guards controls its runner and can answer anything. `check(kind, message)` holds a decoded
message to the shape `runtime/protocol.py` declares for it — keys present, each value of its declared
type, recursively — and raises `ProtocolError` naming the first field that is not, so a malformed
message is discarded by the executor's one rule (`state_lost`) and never reaches a field's user as a
`TypeError` or a wrong type.

The checker is made from the declarations themselves, once per message type (the wire stays declared
in one place, in a module the runner shares that must stay standard-library only: pydantic cannot
validate a `typing.TypedDict` on Python 3.11, and the runtime cannot depend on `typing_extensions`).
It knows the shapes the wire uses: `int` (never a `bool`), `float` (an int too), `str`, `bool`, `None`,
`Any`, `Literal`, unions, `list[T]`, `dict[K, V]` and nested `TypedDict`s with `NotRequired` keys;
keys a declaration does not name are ignored.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, NotRequired, TypeVar, Union, get_args, get_origin

from .errors import ProtocolError
from .runtime import bounds

T = TypeVar("T")

Check = Callable[[Any, str], str | None]
"""Checks a value found at a path; returns what is wrong with it, or None."""


def check(kind: type[T], message: Any, what: str = "") -> T:
    """`message` as a `kind` (the same object, its shape checked), or `ProtocolError` saying which
    field is wrong. `what` names the sender in the message ("the runner" by default)."""
    problem = _checker(typing.cast(Any, kind))(message, getattr(kind, "__name__", "message"))
    if problem is not None:
        sender = what or "the runner"
        raise ProtocolError(f"{sender} sent a malformed message: {bounds.clipped(problem, 300)}")
    return typing.cast(T, message)


@functools.cache
def _checker(kind: Any) -> Check:
    origin = get_origin(kind)
    if kind is Any:
        return _anything
    if kind is None or kind is type(None):
        return _exactly(None)
    if kind is bool:
        return _of_type(bool, "bool")
    if kind is int:
        return _of_type(int, "int")
    if kind is float:
        return _number
    if kind is str:
        return _of_type(str, "str")
    if origin is Literal:
        return _literal(get_args(kind))
    if origin is Union or origin is types.UnionType:
        return _union(tuple(_checker(arg) for arg in get_args(kind)), _name(kind))
    if origin is list:
        (item,) = get_args(kind)
        return _list(_checker(item))
    if origin is dict:
        key, value = get_args(kind)
        return _dict(_checker(key), _checker(value))
    if typing.is_typeddict(kind):
        return _typed_dict(kind)
    raise TypeError(f"the wire checker does not know the type {kind!r}")


def _anything(value: Any, path: str) -> str | None:
    return None


def _exactly(expected: None) -> Check:
    def check_none(value: Any, path: str) -> str | None:
        return None if value is expected else f"{path}: expected None, got {type(value).__name__}"

    return check_none


def _of_type(kind: type, name: str) -> Check:
    def check_type(value: Any, path: str) -> str | None:
        return None if type(value) is kind else f"{path}: expected {name}, got {type(value).__name__}"

    return check_type


def _number(value: Any, path: str) -> str | None:
    if type(value) is float or type(value) is int:
        return None
    return f"{path}: expected a number, got {type(value).__name__}"


def _literal(choices: tuple[Any, ...]) -> Check:
    allowed = {(type(choice), choice) for choice in choices}

    def check_literal(value: Any, path: str) -> str | None:
        try:
            if (type(value), value) in allowed:
                return None
        except TypeError:  # unhashable
            pass
        return f"{path}: expected one of {list(choices)!r}, got {bounds.clipped(repr(value), 60)}"

    return check_literal


def _union(options: tuple[Check, ...], name: str) -> Check:
    def check_union(value: Any, path: str) -> str | None:
        for option in options:
            if option(value, path) is None:
                return None
        return f"{path}: expected {name}, got {type(value).__name__}"

    return check_union


def _list(item: Check) -> Check:
    def check_list(value: Any, path: str) -> str | None:
        if type(value) is not list:
            return f"{path}: expected a list, got {type(value).__name__}"
        for index, element in enumerate(value):
            problem = item(element, f"{path}[{index}]")
            if problem is not None:
                return problem
        return None

    return check_list


def _dict(key: Check, item: Check) -> Check:
    def check_dict(value: Any, path: str) -> str | None:
        if type(value) is not dict:
            return f"{path}: expected an object, got {type(value).__name__}"
        for name, element in value.items():
            problem = key(name, f"{path} key") or item(element, f"{path}[{bounds.clipped(repr(name), 40)}]")
            if problem is not None:
                return problem
        return None

    return check_dict


def _typed_dict(kind: Any) -> Check:
    hints = typing.get_type_hints(kind, include_extras=True)
    fields: list[tuple[str, bool, Check]] = []
    for name, hint in hints.items():
        required = get_origin(hint) is not NotRequired
        fields.append((name, required, _checker(hint if required else get_args(hint)[0])))

    def check_typed_dict(value: Any, path: str) -> str | None:
        if type(value) is not dict:
            return f"{path}: expected an object, got {type(value).__name__}"
        for name, required, field in fields:
            if name in value:
                problem = field(value[name], f"{path}.{name}")
                if problem is not None:
                    return problem
            elif required:
                return f"{path}: the field {name!r} is missing"
        return None

    return check_typed_dict


def _name(kind: Any) -> str:
    return " | ".join(getattr(arg, "__name__", repr(arg)) for arg in get_args(kind))
