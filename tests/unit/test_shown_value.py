"""`ExecutionResult.shown_value` and `observation()`: the value as text, for hosts that show only text."""

from __future__ import annotations

from sandboxes import ExecutionResult
from sandboxes.models import SHOWN_VALUE_CHARS


def test_the_value_is_shown_as_its_repr_after_the_output():
    result = ExecutionResult(stdout="out\n", value={"k": [1, "2"]})
    assert result.shown_value() == "{'k': [1, '2']}"
    assert result.observation() == "out\nvalue of the last expression: {'k': [1, '2']}\n"


def test_no_value_shows_nothing():
    assert ExecutionResult(stdout="x\n").shown_value() is None
    assert ExecutionResult(stdout="x\n").observation() == "x\n"


def test_a_multiline_repr_starts_on_its_own_line():
    class Table:
        def __repr__(self) -> str:
            return "a b\n1 2"

    assert ExecutionResult(value=Table()).observation() == "value of the last expression:\na b\n1 2\n"


def test_a_long_value_is_cut_head_and_tail():
    shown = ExecutionResult(value="x" * 100_000).shown_value()
    assert shown is not None and len(shown) < SHOWN_VALUE_CHARS + 100
    assert shown.startswith("'xxx") and shown.endswith("xxx'") and "characters omitted" in shown


def test_a_value_whose_repr_raises_is_named_by_its_type():
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert ExecutionResult(value=Hostile()).shown_value() == "<unprintable value of type Hostile>"
