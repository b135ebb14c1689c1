"""Reply parsing: the shapes real models answer in, and what must never be taken as an answer."""

from __future__ import annotations

import pytest

from kodeagent import ResponseParseError
from kodeagent.parsing import extract_json_object, parse_codeact_reply, parse_react_reply


def test_json_object_inside_prose_and_fences() -> None:
    assert extract_json_object('Sure! {"a": 1} hope that helps') == {"a": 1}
    assert extract_json_object('```json\n{"a": [1, 2]}\n```') == {"a": [1, 2]}
    assert extract_json_object("no json here {not: valid}") is None


def test_react_shapes() -> None:
    native_like = parse_react_reply('{"thought": "t", "action": "f", "args": {"x": 1}}')
    assert native_like.action == "f" and native_like.args == {"x": 1} and not native_like.is_final
    finish = parse_react_reply('{"thought": "t", "action": "FINISH", "final_answer": "42"}')
    assert finish.is_final and finish.final_answer == "42" and finish.task_successful
    failed = parse_react_reply('{"action": "FINISH", "final_answer": "no", "task_successful": false}')
    assert failed.is_final and not failed.task_successful
    prose = parse_react_reply('Thought: look it up\nAction: `search`\nAction Input: {"q": "x"}')
    assert prose.action == "search" and prose.args == {"q": "x"}
    answer = parse_react_reply("Thought: I know.\nFinal Answer: Paris")
    assert answer.is_final and answer.final_answer == "Paris"


def test_codeact_shapes() -> None:
    fenced_in_json = parse_codeact_reply('{"thought": "t", "code": "```python\\nprint(1)\\n```"}')
    assert fenced_in_json.code == "print(1)"
    plain_json = parse_codeact_reply('{"thought": "t", "code": "print(2)"}')
    assert plain_json.code == "print(2)"
    prose = parse_codeact_reply("Thought: compute\nCode:\n```py\nx = 1\nprint(x)\n```")
    assert prose.code == "x = 1\nprint(x)" and prose.thought == "compute"
    unterminated = parse_codeact_reply("Here:\n```python\nprint(3)")
    assert unterminated.code == "print(3)"
    final = parse_codeact_reply("Thought: done\nFinal Answer: 7\nSuccessful: no")
    assert final.is_final and final.final_answer == "7" and not final.task_successful
    with pytest.raises(ResponseParseError, match="both runs code and gives a final answer"):
        parse_codeact_reply('{"thought": "t", "code": "print(1)", "final_answer": "x"}')


@pytest.mark.parametrize("text", ["", "I think the answer might be something.", "```\n\n```"])
def test_unusable_replies_raise(text: str) -> None:
    with pytest.raises(ResponseParseError):
        parse_codeact_reply(text)
    with pytest.raises(ResponseParseError):
        parse_react_reply(text)
