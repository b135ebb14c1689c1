"""Turning a model's text into a structured step, for models that do not return clean JSON.

The order is always: a JSON object (bare, fenced in markdown, or embedded in prose), then a lenient
salvage of a broken JSON object, then the plain-text formats (``Thought: / Action: / Args:`` for
ReAct, a fenced code block or ``Final Answer:`` for CodeAct). Only the model's own reply is ever
parsed: observations (what code printed, what tools returned) never go through these functions.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ResponseParseError
from .models import CodeActChatMessage, ReActChatMessage

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)(?:\n```|\Z)", re.S)
_TRUE = {"true", "yes", "1", "y"}


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text`: the whole text, a ```json fence, or an object inside prose."""
    stripped = text.strip()
    candidates = [stripped]
    candidates += [body for lang, body in _FENCE.findall(text) if lang.lower() in ("", "json")]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _string_field(text: str, key: str) -> str | None:
    """Salvage `"key": "..."` from broken JSON (e.g. a missing closing brace)."""
    match = re.search(rf'"{key}"\s*:\s*"((?:[^"\\]|\\.)*)"', text, re.S)
    if not match:
        return None
    try:
        return str(json.loads(f'"{match.group(1)}"'))
    except ValueError:
        return match.group(1)


def _bool_field(text: str, key: str) -> bool | None:
    match = re.search(rf'"{key}"\s*:\s*(true|false)', text, re.I)
    return None if not match else match.group(1).lower() == "true"


def _section(text: str, label: str, labels: str) -> str | None:
    """The text after ``Label:`` up to the next known label (case-insensitive, line-anchored)."""
    match = re.search(rf"(?im)^\s*\**{label}\**\s*:\s*(.*?)(?=^\s*\**(?:{labels})\**\s*:|\Z)", text, re.S)
    return match.group(1).strip() if match else None


def _as_bool(value: Any, default: bool = True) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return default
    return str(value).strip().lower() in _TRUE


# ---------------------------------------------------------------------- ReAct

_REACT_LABELS = "Thought|Action|Args|Action Input|Answer|Final Answer|Successful|Observation"


def parse_react_reply(text: str) -> ReActChatMessage:
    """Parse a ReAct step from JSON or from ``Thought:/Action:/Args:`` or ``Thought:/Answer:`` text."""
    data = extract_json_object(text)
    if data is not None and ({"action", "final_answer"} & data.keys()):
        args = data.get("args", data.get("arguments"))
        input_args = data.get("input_args")
        return ReActChatMessage(
            input_args={str(k): str(v) for k, v in input_args.items()}
            if isinstance(input_args, dict)
            else None,
            content=text,
            thought=str(data.get("thought") or ""),
            action=(str(data["action"]).strip() if data.get("action") is not None else None),
            args=args if isinstance(args, str | dict) or args is None else json.dumps(args),
            final_answer=data.get("final_answer"),
            task_successful=_as_bool(
                data.get("task_successful"), default=data.get("final_answer") is not None
            ),
        )
    action = _string_field(text, "action")
    if action:
        final = _string_field(text, "final_answer")
        return ReActChatMessage(
            content=text,
            thought=_string_field(text, "thought") or "",
            action=action,
            args=_string_field(text, "args"),
            final_answer=final,
            task_successful=bool(_bool_field(text, "task_successful")) if final is not None else False,
        )
    return parse_react_text(text)


def parse_react_text(text: str) -> ReActChatMessage:
    """The prose fallback: ``Thought: ... Action: tool Args: {...}`` or ``Thought: ... Answer: ...``."""
    thought = _section(text, "Thought", _REACT_LABELS) or ""
    answer = _section(text, "(?:Final )?Answer", _REACT_LABELS)
    action = _section(text, "Action", _REACT_LABELS)
    if answer is not None and (action is None or action.upper() == "FINISH"):
        successful = _section(text, "Successful", _REACT_LABELS)
        return ReActChatMessage(
            content=text, thought=thought, action="FINISH", final_answer=answer,
            task_successful=_as_bool(successful, default=True),
        )  # fmt: skip
    if action:
        action = action.splitlines()[0].strip().strip("`'\"")
        args = _section(text, "(?:Args|Action Input)", _REACT_LABELS)
        if args:
            found = extract_json_object(args)
            args = json.dumps(found) if found is not None else args
        return ReActChatMessage(content=text, thought=thought, action=action, args=args or "{}")
    raise ResponseParseError(
        "found neither a JSON object with `action` nor `Action:`/`Answer:` lines in the reply"
    )


# ---------------------------------------------------------------------- CodeAct

_CODE_LANGS = {"python", "py", "python3", ""}
_CODEACT_LABELS = "Thought|Code|Final Answer|Answer|Successful|Observation"


def _unfence(code: str) -> str:
    """Code given inside a JSON string is sometimes still wrapped in a markdown fence: unwrap it."""
    match = re.fullmatch(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:\n?```)?", code.strip(), re.S)
    return match.group(1) if match else code


def parse_codeact_reply(text: str) -> CodeActChatMessage:
    """Parse a CodeAct step from JSON, a fenced code block, or ``Final Answer:`` text."""
    data = extract_json_object(text)
    if data is not None and ({"code", "final_answer"} & data.keys()):
        code = data.get("code")
        final = data.get("final_answer")
        return CodeActChatMessage(
            content=text,
            thought=str(data.get("thought") or ""),
            code=_unfence(code) if isinstance(code, str) and code.strip() else None,
            final_answer=final,
            task_successful=_as_bool(data.get("task_successful"), default=final is not None),
        )
    code = _string_field(text, "code")
    final = _string_field(text, "final_answer")
    if code or final is not None:
        return CodeActChatMessage(
            content=text,
            thought=_string_field(text, "thought") or "",
            code=code or None,
            final_answer=None if code else final,
            task_successful=bool(_bool_field(text, "task_successful")) if final is not None else False,
        )
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in _CODE_LANGS and body.strip()]
    if blocks:
        before = text[: text.find("```")]
        thought = _section(before, "Thought", _CODEACT_LABELS) or before.strip()
        return CodeActChatMessage(content=text, thought=thought, code=blocks[0])
    answer = _section(text, "(?:Final )?Answer", _CODEACT_LABELS)
    if answer is not None:
        successful = _section(text, "Successful", _CODEACT_LABELS)
        return CodeActChatMessage(
            content=text,
            thought=_section(text, "Thought", _CODEACT_LABELS) or "",
            final_answer=answer,
            task_successful=_as_bool(successful, default=True),
        )
    code_section = _section(text, "Code", _CODEACT_LABELS)
    if code_section:
        return CodeActChatMessage(
            content=text, thought=_section(text, "Thought", _CODEACT_LABELS) or "", code=code_section
        )
    raise ResponseParseError(
        "found no JSON object with `code` or `final_answer`, no ```python block and no `Final Answer:` line"
    )
