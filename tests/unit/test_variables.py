"""Variables are checked and encoded in the parent before anything is sent (`sandboxes.variables`)."""

from __future__ import annotations

import datetime
import threading

import pytest

from sandboxes.runtime import bounds, values
from sandboxes.variables import encode_variables


def test_every_type_of_the_codec_is_encoded_and_decodes_back_whole() -> None:
    sent = {"t": (1, {2}), "k": {1: b"x"}, "d": datetime.date(2020, 1, 1), "n": float("nan")}
    encoded = encode_variables(sent)
    back = values.decode(encoded)
    assert back["t"] == (1, {2}) and type(back["t"]) is tuple and back["k"] == {1: b"x"}
    assert back["d"] == datetime.date(2020, 1, 1) and back["n"] != back["n"]


@pytest.mark.parametrize(
    "name", ["_x", "__builtins__", "_getattr_", "final_answer", "ToolError", "tool", "for", "1a", 3]
)
def test_a_name_the_sandbox_keeps_or_no_identifier_is_refused(name: object) -> None:
    with pytest.raises(ValueError, match="variable name"):
        encode_variables({name: 1}, taken=["tool"])  # type: ignore[dict-item]


def test_an_uncarriable_value_names_its_path_and_type() -> None:
    with pytest.raises(TypeError, match=r"rows\['a'\]\[2\]: a _thread.lock object cannot enter the sandbox"):
        encode_variables({"rows": {"a": [1, 2, threading.Lock()]}})
    with pytest.raises(TypeError, match="mapping of names"):
        encode_variables([("a", 1)])  # type: ignore[arg-type]


def test_more_than_one_message_of_variables_is_refused_before_sending() -> None:
    half = "x" * (bounds.DEFINE_MESSAGE_LIMIT // 2)
    assert encode_variables({"a": half})
    with pytest.raises(ValueError, match="past the 16,777,216 that cross into the sandbox at once"):
        encode_variables({"a": half, "b": half, "c": "y"})
