"""JSON as models write it: found in prose or fences, and decoded leniently (trailing commas, Python
quoting, double-encoded or escaped once too often). An object that looks meant as the step but does not
decode is reported as broken, so the reader can refuse it instead of skipping to a wrong one.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from dataclasses import dataclass, field
from typing import Any


def scan_object(text: str, start: int) -> int | None:
    """Index just past the brace matching ``text[start] == '{'``, string-aware (', ", triple); None if open."""
    depth = 0
    i, n = start, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            triple = text[i : i + 3] == ch * 3
            quote = ch * 3 if triple else ch
            i += len(quote)
            while i < n:
                if text[i] == "\\":
                    i += 2
                    continue
                if text.startswith(quote, i):
                    i += len(quote)
                    break
                if not triple and ch == "'" and text[i] == "\n":
                    break  # an apostrophe in prose, not a string: give up on this quote
                i += 1
            else:
                return None
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def remove_trailing_commas(span: str) -> str:
    out: list[str] = []
    i, n = 0, len(span)
    while i < n:
        ch = span[i]
        if ch == '"':
            j = i + 1
            while j < n and span[j] != '"':
                j += 2 if span[j] == "\\" else 1
            out.append(span[i : j + 1])
            i = j + 1
            continue
        if ch == ",":
            j = i + 1
            while j < n and span[j].isspace():
                j += 1
            if j < n and span[j] in "}]":
                i += 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _python_literal(span: str) -> Any:
    """A Python dict literal (single quotes, triple quotes, True/None), JSON's true/false/null allowed."""
    names = {"true": "True", "false": "False", "null": "None"}
    tokens = []
    for tok in tokenize.generate_tokens(io.StringIO(span).readline):
        if tok.type == tokenize.NAME and tok.string in names:
            tok = tok._replace(string=names[tok.string])
        tokens.append(tok)
    return ast.literal_eval(tokenize.untokenize(tokens))


def decode(span: str, depth: int = 0) -> Any:
    """Decode one object span leniently; raise ValueError with the JSON error when nothing works."""
    first_error: ValueError | None = None
    for attempt in (span, remove_trailing_commas(span)):
        try:
            value = json.loads(attempt, strict=False)
            break
        except ValueError as exc:
            first_error = first_error or exc
    else:
        try:
            value = _python_literal(span)
        except (ValueError, SyntaxError, tokenize.TokenError, MemoryError, RecursionError):
            value = None
        if value is None and '\\"' in span and depth == 0:
            try:  # the whole object escaped once more, as if written inside a JSON string
                return decode(json.loads(f'"{span}"', strict=False), depth + 1)
            except ValueError:
                pass
        if value is None:
            raise first_error or ValueError("not a JSON object")
    if isinstance(value, str) and depth < 2 and value.strip().startswith("{"):
        return decode(value.strip(), depth + 1)  # double-encoded: a JSON string holding the object
    return value


def snake(key: str) -> str:
    key = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(key).strip())
    return re.sub(r"[\s\-]+", "_", key).lower()


@dataclass
class _Found:
    data: dict[str, Any]
    start: int
    end: int


@dataclass
class _Broken:
    start: int
    cut_off: bool
    error: str


@dataclass
class _Search:
    found: _Found | None = None
    broken: list[_Broken] = field(default_factory=list)


_STEP_KEYS = {"thought", "thoughts", "code", "action", "args", "final_answer", "name", "tool"}
"""First keys that mark an object as the model's step: one that fails to decode is refused, not skipped."""


def _find_objects(text: str, relevant: set[str], *, limit: int = 60) -> _Search:
    """The first object whose (normalised) keys meet `relevant`; also objects that look meant but are broken."""
    search = _Search()
    position = 0
    tried = 0
    key_hint = re.compile(r"\{\s*[\"']?([A-Za-z_][\w \-]*)[\"']?\s*:")
    stripped = text.lstrip()
    candidates: list[int] = []
    if stripped.startswith('"') and "{" in stripped[:3]:
        candidates.append(-1)  # a double-encoded object: the whole reply is one JSON string
    while True:
        index = text.find("{", position)
        if index < 0:
            break
        candidates.append(index)
        position = index + 1
    skip_until = -1
    for index in candidates:
        if index < skip_until:
            continue
        tried += 1
        if tried > limit:
            break
        if index == -1:
            try:
                value = decode(stripped)
            except ValueError:
                continue
            if isinstance(value, dict) and {snake(k) for k in value} & relevant:
                search.found = _Found({snake(k): v for k, v in value.items()}, 0, len(text))
                return search
            continue
        end = scan_object(text, index)
        hint = key_hint.match(text, index)
        looks_meant = bool(hint and snake(hint.group(1)) in relevant | _STEP_KEYS)
        if end is None:
            if looks_meant:
                search.broken.append(_Broken(index, True, "the object is never closed"))
            continue
        span = text[index:end]
        try:
            value = decode(span)
        except ValueError as exc:
            if looks_meant:
                search.broken.append(_Broken(index, False, str(exc)))
            continue
        if isinstance(value, dict):
            keys = {snake(k) for k in value}
            if keys & relevant:
                search.found = _Found({snake(k): v for k, v in value.items()}, index, end)
                return search
            skip_until = end
    return search


def broken_object_problem(search: _Search, escaping: str) -> str | None:
    """Why the reply cannot be read when it wrote a step object and none of its objects decodes (the
    problem of the first broken one, with how a string must be escaped); None otherwise."""
    if search.found is not None or not search.broken:
        return None
    broken = search.broken[0]
    if broken.cut_off:
        return "the JSON object is cut off: it is never closed (keep the reply shorter)"
    return f"the JSON object is not valid JSON ({broken.error}); a quote inside a string must be escaped as {escaping}"


def find_step_object(text: str, relevant: set[str]) -> tuple[_Search, str]:
    """`_find_objects`, and once more on the text unescaped when the whole object came escaped (``{\\"``)."""
    search = _find_objects(text, relevant)
    if search.found is None and re.search(r'\{\s*\\"', text):
        try:
            unescaped = json.loads(f'"{text.strip()}"', strict=False)
        except ValueError:
            unescaped = re.sub(r'\\(["\\])', r"\1", text)
        again = _find_objects(unescaped, relevant)
        if again.found is not None or again.broken:
            return again, unescaped
    return search, text


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text` (bare, fenced, inside prose, leniently decoded), or None."""
    stripped = (text or "").strip()
    position = 0
    while True:
        index = stripped.find("{", position)
        if index < 0:
            break
        end = scan_object(stripped, index)
        if end is not None:
            try:
                value = decode(stripped[index:end])
            except ValueError:
                value = None
            if isinstance(value, dict):
                return value
        position = index + 1
    return None
