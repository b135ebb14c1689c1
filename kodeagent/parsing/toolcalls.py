"""The tool-call syntaxes open models print as text: Hermes/Qwen ``<tool_call>``, ``<function=...>``,
Mistral ``[TOOL_CALLS]``, Llama ``<|python_tag|>``. Both agents read them: ReAct as its tool call,
CodeAct as code (a ``python`` call) or as calls of its tool functions."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .code import unfence
from .lenient_json import decode, remove_trailing_commas, scan_object, snake
from .reply import refuse


@dataclass
class ToolCall:
    name: str
    args: Any
    code: str | None = None  # Llama's <|python_tag|> followed by plain Python


def call_from_object(value: Any) -> ToolCall:
    if not isinstance(value, dict):
        raise refuse("a tool call must be a JSON object with `name` and `arguments`")
    data = {snake(k): v for k, v in value.items()}
    if "function" in data and isinstance(data["function"], dict):
        data = {**data, **{snake(k): v for k, v in data["function"].items()}}
    name = data.get("name") or data.get("tool") or data.get("tool_name")
    if not isinstance(name, str) or not name.strip():
        raise refuse("a tool call must name the tool in `name`")
    args: Any = next((data[k] for k in ("arguments", "parameters", "args", "input") if k in data), {})
    if isinstance(args, str):
        try:
            args = decode(args) if args.strip() else {}
        except ValueError:
            raise refuse(f"the arguments of the call to {name!r} are not a JSON object") from None
    return ToolCall(name.strip(), args)


def _decode_calls(payload: str, syntax: str) -> list[ToolCall]:
    payload = payload.strip()
    if not payload:
        raise refuse(f"the {syntax} tool call is empty")
    if payload.startswith("["):
        try:
            value = json.loads(remove_trailing_commas(payload), strict=False)
        except ValueError:
            raise refuse(f"the {syntax} tool call is not a valid JSON list of calls (cut off?)") from None
        return [call_from_object(v) for v in (value if isinstance(value, list) else [value])]
    end = scan_object(payload, 0) if payload.startswith("{") else None
    if end is None:
        raise refuse(f"the {syntax} tool call is not a complete JSON object (cut off?)")
    try:
        value = decode(payload[:end])
    except ValueError as exc:
        raise refuse(f"the {syntax} tool call is not valid JSON: {exc}") from None
    calls = [call_from_object(value)]
    rest = payload[end:].strip().lstrip(";,").strip()
    if rest.startswith("{"):
        calls += _decode_calls(rest, syntax)
    return calls


def find_tool_calls(body: str) -> tuple[list[ToolCall], str] | None:
    """Tool calls printed as text in one of the open-model syntaxes, and the prose before them."""
    hermes = list(re.finditer(r"<tool_call>(.*?)(?:</tool_call>|\Z)", body, re.S))
    if hermes:
        calls = [c for m in hermes for c in _decode_calls(m.group(1), "<tool_call>")]
        return calls, body[: hermes[0].start()]
    function_tag = list(re.finditer(r"<function=([\w.-]+)>(.*?)(?:</function>|\Z)", body, re.S))
    if function_tag:
        calls = []
        for m in function_tag:
            args = m.group(2).strip()
            calls.append(
                ToolCall(
                    m.group(1),
                    _decode_calls(f'{{"name": "x", "arguments": {args or "{}"}}}', "<function=...>")[0].args,
                )
            )
        return calls, body[: function_tag[0].start()]
    if "[TOOL_CALLS]" in body:
        before, _, payload = body.partition("[TOOL_CALLS]")
        payload = payload.strip()
        named = re.match(r"([\w.-]+)\s*\[ARGS\]\s*(.*)\Z", payload, re.S)
        if named:
            args = named.group(2).strip() or "{}"
            return _decode_calls(
                f'{{"name": "{named.group(1)}", "arguments": {args}}}', "[TOOL_CALLS]"
            ), before
        return _decode_calls(payload, "[TOOL_CALLS]"), before
    if "<|python_tag|>" in body:
        before, _, payload = body.partition("<|python_tag|>")
        payload = payload.strip()
        if payload.startswith("{"):
            return _decode_calls(payload, "<|python_tag|>"), before
        if not payload:
            raise refuse("the reply ends right after <|python_tag|>, with no call or code")
        return [ToolCall("python", {}, code=unfence(payload))], before
    return None
