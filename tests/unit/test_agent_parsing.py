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


# ---------------------------------------------------------------------- the replies corpus, item by item

from benchmarks.replies import judge, load_corpus, make_agents  # noqa: E402

_CORPUS = load_corpus()
_AGENTS = make_agents()


def test_corpus_is_large_and_covers_both_outcomes() -> None:
    assert len(_CORPUS) >= 100
    assert {r.expect for r in _CORPUS} == {"read", "refuse"}
    assert {r.agent for r in _CORPUS} == {"codeact", "react"}


@pytest.mark.parametrize("reply", _CORPUS, ids=[f"{r.agent}:{r.name}" for r in _CORPUS])
def test_corpus_reply_is_read_as_intended(reply) -> None:  # type: ignore[no-untyped-def]
    verdict = judge(_AGENTS[reply.agent], reply)
    assert verdict.outcome == "read as intended", verdict.detail


def test_refusal_observation_names_problem_and_shows_the_format() -> None:
    codeact, react = _AGENTS["codeact"], _AGENTS["react"]
    with pytest.raises(ResponseParseError) as caught:
        codeact.parse_reply('{"thought": "t", "code": "print(1)", "final_answer": "1"}')
    observation = codeact.format_error_observation(str(caught.value))
    assert "both runs code and gives a final answer" in observation
    assert '{"thought": "...", "code": "<Python source>"}' in observation
    with pytest.raises(ResponseParseError) as caught:
        react.parse_reply('{"thought": "t", "action": "get_weather", "args": null}')
    observation = react.format_error_observation(str(caught.value))
    assert "missing required argument(s) city" in observation
    assert '"action": "get_weather", "args": {"city": ...}' in observation


def test_code_inside_reasoning_never_runs() -> None:
    reply = '<think>```python\nimport os\nos.remove("/etc/passwd")\n```</think>\nFinal Answer: no code needed'
    message = parse_codeact_reply(reply)
    assert message.is_final and message.code is None and message.final_answer == "no code needed"
    with pytest.raises(ResponseParseError, match="reasoning"):
        parse_codeact_reply('<think>```python\nprint("only thinking")\n```')


def test_overescaped_code_is_unescaped_only_when_that_makes_it_valid() -> None:
    broken = parse_codeact_reply('{"thought": "t", "code": "a = 1\\\\nprint(a)"}')
    assert broken.code == "a = 1\nprint(a)"
    kept = parse_codeact_reply('{"thought": "t", "code": "print(\'x\\\\ny\')"}')
    assert kept.code == "print('x\\ny')"  # valid Python with a literal \n escape: left exactly as sent
    genuine_error = parse_codeact_reply('{"thought": "t", "code": "print(1\\\\n"}')
    assert genuine_error.code == "print(1\\n"  # neither form compiles: the sandbox reports the real error


def test_python_fence_dict_with_step_keys_is_code_not_a_reply() -> None:
    message = parse_codeact_reply('```python\nstep = {"code": "rm", "final_answer": 1}\nprint(step)\n```')
    assert message.code == 'step = {"code": "rm", "final_answer": 1}\nprint(step)' and not message.is_final
