"""What every reply reader shares: reasoning blocks set aside, labelled sections and tags, the refusal.

A reply is first `prepare`d (``<think>`` blocks and end-of-turn tokens out, so code inside reasoning
never runs); the readers then look for ``Label:`` sections and ``<tag>``s in what is left, and refuse
with a `ResponseParseError` that names the problem rather than guess.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ResponseParseError

_TRUE = {"true", "yes", "1", "y"}
FINAL_TAGS = ("final_answer", "answer", "solution")
_TRAILING_TOKENS = re.compile(
    r"(?:\s*(?:<\|im_end\|>|<\|eot_id\|>|<\|eom_id\|>|<\|end\|>|</s>|<\|endoftext\|>|<end_code>"
    r"|<\|end_of_text\|>|<\|return\|>|<\|call\|>|<end_of_turn>))+\s*\Z"
)
_REASONING = [
    (re.compile(r"<(think|thinking|reasoning|reflection|thought)>", re.I), "</{}>"),
    (re.compile(r"\[(THINK)\]"), "[/{}]"),
    (re.compile(r"<\|(begin_of_thought)\|>"), "<|end_of_thought|>"),
]
_OBSERVATION_LINE = re.compile(r"(?im)^[ \t>*#]*observation[ \t]*\**[ \t]*:")


def refuse(problem: str) -> ResponseParseError:
    return ResponseParseError(problem)


# ---------------------------------------------------------------------- reasoning blocks and noise


@dataclass
class Prepared:
    body: str
    thinking: str = ""


def prepare(text: str) -> Prepared:
    """Set reasoning blocks aside and drop end-of-turn tokens; refuse a reply that is only reasoning."""
    text = _TRAILING_TOKENS.sub("", text or "")
    thinking: list[str] = []
    # A chat template that opens <think> in the prompt leaves the reply starting inside the block.
    lead = re.match(r"\s*(.*?)</(think|thinking|reasoning)>", text, re.S | re.I)
    if lead and not re.search(rf"<{lead.group(2)}>", lead.group(1), re.I):
        thinking.append(lead.group(1).strip())
        text = text[lead.end() :]
    harmony = re.search(r"<\|channel\|>final<\|message\|>(.*)\Z", text, re.S)
    if harmony:
        before = text[: harmony.start()]
        thinking.append(re.sub(r"<\|[^|>]+\|>", " ", before).strip())
        text = harmony.group(1)
    for opener, closer_template in _REASONING:
        while True:
            match = opener.search(text)
            if not match:
                break
            closer = closer_template.format(match.group(1))
            end = text.lower().find(closer.lower(), match.end())
            if end < 0:
                thinking.append(text[match.end() :].strip())
                rest = text[: match.start()]
                if not rest.strip():
                    raise refuse(
                        f"the reply ended inside a {match.group(0)} block, so it holds only reasoning and "
                        "nothing to act on; after your reasoning, give the step itself"
                    )
                text = rest
                break
            thinking.append(text[match.end() : end].strip())
            text = text[: match.start()] + text[end + len(closer) :]
    return Prepared(text.strip(), "\n".join(t for t in thinking if t))


def as_bool(value: Any, default: bool = True) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return default
    return str(value).strip().lower() in _TRUE


def has_answer(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


# ---------------------------------------------------------------------- text sections


def labelled_section(text: str, label: str, labels: str) -> str | None:
    """The text after ``Label:`` up to the next known label (case-insensitive, line-anchored)."""
    match = re.search(
        rf"(?im)^[ \t>#]*\**[ \t]*(?:{label})[ \t]*\**[ \t]*:\**[ \t]*(.*?)(?=^[ \t>#]*\**[ \t]*(?:{labels})[ \t]*\**[ \t]*:|\Z)",
        text,
        re.S,
    )
    return match.group(1).strip() if match else None


def tagged_text(text: str, names: Sequence[str]) -> str | None:
    for name in names:
        match = re.search(rf"<{name}>(.*?)(?:</{name}>|\Z)", text, re.S | re.I)
        if match:
            return match.group(1).strip()
    return None


def self_observation(text: str) -> ResponseParseError | None:
    if _OBSERVATION_LINE.search(text):
        return refuse(
            "the reply writes its own `Observation:`. Observations come from running your step: stop "
            "after the step and wait for the real one"
        )
    return None


def pick(data: dict[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        if name in data:
            return data[name]
    return None
