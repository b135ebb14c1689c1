"""`RunArguments`: the arguments of `Agent.run()`, checked together once, each refusal a plain
`ValueError` whose message names the problem (not pydantic's report)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from kodeagent import ChatMessage, RunArguments


def check(**arguments: Any) -> RunArguments:
    return RunArguments.check(max_files=3, **arguments)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"task": 7}, "task must be a non-empty string"),
        ({"task": "x", "files": ["a", "b", "c", "d"]}, "too many files: 4 given, at most 3 per task"),
        ({"task": "x", "max_iterations": 0}, "max_iterations must be at least 1, got 0"),
        ({"task": "x", "max_iterations": "many"}, "max_iterations: Input should be a valid integer"),
        ({"task": "x", "recurrent_mode": True, "chat_history": []}, "recurrent_mode and chat_history cannot"),
        ({"task": "x", "history": [], "recurrent_mode": True}, "history cannot be combined"),
        ({"task": "x", "inputs": [1]}, "inputs must be a dict"),
        ({"task": "x", "inputs": {"_hidden": 1}}, "inputs key '_hidden' must be a Python identifier"),
        ({"task": "x", "inputs": {"f": object()}}, "inputs['f'] is not JSON-compatible"),
        ({"task": "x", "response_model": dict}, "response_model must be a pydantic BaseModel subclass"),
        ({"task": "x", "allowed_tools": "get_*"}, "allowed_tools: Input should be a valid list"),
    ],
)
def test_each_refusal_says_what_is_wrong(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        check(**arguments)
    assert str(refused.value).startswith(message)
    assert not isinstance(refused.value, ValidationError)


def test_reserved_input_names_are_refused_together() -> None:
    with pytest.raises(ValueError, match=r"inputs \['print', 'tool'\] would hide"):
        RunArguments.check(
            max_files=3,
            reserved_inputs=frozenset({"tool", "print"}),
            task="x",
            inputs={"tool": 1, "print": 2},
        )
    assert check(task="x", inputs={"tool": 1}).inputs == {"tool": 1}  # reserved by nobody here


def test_histories_are_kept_as_checked_openai_dicts() -> None:
    class Answer(BaseModel):
        n: int

    args = check(
        task="x",
        files=None,
        history=[ChatMessage(role="user", content="hi"), {"role": "assistant", "content": "hello"}],
        response_model=Answer,
        allowed_tools=("a*",),
    )
    assert args.history == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert args.files == [] and args.inputs == {} and args.response_model is Answer
    assert args.allowed_tools == ["a*"] and args.chat_history is None
