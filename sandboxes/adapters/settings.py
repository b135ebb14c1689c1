"""Reading an adapter's settings file (``.json`` or ``.toml``) into its pydantic model, every mistake
one error of the adapter's own class naming the field, for `kodeagent mcp` and `kodeagent serve`."""

from __future__ import annotations

import json
import pathlib
import tomllib
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


def read_file(path: str | pathlib.Path, error: type[Exception]) -> dict[str, Any]:
    """The top-level table of a ``.json`` or ``.toml`` file; anything else raises `error`."""
    file = pathlib.Path(path)
    kind = file.suffix.lower()
    if kind not in (".json", ".toml"):
        raise error(f"{str(file)!r}: a config file ends in .json or .toml")
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read the config file {str(file)!r}: {exc.strerror or exc}") from None
    try:
        data: Any = tomllib.loads(text) if kind == ".toml" else json.loads(text)
    except ValueError as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise error(f"{str(file)!r} is not valid {kind[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{str(file)!r}: the top level must be a table/object of settings")
    return data


def validate(model: type[Model], data: dict[str, Any], source: str, error: type[Exception]) -> Model:
    """`data` as `model`; a mistake becomes one `error` naming each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise error(f"{source}: {problems}") from None
