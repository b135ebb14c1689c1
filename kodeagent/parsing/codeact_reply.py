"""A CodeAct step: thought and code, or the final answer; never both in one reply."""

from __future__ import annotations

from ..models import CodeActChatMessage
from .code import code_blocks, code_value, fix_overescaped, mask
from .lenient_json import broken_object_problem, find_step_object
from .reply import (
    FINAL_TAGS,
    as_bool,
    has_answer,
    labelled_section,
    pick,
    prepare,
    refuse,
    self_observation,
    tagged_text,
)
from .toolcalls import ToolCall, find_tool_calls

CODEACT_FORMAT = (
    'To run code: {"thought": "...", "code": "<Python source>"}\n'
    'To finish: {"thought": "...", "final_answer": "<the answer>", "task_successful": true}'
)

_CODEACT_KEYS = {
    "code": ("code", "python", "python_code", "source", "source_code", "program", "script"),
    "final_answer": ("final_answer", "answer", "final"),
    "thought": ("thought", "thoughts", "thinking", "reasoning", "explanation", "plan"),
    "task_successful": ("task_successful", "successful", "success"),
}
_CODEACT_RELEVANT = {k for keys in _CODEACT_KEYS.values() for k in keys}
_CODEACT_LABELS = "Thought|Thoughts|Code|Final Answer|Answer|Successful|Observation|Reasoning"
_PY_TOOLS = {
    "python",
    "ipython",
    "execute",
    "execute_python",
    "run_python",
    "run_code",
    "code_interpreter",
    "python_interpreter",
    "exec",
    "python_repl",
}


def _codeact_from_calls(calls: list[ToolCall], thought: str, text: str) -> CodeActChatMessage:
    if len(calls) == 1 and calls[0].name in ("final_answer", "FINISH", "finish"):
        args = calls[0].args
        answer = args.get("answer", args.get("final_answer")) if isinstance(args, dict) else args
        if not has_answer(answer):
            raise refuse("the final_answer call gives no `answer`")
        return CodeActChatMessage(content=text, thought=thought, final_answer=answer, task_successful=True)
    lines = []
    for call in calls:
        if call.code is not None:
            lines.append(call.code)
        elif call.name in _PY_TOOLS and isinstance(call.args, dict) and len(call.args) == 1:
            [value] = call.args.values()
            code = code_value(value)
            if code is None:
                raise refuse(f"the {call.name!r} call holds no code")
            lines.append(code)
        elif call.name in ("final_answer", "FINISH", "finish"):
            raise refuse("the reply both calls tools and gives the final answer; do one per step")
        else:
            if not call.name.isidentifier():
                raise refuse(f"{call.name!r} is not a tool name")
            if not isinstance(call.args, dict) or not all(str(k).isidentifier() for k in call.args):
                raise refuse(f"the arguments of {call.name!r} must be a JSON object of named arguments")
            args = ", ".join(f"{k}={v!r}" for k, v in call.args.items())
            lines.append(f"print({call.name}({args}))")
    return CodeActChatMessage(content=text, thought=thought, code="\n".join(lines))


def parse_codeact_reply(text: str) -> CodeActChatMessage:
    """Parse a CodeAct step: thought and code, or the final answer. Raises `ResponseParseError`."""
    prepared = prepare(text)
    body = prepared.body
    if not body:
        raise refuse("the reply is empty" if not prepared.thinking else "the reply holds only reasoning")
    calls = find_tool_calls(body)
    if calls is not None:
        found, before = calls
        if problem := self_observation(before):
            raise problem
        thought = labelled_section(before, "Thought", _CODEACT_LABELS) or before.strip() or prepared.thinking
        return _codeact_from_calls(found, thought, text)
    blocks = code_blocks(body)
    outside = mask(body, blocks.spans)
    search, outside = find_step_object(outside, _CODEACT_RELEVANT)
    if problem_text := broken_object_problem(search, '\\", and a newline as \\n'):
        raise refuse(problem_text)
    if search.found is not None:
        data = search.found.data
        rest = outside[: search.found.start] + outside[search.found.end :]
        if problem := self_observation(rest) or (
            refuse("the reply shows output it has not seen yet in an output block")
            if blocks.outputs
            else None
        ):
            raise problem
        code = code_value(pick(data, _CODEACT_KEYS["code"]))
        answer = pick(data, _CODEACT_KEYS["final_answer"])
        thought = str(pick(data, _CODEACT_KEYS["thought"]) or prepared.thinking or "")
        if code is not None and blocks.code:
            raise refuse("the reply gives code twice, in the JSON object and in a code block; give it once")
        if code is None and blocks.code:
            code = fix_overescaped("\n\n".join(blocks.code))
        if code is not None and has_answer(answer):
            raise refuse(
                "the reply both runs code and gives a final answer; do one per step: run the code, read "
                "its output, then answer"
            )
        if code is not None:
            return CodeActChatMessage(content=text, thought=thought, code=code)
        if has_answer(answer):
            return CodeActChatMessage(
                content=text,
                thought=thought,
                final_answer=answer,
                task_successful=as_bool(pick(data, _CODEACT_KEYS["task_successful"]), default=True),
            )
        raise refuse("the JSON object has neither `code` nor `final_answer`")
    if problem := self_observation(outside):
        raise problem
    if blocks.outputs and blocks.code:
        raise refuse("the reply shows output it has not seen yet in an output block; stop after the code")
    answer = tagged_text(outside, FINAL_TAGS)
    if answer is None:
        answer = labelled_section(outside, "Final Answer|Answer", _CODEACT_LABELS)
    code_text = "\n\n".join(blocks.code) if blocks.code else None
    if code_text is None:
        section = labelled_section(outside, "Code", _CODEACT_LABELS)
        code_text = section if section else None
    if code_text is not None and answer is not None:
        raise refuse(
            "the reply both runs code and gives a final answer; do one per step: run the code, read its "
            "output, then answer"
        )
    before_code = outside[: blocks.spans[0][0]] if blocks.spans else outside
    thought = labelled_section(before_code, "Thought|Thoughts", _CODEACT_LABELS) or prepared.thinking
    if code_text is not None:
        if not thought:
            thought = before_code.strip()
        return CodeActChatMessage(content=text, thought=thought, code=fix_overescaped(code_text))
    if answer is not None:
        if not answer:
            raise refuse("`Final Answer:` is empty")
        successful = labelled_section(outside, "Successful", _CODEACT_LABELS)
        return CodeActChatMessage(
            content=text,
            thought=thought,
            final_answer=answer,
            task_successful=as_bool(successful, default=True),
        )
    raise refuse("found no code to run and no final answer in the reply")
