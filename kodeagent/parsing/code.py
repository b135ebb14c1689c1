"""Code in a reply: fences and code tags in order, output fences told apart, and one level of
over-escaping undone only when that turns broken code into code that compiles."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .reply import refuse

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.S)
_CODE_LANGS = {"python", "py", "python3", "py3", "ipython", ""}
_OUTPUT_LANGS = {"output", "stdout", "result", "observation", "console"}
_CODE_TAGS = ("code", "execute", "execute_ipython", "python", "execute_python", "run_python")


@dataclass
class Blocks:
    code: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    outputs: int = 0


def code_blocks(text: str) -> Blocks:
    """Python fences and code tags, in order, with the spans they cover; output fences counted apart."""
    blocks = Blocks()
    found: list[tuple[int, int, str]] = []
    for tag in _CODE_TAGS:
        for match in re.finditer(rf"<{tag}>(.*?)(?:</{tag}>|\Z)", text, re.S | re.I):
            if any(s <= match.start() < e for s, e in blocks.spans):
                continue
            body = unfence(match.group(1))
            if body.strip():
                found.append((match.start(), match.end(), body))
            blocks.spans.append((match.start(), match.end()))
    tag_spans = list(blocks.spans)
    for match in _FENCE.finditer(text):
        if any(s <= match.start() < e for s, e in tag_spans):
            continue  # a fence inside a code tag: the tag already holds it
        lang = match.group(1).lower()
        if lang in _CODE_LANGS:
            if lang == "" and match.group(2).lstrip().startswith("{"):
                continue  # a bare fence around a JSON object: left for the JSON reader
            if match.group(2).strip():
                found.append((match.start(), match.end(), match.group(2)))
            blocks.spans.append((match.start(), match.end()))
        elif lang in _OUTPUT_LANGS:
            blocks.outputs += 1
            blocks.spans.append((match.start(), match.end()))
        elif lang not in ("json", "json5", "jsonc", "javascript", "js"):
            blocks.spans.append((match.start(), match.end()))
    for _, _, body in sorted(found, key=lambda item: item[0]):
        blocks.code.append(_dedent_block(body))
    return blocks


def _dedent_block(code: str) -> str:
    lines = code.strip("\n").splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents) if indents else 0
    return "\n".join(line[cut:] for line in lines).rstrip()


def mask(text: str, spans: list[tuple[int, int]]) -> str:
    chars = list(text)
    for start, end in spans:
        for i in range(start, min(end, len(chars))):
            if chars[i] != "\n":
                chars[i] = " "
    return "".join(chars)


def unfence(code: str) -> str:
    """Code given inside a JSON string or a tag is sometimes still wrapped in a markdown fence: unwrap it."""
    match = re.fullmatch(r"\s*```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:\n?```)?\s*", code, re.S)
    return match.group(1) if match else code


def _compiles(code: str) -> bool:
    try:
        compile(code, "<reply>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def fix_overescaped(code: str) -> str:
    """Undo one level of escaping (``\\n``, ``\\"``), but only when that turns broken code into valid code."""
    if "\\" not in code or _compiles(code):
        return code
    unescaped = re.sub(r"\\([\\\"'ntr/])", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m[1], m[1]), code)
    return unescaped if _compiles(unescaped) else code


def code_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        value = "\n".join(value)
    if not isinstance(value, str):
        raise refuse(f"`code` must be a string of Python source, got {type(value).__name__}")
    code = fix_overescaped(unfence(value))
    return code if code.strip() else None
