"""A ReAct step: one tool call (checked against the run's tools by name and required arguments) or
FINISH with the answer, from JSON, the tool-call syntaxes, or ``Thought:/Action:/Args:`` prose."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..models import ReActChatMessage
from .code import code_blocks, mask, unfence
from .lenient_json import broken_object_problem, decode, extract_json_object, find_step_object
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
from .toolcalls import ToolCall, call_from_object, find_tool_calls

REACT_FORMAT = (
    'To call a tool: {"thought": "...", "action": "<tool name>", "args": {"<argument>": "<value>"}}\n'
    'To finish: {"thought": "...", "action": "FINISH", "final_answer": "<the answer>", '
    '"task_successful": true}'
)


@dataclass(frozen=True)
class ToolSignature:
    """What the parser needs to know about a tool: its name, its parameters and the required ones."""

    name: str
    params: tuple[str, ...] = ()
    required: tuple[str, ...] = ()

    def example(self) -> str:
        args = ", ".join(f'"{p}": ...' for p in (self.required or self.params))
        return f'{{"thought": "...", "action": "{self.name}", "args": {{{args}}}}}'


def tool_signatures(tools: Mapping[str, Any] | Sequence[Any] | None) -> dict[str, ToolSignature]:
    """`ToolSignature`s from `Tool` objects (anything with `name` and a JSON-schema `parameters`)."""
    if tools is None:
        return {}
    items = tools.values() if isinstance(tools, Mapping) else tools
    out: dict[str, ToolSignature] = {}
    for t in items:
        if isinstance(t, ToolSignature):
            out[t.name] = t
            continue
        schema = getattr(t, "parameters", {}) or {}
        out[t.name] = ToolSignature(
            t.name, tuple(schema.get("properties", {})), tuple(schema.get("required", []))
        )
    return out


_REACT_KEYS = {
    "action": ("action", "tool", "tool_name", "function"),
    "args": ("args", "arguments", "action_input", "parameters", "tool_input", "input", "params"),
    "final_answer": ("final_answer", "answer", "final"),
    "thought": ("thought", "thoughts", "thinking", "reasoning", "explanation"),
    "task_successful": ("task_successful", "successful", "success"),
}
_REACT_RELEVANT = {"action", "tool", "tool_name", "final_answer", "answer", "name"}
_REACT_LABELS = "Thought|Thoughts|Action|Args|Action Input|Answer|Final Answer|Successful|Observation"
_FINISH = {"FINISH", "FINAL_ANSWER", "FINAL ANSWER", "FINISHED", "ANSWER"}


def _react_args(action: str, args: Any, tools: dict[str, ToolSignature]) -> dict[str, Any]:
    if args is None or (isinstance(args, str) and not args.strip()):
        args = {}
    if isinstance(args, str):
        try:
            args = decode(args.strip())
        except ValueError:
            signature = tools.get(action)
            if signature and len(signature.params) == 1:
                args = {signature.params[0]: args.strip()}  # LangChain's bare `Action Input: value`
            else:
                raise refuse(
                    f"the arguments of {action!r} are not a JSON object; give them by name, e.g. "
                    f"{signature.example() if signature else '{...}'}"
                ) from None
    if not isinstance(args, dict):
        signature = tools.get(action)
        if signature and len(signature.params) == 1:
            return {signature.params[0]: args}
        raise refuse(f"the arguments of {action!r} must be a JSON object of named arguments")
    signature = tools.get(action)
    if tools and signature is None:
        raise refuse(f"there is no tool named {action!r}; the tools are: {', '.join(sorted(tools))}")
    if signature is not None:
        missing = [p for p in signature.required if p not in args]
        if missing:
            raise refuse(
                f"the call to {action!r} is missing required argument(s) {', '.join(missing)}; "
                f"give them all: {signature.example()}"
            )
    return args


def _react_final(text: str, thought: str, answer: Any, successful: Any) -> ReActChatMessage:
    if not has_answer(answer):
        raise refuse("FINISH needs the answer in `final_answer`")
    return ReActChatMessage(
        content=text,
        thought=thought,
        action="FINISH",
        final_answer=answer,
        task_successful=as_bool(successful, default=True),
    )


def _react_call(text: str, thought: str, call: ToolCall, tools: dict[str, ToolSignature]) -> ReActChatMessage:
    if call.code is not None:
        raise refuse("this agent runs no code: call a tool with a JSON object")
    if call.name.upper() in _FINISH:
        args = call.args
        answer = args.get("final_answer", args.get("answer")) if isinstance(args, dict) else args
        return _react_final(text, thought, answer, True)
    return ReActChatMessage(
        content=text, thought=thought, action=call.name, args=_react_args(call.name, call.args, tools)
    )


def _action_call_syntax(action: str) -> ToolCall | None:
    """``Action: get_price(symbol="AAPL")``: a call with literal keyword arguments."""
    try:
        node = ast.parse(action.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except ValueError:
        return None
    return ToolCall(node.func.id, args)


def parse_react_reply(text: str, tools: Mapping[str, Any] | Sequence[Any] | None = None) -> ReActChatMessage:
    """Parse a ReAct step: a tool call or FINISH with the answer. Raises `ResponseParseError`.

    `tools` (names to `Tool`s or `ToolSignature`s) lets the parser check the tool name and its required
    arguments, and map a bare ``Action Input: value`` onto a one-parameter tool.
    """
    signatures = tool_signatures(tools)
    prepared = prepare(text)
    body = prepared.body
    if not body:
        raise refuse("the reply is empty" if not prepared.thinking else "the reply holds only reasoning")
    calls = find_tool_calls(body)
    if calls is not None:
        found, before = calls
        if problem := self_observation(before):
            raise problem
        if len(found) != 1:
            raise refuse(f"the reply makes {len(found)} tool calls; make one call per step")
        thought = labelled_section(before, "Thought", _REACT_LABELS) or before.strip() or prepared.thinking
        return _react_call(text, thought, found[0], signatures)
    blocks = code_blocks(body)
    outside = mask(body, [s for s in blocks.spans])
    search, outside = find_step_object(outside, _REACT_RELEVANT)
    if problem_text := broken_object_problem(search, '\\"'):
        raise refuse(problem_text)
    if search.found is not None:
        data = search.found.data
        rest = outside[: search.found.start] + outside[search.found.end :]
        if problem := self_observation(rest):
            raise problem
        thought = str(pick(data, _REACT_KEYS["thought"]) or prepared.thinking or "")
        action = pick(data, _REACT_KEYS["action"])
        if action is None and "name" in data and ({"parameters", "arguments"} & data.keys()):
            return _react_call(text, thought, call_from_object(data), signatures)  # Llama's bare JSON call
        answer = pick(data, _REACT_KEYS["final_answer"])
        successful = pick(data, _REACT_KEYS["task_successful"])
        if isinstance(action, dict):
            return _react_call(text, thought, call_from_object(action), signatures)
        if action is not None and not isinstance(action, str):
            raise refuse("`action` must be a tool name or FINISH")
        action = (action or "").strip().strip("`'\"")
        if not action or action.upper() in _FINISH:
            if not action and not has_answer(answer):
                raise refuse("the JSON object has neither an `action` nor a `final_answer`")
            return _react_final(text, thought, answer, successful)
        if has_answer(answer):
            raise refuse(
                f"the reply both calls {action!r} and gives a final answer; do one per step: call the tool, "
                "read its result, then FINISH"
            )
        args = pick(data, _REACT_KEYS["args"])
        input_args = data.get("input_args")
        return ReActChatMessage(
            content=text,
            thought=thought,
            action=action,
            args=_react_args(action, args, signatures)
            if not input_args
            else (args if args is not None else {}),
            input_args={str(k): str(v) for k, v in input_args.items()}
            if isinstance(input_args, dict)
            else None,
        )
    if problem := self_observation(outside):
        raise problem
    return _react_text(text, outside, prepared.thinking, signatures)


def _react_text(
    text: str, body: str, thinking: str, signatures: dict[str, ToolSignature]
) -> ReActChatMessage:
    thought = labelled_section(body, "Thought|Thoughts", _REACT_LABELS) or thinking
    answer = tagged_text(body, FINAL_TAGS)
    if answer is None:
        answer = labelled_section(body, "Final Answer|Answer", _REACT_LABELS)
    action = labelled_section(body, "Action", _REACT_LABELS)
    successful = labelled_section(body, "Successful", _REACT_LABELS)
    if action is not None:
        action = action.splitlines()[0].strip().strip("`'\"*") if action.strip() else ""
    if action and action.upper() not in _FINISH:
        if answer is not None:
            raise refuse(
                f"the reply both calls {action!r} and gives a final answer; do one per step: call the tool, "
                "read its result, then FINISH"
            )
        call = _action_call_syntax(action) if "(" in action else None
        if call is not None:
            return _react_call(text, thought, call, signatures)
        args_text = labelled_section(body, "Action Input|Args|Arguments", _REACT_LABELS)
        args: Any = None
        if args_text:
            args_text = unfence(args_text).strip()
            found = extract_json_object(args_text) if args_text.lstrip().startswith("{") else None
            if args_text.lstrip().startswith("{") and found is None:
                raise refuse(f"the arguments of {action!r} are not valid JSON (cut off?)")
            args = found if found is not None else args_text
        return ReActChatMessage(
            content=text, thought=thought, action=action, args=_react_args(action, args, signatures)
        )
    if action is not None or answer is not None:
        if answer is None:
            raise refuse("FINISH needs the answer: give it in `final_answer`")
        return _react_final(text, thought, answer, successful)
    raise refuse("found neither a tool call (`action` with `args`) nor a final answer in the reply")


def parse_react_text(text: str) -> ReActChatMessage:
    """The prose form alone: ``Thought: ... Action: tool Args: {...}`` or ``Thought: ... Answer: ...``."""
    prepared = prepare(text)
    return _react_text(text, prepared.body, prepared.thinking, {})
