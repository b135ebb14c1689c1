"""The conversation an agent sends: checking a history a caller hands in, and shaping messages for the model.

Kept apart from the loop because none of it depends on a run's state: a history a caller passes is
checked before anything starts (by `RunArguments`; a bad one fails with the message and field named,
not deep inside a provider's error), and the helpers that build or render messages are plain
functions of their inputs.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .models import ChatMessage
from .text import truncate

_ROLES = {"system", "user", "assistant", "tool", "developer"}
_PART_TYPES = {"text", "image_url", "input_audio", "file"}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}


def validate_openai_history(messages: Sequence[Any], *, what: str = "chat_history") -> list[dict[str, Any]]:
    """Check that `messages` is a valid OpenAI chat history; return it as plain dicts.

    Raises `ValueError` naming the first offending message and what is wrong with it.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise ValueError(f"{what} must be a list of messages, got {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for i, raw in enumerate(messages):
        message = raw.to_openai() if isinstance(raw, ChatMessage) else raw
        if not isinstance(message, dict):
            raise ValueError(
                f"{what}[{i}] must be a dict with 'role' and 'content', got {type(raw).__name__}"
            )
        role = message.get("role")
        if role not in _ROLES:
            raise ValueError(f"{what}[{i}] has role {role!r}; expected one of {sorted(_ROLES)}")
        content = message.get("content")
        tool_calls = message.get("tool_calls")
        if content is None:
            if not (role == "assistant" and tool_calls):
                raise ValueError(f"{what}[{i}] ({role}) has no content")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") not in _PART_TYPES:
                    raise ValueError(
                        f"{what}[{i}].content[{j}] must be a dict whose 'type' is one of {sorted(_PART_TYPES)}"
                    )
        elif not isinstance(content, str):
            raise ValueError(f"{what}[{i}].content must be a string or a list of parts")
        if tool_calls is not None:
            if role != "assistant" or not isinstance(tool_calls, list):
                raise ValueError(f"{what}[{i}]: only assistant messages carry a list of tool_calls")
            for j, call in enumerate(tool_calls):
                function = call.get("function") if isinstance(call, dict) else None
                if not (
                    isinstance(call, dict)
                    and call.get("id")
                    and isinstance(function, dict)
                    and function.get("name")
                    and isinstance(function.get("arguments", ""), str)
                ):
                    raise ValueError(
                        f"{what}[{i}].tool_calls[{j}] needs an 'id' and a 'function' with 'name' and "
                        "string 'arguments'"
                    )
                open_calls.add(str(call["id"]))
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not call_id:
                raise ValueError(f"{what}[{i}] is a tool message without 'tool_call_id'")
            if str(call_id) not in open_calls:
                raise ValueError(
                    f"{what}[{i}] answers tool call {call_id!r}, which no earlier assistant message made"
                )
        out.append(dict(message))
    return out


def normalize_content(content: Any) -> str:
    """Message content (text, a list of parts, a dict) as readable text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    if isinstance(content, dict | BaseModel):
        data = content.model_dump(mode="json") if isinstance(content, BaseModel) else content
        return json.dumps(data, ensure_ascii=False, default=str)
    return str(content)


def render_history(messages: Sequence[dict[str, Any]], limit: int) -> str:
    """The conversation without the system prompt, one line a message, each cut to `limit` characters."""
    lines = []
    for message in messages:
        if message.get("role") == "system":
            continue
        text = normalize_content(message.get("content"))
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            text += f"\n[tool call] {function.get('name')}({function.get('arguments')})"
        lines.append(f"[{message.get('role')}] {truncate(text.strip(), limit)}")
    return "\n".join(lines)


def image_files(files: Sequence[str]) -> list[str]:
    """The local image files among a task's `files` (what a vision model is shown with the task)."""
    return [f for f in files if os.path.isfile(f) and os.path.splitext(f)[1].lower() in _IMAGE_SUFFIXES]


def user_message(text: str, images: Sequence[str] = ()) -> dict[str, Any]:
    """`text` as a user message, with `images` (local paths) attached as data URLs."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    for path in images:
        mime = mimetypes.guess_type(path)[0] or "image/png"
        with open(path, "rb") as fh:
            data = base64.b64encode(fh.read()).decode()
        parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
    return {"role": "user", "content": parts}


def mark_system_prompt_for_cache(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the system prompt marked as a prompt-cache breakpoint (a copy; history unchanged).

    OpenAI and Gemini cache a repeated prefix on their own; Anthropic models cache only what is marked.
    """
    if not messages:
        return messages
    first = messages[0]
    if first.get("role") != "system" or not isinstance(first.get("content"), str):
        return messages
    part = {"type": "text", "text": first["content"], "cache_control": {"type": "ephemeral"}}
    return [{**first, "content": [part]}, *messages[1:]]
