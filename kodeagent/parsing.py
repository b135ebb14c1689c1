"""Turning a model's text into a structured step: read it as the model meant it, or refuse — never guess.

A small model's reply comes in many shapes, and the agent must either read each one as intended or
tell the model exactly what was wrong (the refusal becomes an observation, and the model tries again).
A misread is the one outcome that is never acceptable: code cut at an inner quote, code taken from a
``<think>`` block, a literal ``\\n`` left in code, or code run when the reply also gave an answer all
make the loop act on something the model did not say.

What is read (`parse_codeact_reply`, `parse_react_reply`):

* JSON: bare, fenced, or inside prose; with trailing commas; Python-style (single quotes, ``True``,
  triple-quoted strings, a dict literal); capitalised or camelCase keys; double-encoded (a JSON string
  holding the object); over-escaped (``{\\"code\\": ...}``, or code whose ``\\n`` was escaped twice —
  accepted only when the code compiles after one unescape and not before); code as a list of lines.
* Code in ```python fences (several are joined in order), ``<code>``/``<execute>`` tags, a ``Code:``
  section, or a fence left open because the reply was cut at a stop sequence.
* ``<think>…</think>`` and other reasoning blocks are set aside: code inside them never runs; what
  follows them is read.
* ``Final Answer:`` lines and ``<final_answer>``/``<answer>`` tags.
* ReAct ``Action:`` with ``Args:`` or ``Action Input:``.
* The tool-call syntaxes open models print as text: Hermes/Qwen ``<tool_call>{…}</tool_call>``,
  Llama ``<|python_tag|>`` and ``{"name": …, "parameters": …}``, Mistral ``[TOOL_CALLS][…]``.

What is refused, with a message naming the problem (`ResponseParseError`): a reply that both acts and
answers; a JSON object that is cut off or invalid; an action missing required arguments; FINISH
without an answer; a reply that writes its own ``Observation:``; a reply with nothing to act on.

Only the model's own reply is ever parsed: observations (what code printed, what tools returned) never
go through these functions.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ResponseParseError
from .models import CodeActChatMessage, ReActChatMessage

_TRUE = {"true", "yes", "1", "y"}
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.S)
_CODE_LANGS = {"python", "py", "python3", "py3", "ipython", ""}
_OUTPUT_LANGS = {"output", "stdout", "result", "observation", "console"}
_CODE_TAGS = ("code", "execute", "execute_ipython", "python", "execute_python", "run_python")
_FINAL_TAGS = ("final_answer", "answer", "solution")
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

# ---------------------------------------------------------------------- expected formats

CODEACT_FORMAT = (
    'To run code: {"thought": "...", "code": "<Python source>"}\n'
    'To finish: {"thought": "...", "final_answer": "<the answer>", "task_successful": true}'
)
REACT_FORMAT = (
    'To call a tool: {"thought": "...", "action": "<tool name>", "args": {"<argument>": "<value>"}}\n'
    'To finish: {"thought": "...", "action": "FINISH", "final_answer": "<the answer>", '
    '"task_successful": true}'
)


def _refuse(problem: str) -> ResponseParseError:
    return ResponseParseError(problem)


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


# ---------------------------------------------------------------------- reasoning blocks and noise


@dataclass
class _Prepared:
    body: str
    thinking: str = ""


def _prepare(text: str) -> _Prepared:
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
                    raise _refuse(
                        f"the reply ended inside a {match.group(0)} block, so it holds only reasoning and "
                        "nothing to act on; after your reasoning, give the step itself"
                    )
                text = rest
                break
            thinking.append(text[match.end() : end].strip())
            text = text[: match.start()] + text[end + len(closer) :]
    return _Prepared(text.strip(), "\n".join(t for t in thinking if t))


# ---------------------------------------------------------------------- lenient JSON


def _scan_object(text: str, start: int) -> int | None:
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


def _remove_trailing_commas(span: str) -> str:
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


def _decode(span: str, depth: int = 0) -> Any:
    """Decode one object span leniently; raise ValueError with the JSON error when nothing works."""
    first_error: ValueError | None = None
    for attempt in (span, _remove_trailing_commas(span)):
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
                return _decode(json.loads(f'"{span}"', strict=False), depth + 1)
            except ValueError:
                pass
        if value is None:
            raise first_error or ValueError("not a JSON object")
    if isinstance(value, str) and depth < 2 and value.strip().startswith("{"):
        return _decode(value.strip(), depth + 1)  # double-encoded: a JSON string holding the object
    return value


def _snake(key: str) -> str:
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
                value = _decode(stripped)
            except ValueError:
                continue
            if isinstance(value, dict) and {_snake(k) for k in value} & relevant:
                search.found = _Found({_snake(k): v for k, v in value.items()}, 0, len(text))
                return search
            continue
        end = _scan_object(text, index)
        hint = key_hint.match(text, index)
        looks_meant = bool(hint and _snake(hint.group(1)) in relevant | _STEP_KEYS)
        if end is None:
            if looks_meant:
                search.broken.append(_Broken(index, True, "the object is never closed"))
            continue
        span = text[index:end]
        try:
            value = _decode(span)
        except ValueError as exc:
            if looks_meant:
                search.broken.append(_Broken(index, False, str(exc)))
            continue
        if isinstance(value, dict):
            keys = {_snake(k) for k in value}
            if keys & relevant:
                search.found = _Found({_snake(k): v for k, v in value.items()}, index, end)
                return search
            skip_until = end
    return search


def _search(text: str, relevant: set[str]) -> tuple[_Search, str]:
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
        end = _scan_object(stripped, index)
        if end is not None:
            try:
                value = _decode(stripped[index:end])
            except ValueError:
                value = None
            if isinstance(value, dict):
                return value
        position = index + 1
    return None


# ---------------------------------------------------------------------- code blocks


@dataclass
class _Blocks:
    code: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    outputs: int = 0


def _code_blocks(text: str) -> _Blocks:
    """Python fences and code tags, in order, with the spans they cover; output fences counted apart."""
    blocks = _Blocks()
    found: list[tuple[int, int, str]] = []
    for tag in _CODE_TAGS:
        for match in re.finditer(rf"<{tag}>(.*?)(?:</{tag}>|\Z)", text, re.S | re.I):
            if any(s <= match.start() < e for s, e in blocks.spans):
                continue
            body = _unfence(match.group(1))
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


def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    chars = list(text)
    for start, end in spans:
        for i in range(start, min(end, len(chars))):
            if chars[i] != "\n":
                chars[i] = " "
    return "".join(chars)


def _unfence(code: str) -> str:
    """Code given inside a JSON string or a tag is sometimes still wrapped in a markdown fence: unwrap it."""
    match = re.fullmatch(r"\s*```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:\n?```)?\s*", code, re.S)
    return match.group(1) if match else code


def _compiles(code: str) -> bool:
    try:
        compile(code, "<reply>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _fix_overescaped(code: str) -> str:
    """Undo one level of escaping (``\\n``, ``\\"``), but only when that turns broken code into valid code."""
    if "\\" not in code or _compiles(code):
        return code
    unescaped = re.sub(r"\\([\\\"'ntr/])", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m[1], m[1]), code)
    return unescaped if _compiles(unescaped) else code


def _code_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        value = "\n".join(value)
    if not isinstance(value, str):
        raise _refuse(f"`code` must be a string of Python source, got {type(value).__name__}")
    code = _fix_overescaped(_unfence(value))
    return code if code.strip() else None


def _as_bool(value: Any, default: bool = True) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return default
    return str(value).strip().lower() in _TRUE


def _has_answer(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


# ---------------------------------------------------------------------- text sections


def _section(text: str, label: str, labels: str) -> str | None:
    """The text after ``Label:`` up to the next known label (case-insensitive, line-anchored)."""
    match = re.search(
        rf"(?im)^[ \t>#]*\**[ \t]*(?:{label})[ \t]*\**[ \t]*:\**[ \t]*(.*?)(?=^[ \t>#]*\**[ \t]*(?:{labels})[ \t]*\**[ \t]*:|\Z)",
        text,
        re.S,
    )
    return match.group(1).strip() if match else None


def _tag(text: str, names: Sequence[str]) -> str | None:
    for name in names:
        match = re.search(rf"<{name}>(.*?)(?:</{name}>|\Z)", text, re.S | re.I)
        if match:
            return match.group(1).strip()
    return None


def _self_observation(text: str) -> ResponseParseError | None:
    if _OBSERVATION_LINE.search(text):
        return _refuse(
            "the reply writes its own `Observation:`. Observations come from running your step: stop "
            "after the step and wait for the real one"
        )
    return None


# ---------------------------------------------------------------------- tool-call syntaxes


@dataclass
class _ToolCall:
    name: str
    args: Any
    code: str | None = None  # Llama's <|python_tag|> followed by plain Python


def _call_from_object(value: Any) -> _ToolCall:
    if not isinstance(value, dict):
        raise _refuse("a tool call must be a JSON object with `name` and `arguments`")
    data = {_snake(k): v for k, v in value.items()}
    if "function" in data and isinstance(data["function"], dict):
        data = {**data, **{_snake(k): v for k, v in data["function"].items()}}
    name = data.get("name") or data.get("tool") or data.get("tool_name")
    if not isinstance(name, str) or not name.strip():
        raise _refuse("a tool call must name the tool in `name`")
    args = next((data[k] for k in ("arguments", "parameters", "args", "input") if k in data), {})
    if isinstance(args, str):
        try:
            args = _decode(args) if args.strip() else {}
        except ValueError:
            raise _refuse(f"the arguments of the call to {name!r} are not a JSON object") from None
    return _ToolCall(name.strip(), args)


def _decode_calls(payload: str, syntax: str) -> list[_ToolCall]:
    payload = payload.strip()
    if not payload:
        raise _refuse(f"the {syntax} tool call is empty")
    if payload.startswith("["):
        try:
            value = json.loads(_remove_trailing_commas(payload), strict=False)
        except ValueError:
            raise _refuse(f"the {syntax} tool call is not a valid JSON list of calls (cut off?)") from None
        return [_call_from_object(v) for v in (value if isinstance(value, list) else [value])]
    end = _scan_object(payload, 0) if payload.startswith("{") else None
    if end is None:
        raise _refuse(f"the {syntax} tool call is not a complete JSON object (cut off?)")
    try:
        value = _decode(payload[:end])
    except ValueError as exc:
        raise _refuse(f"the {syntax} tool call is not valid JSON: {exc}") from None
    calls = [_call_from_object(value)]
    rest = payload[end:].strip().lstrip(";,").strip()
    if rest.startswith("{"):
        calls += _decode_calls(rest, syntax)
    return calls


def _tool_calls(body: str) -> tuple[list[_ToolCall], str] | None:
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
            calls.append(_ToolCall(m.group(1), _decode_calls(f'{{"name": "x", "arguments": {args or "{}"}}}',
                                                            "<function=...>")[0].args))  # fmt: skip
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
            raise _refuse("the reply ends right after <|python_tag|>, with no call or code")
        return [_ToolCall("python", {}, code=_unfence(payload))], before
    return None


# ---------------------------------------------------------------------- CodeAct

_CODEACT_KEYS = {
    "code": ("code", "python", "python_code", "source", "source_code", "program", "script"),
    "final_answer": ("final_answer", "answer", "final"),
    "thought": ("thought", "thoughts", "thinking", "reasoning", "explanation", "plan"),
    "task_successful": ("task_successful", "successful", "success"),
}
_CODEACT_RELEVANT = {k for keys in _CODEACT_KEYS.values() for k in keys}
_CODEACT_LABELS = "Thought|Thoughts|Code|Final Answer|Answer|Successful|Observation|Reasoning"
_PY_TOOLS = {"python", "ipython", "execute", "execute_python", "run_python", "run_code", "code_interpreter",
             "python_interpreter", "exec", "python_repl"}  # fmt: skip


def _pick(data: dict[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        if name in data:
            return data[name]
    return None


def _codeact_from_calls(calls: list[_ToolCall], thought: str, text: str) -> CodeActChatMessage:
    if len(calls) == 1 and calls[0].name in ("final_answer", "FINISH", "finish"):
        args = calls[0].args
        answer = args.get("answer", args.get("final_answer")) if isinstance(args, dict) else args
        if not _has_answer(answer):
            raise _refuse("the final_answer call gives no `answer`")
        return CodeActChatMessage(content=text, thought=thought, final_answer=answer, task_successful=True)
    lines = []
    for call in calls:
        if call.code is not None:
            lines.append(call.code)
        elif call.name in _PY_TOOLS and isinstance(call.args, dict) and len(call.args) == 1:
            [value] = call.args.values()
            code = _code_value(value)
            if code is None:
                raise _refuse(f"the {call.name!r} call holds no code")
            lines.append(code)
        elif call.name in ("final_answer", "FINISH", "finish"):
            raise _refuse("the reply both calls tools and gives the final answer; do one per step")
        else:
            if not call.name.isidentifier():
                raise _refuse(f"{call.name!r} is not a tool name")
            if not isinstance(call.args, dict) or not all(str(k).isidentifier() for k in call.args):
                raise _refuse(f"the arguments of {call.name!r} must be a JSON object of named arguments")
            args = ", ".join(f"{k}={v!r}" for k, v in call.args.items())
            lines.append(f"print({call.name}({args}))")
    return CodeActChatMessage(content=text, thought=thought, code="\n".join(lines))


def parse_codeact_reply(text: str) -> CodeActChatMessage:
    """Parse a CodeAct step: thought and code, or the final answer. Raises `ResponseParseError`."""
    prepared = _prepare(text)
    body = prepared.body
    if not body:
        raise _refuse("the reply is empty" if not prepared.thinking else "the reply holds only reasoning")
    calls = _tool_calls(body)
    if calls is not None:
        found, before = calls
        if problem := _self_observation(before):
            raise problem
        thought = _section(before, "Thought", _CODEACT_LABELS) or before.strip() or prepared.thinking
        return _codeact_from_calls(found, thought, text)
    blocks = _code_blocks(body)
    outside = _mask(body, blocks.spans)
    search, outside = _search(outside, _CODEACT_RELEVANT)
    if search.found is None and search.broken:
        broken = search.broken[0]
        if broken.cut_off:
            raise _refuse("the JSON object is cut off: it is never closed (keep the reply shorter)")
        raise _refuse(
            f"the JSON object is not valid JSON ({broken.error}); a quote inside a string must be "
            'escaped as \\", and a newline as \\n'
        )
    if search.found is not None:
        data = search.found.data
        rest = outside[: search.found.start] + outside[search.found.end :]
        if problem := _self_observation(rest) or (
            _refuse("the reply shows output it has not seen yet in an output block")
            if blocks.outputs
            else None
        ):
            raise problem
        code = _code_value(_pick(data, _CODEACT_KEYS["code"]))
        answer = _pick(data, _CODEACT_KEYS["final_answer"])
        thought = str(_pick(data, _CODEACT_KEYS["thought"]) or prepared.thinking or "")
        if code is not None and blocks.code:
            raise _refuse("the reply gives code twice, in the JSON object and in a code block; give it once")
        if code is None and blocks.code:
            code = _fix_overescaped("\n\n".join(blocks.code))
        if code is not None and _has_answer(answer):
            raise _refuse(
                "the reply both runs code and gives a final answer; do one per step: run the code, read "
                "its output, then answer"
            )
        if code is not None:
            return CodeActChatMessage(content=text, thought=thought, code=code)
        if _has_answer(answer):
            return CodeActChatMessage(
                content=text, thought=thought, final_answer=answer,
                task_successful=_as_bool(_pick(data, _CODEACT_KEYS["task_successful"]), default=True),
            )  # fmt: skip
        raise _refuse("the JSON object has neither `code` nor `final_answer`")
    if problem := _self_observation(outside):
        raise problem
    if blocks.outputs and blocks.code:
        raise _refuse("the reply shows output it has not seen yet in an output block; stop after the code")
    answer = _tag(outside, _FINAL_TAGS)
    if answer is None:
        answer = _section(outside, "Final Answer|Answer", _CODEACT_LABELS)
    code_text = "\n\n".join(blocks.code) if blocks.code else None
    if code_text is None:
        section = _section(outside, "Code", _CODEACT_LABELS)
        code_text = section if section else None
    if code_text is not None and answer is not None:
        raise _refuse(
            "the reply both runs code and gives a final answer; do one per step: run the code, read its "
            "output, then answer"
        )
    before_code = outside[: blocks.spans[0][0]] if blocks.spans else outside
    thought = _section(before_code, "Thought|Thoughts", _CODEACT_LABELS) or prepared.thinking
    if code_text is not None:
        if not thought:
            thought = before_code.strip()
        return CodeActChatMessage(content=text, thought=thought, code=_fix_overescaped(code_text))
    if answer is not None:
        if not answer:
            raise _refuse("`Final Answer:` is empty")
        successful = _section(outside, "Successful", _CODEACT_LABELS)
        return CodeActChatMessage(
            content=text, thought=thought, final_answer=answer,
            task_successful=_as_bool(successful, default=True),
        )  # fmt: skip
    raise _refuse("found no code to run and no final answer in the reply")


# ---------------------------------------------------------------------- ReAct

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
            args = _decode(args.strip())
        except ValueError:
            signature = tools.get(action)
            if signature and len(signature.params) == 1:
                args = {signature.params[0]: args.strip()}  # LangChain's bare `Action Input: value`
            else:
                raise _refuse(
                    f"the arguments of {action!r} are not a JSON object; give them by name, e.g. "
                    f"{signature.example() if signature else '{...}'}"
                ) from None
    if not isinstance(args, dict):
        signature = tools.get(action)
        if signature and len(signature.params) == 1:
            return {signature.params[0]: args}
        raise _refuse(f"the arguments of {action!r} must be a JSON object of named arguments")
    signature = tools.get(action)
    if tools and signature is None:
        raise _refuse(f"there is no tool named {action!r}; the tools are: {', '.join(sorted(tools))}")
    if signature is not None:
        missing = [p for p in signature.required if p not in args]
        if missing:
            raise _refuse(
                f"the call to {action!r} is missing required argument(s) {', '.join(missing)}; "
                f"give them all: {signature.example()}"
            )
    return args


def _react_final(text: str, thought: str, answer: Any, successful: Any) -> ReActChatMessage:
    if not _has_answer(answer):
        raise _refuse("FINISH needs the answer in `final_answer`")
    return ReActChatMessage(
        content=text, thought=thought, action="FINISH", final_answer=answer,
        task_successful=_as_bool(successful, default=True),
    )  # fmt: skip


def _react_call(
    text: str, thought: str, call: _ToolCall, tools: dict[str, ToolSignature]
) -> ReActChatMessage:
    if call.code is not None:
        raise _refuse("this agent runs no code: call a tool with a JSON object")
    if call.name.upper() in _FINISH:
        args = call.args
        answer = args.get("final_answer", args.get("answer")) if isinstance(args, dict) else args
        return _react_final(text, thought, answer, True)
    return ReActChatMessage(content=text, thought=thought, action=call.name,
                            args=_react_args(call.name, call.args, tools))  # fmt: skip


def _action_call_syntax(action: str) -> _ToolCall | None:
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
    return _ToolCall(node.func.id, args)


def parse_react_reply(text: str, tools: Mapping[str, Any] | Sequence[Any] | None = None) -> ReActChatMessage:
    """Parse a ReAct step: a tool call or FINISH with the answer. Raises `ResponseParseError`.

    `tools` (names to `Tool`s or `ToolSignature`s) lets the parser check the tool name and its required
    arguments, and map a bare ``Action Input: value`` onto a one-parameter tool.
    """
    signatures = tool_signatures(tools)
    prepared = _prepare(text)
    body = prepared.body
    if not body:
        raise _refuse("the reply is empty" if not prepared.thinking else "the reply holds only reasoning")
    calls = _tool_calls(body)
    if calls is not None:
        found, before = calls
        if problem := _self_observation(before):
            raise problem
        if len(found) != 1:
            raise _refuse(f"the reply makes {len(found)} tool calls; make one call per step")
        thought = _section(before, "Thought", _REACT_LABELS) or before.strip() or prepared.thinking
        return _react_call(text, thought, found[0], signatures)
    blocks = _code_blocks(body)
    outside = _mask(body, [s for s in blocks.spans])
    search, outside = _search(outside, _REACT_RELEVANT)
    if search.found is None and search.broken:
        broken = search.broken[0]
        if broken.cut_off:
            raise _refuse("the JSON object is cut off: it is never closed (keep the reply shorter)")
        raise _refuse(
            f"the JSON object is not valid JSON ({broken.error}); a quote inside a string must be "
            'escaped as \\"'
        )
    if search.found is not None:
        data = search.found.data
        rest = outside[: search.found.start] + outside[search.found.end :]
        if problem := _self_observation(rest):
            raise problem
        thought = str(_pick(data, _REACT_KEYS["thought"]) or prepared.thinking or "")
        action = _pick(data, _REACT_KEYS["action"])
        if action is None and "name" in data and ({"parameters", "arguments"} & data.keys()):
            return _react_call(text, thought, _call_from_object(data), signatures)  # Llama's bare JSON call
        answer = _pick(data, _REACT_KEYS["final_answer"])
        successful = _pick(data, _REACT_KEYS["task_successful"])
        if isinstance(action, dict):
            return _react_call(text, thought, _call_from_object(action), signatures)
        if action is not None and not isinstance(action, str):
            raise _refuse("`action` must be a tool name or FINISH")
        action = (action or "").strip().strip("`'\"")
        if not action or action.upper() in _FINISH:
            if not action and not _has_answer(answer):
                raise _refuse("the JSON object has neither an `action` nor a `final_answer`")
            return _react_final(text, thought, answer, successful)
        if _has_answer(answer):
            raise _refuse(
                f"the reply both calls {action!r} and gives a final answer; do one per step: call the tool, "
                "read its result, then FINISH"
            )
        args = _pick(data, _REACT_KEYS["args"])
        input_args = data.get("input_args")
        return ReActChatMessage(
            content=text, thought=thought, action=action, args=_react_args(action, args, signatures)
            if not input_args else (args if args is not None else {}),
            input_args={str(k): str(v) for k, v in input_args.items()} if isinstance(input_args, dict) else None,
        )  # fmt: skip
    if problem := _self_observation(outside):
        raise problem
    return _react_text(text, outside, prepared.thinking, signatures)


def _react_text(
    text: str, body: str, thinking: str, signatures: dict[str, ToolSignature]
) -> ReActChatMessage:
    thought = _section(body, "Thought|Thoughts", _REACT_LABELS) or thinking
    answer = _tag(body, _FINAL_TAGS)
    if answer is None:
        answer = _section(body, "Final Answer|Answer", _REACT_LABELS)
    action = _section(body, "Action", _REACT_LABELS)
    successful = _section(body, "Successful", _REACT_LABELS)
    if action is not None:
        action = action.splitlines()[0].strip().strip("`'\"*") if action.strip() else ""
    if action and action.upper() not in _FINISH:
        if answer is not None:
            raise _refuse(
                f"the reply both calls {action!r} and gives a final answer; do one per step: call the tool, "
                "read its result, then FINISH"
            )
        call = _action_call_syntax(action) if "(" in action else None
        if call is not None:
            return _react_call(text, thought, call, signatures)
        args_text = _section(body, "Action Input|Args|Arguments", _REACT_LABELS)
        args: Any = None
        if args_text:
            args_text = _unfence(args_text).strip()
            found = extract_json_object(args_text) if args_text.lstrip().startswith("{") else None
            if args_text.lstrip().startswith("{") and found is None:
                raise _refuse(f"the arguments of {action!r} are not valid JSON (cut off?)")
            args = found if found is not None else args_text
        return ReActChatMessage(content=text, thought=thought, action=action,
                                args=_react_args(action, args, signatures))  # fmt: skip
    if action is not None or answer is not None:
        if answer is None:
            raise _refuse("FINISH needs the answer: give it in `final_answer`")
        return _react_final(text, thought, answer, successful)
    raise _refuse("found neither a tool call (`action` with `args`) nor a final answer in the reply")


def parse_react_text(text: str) -> ReActChatMessage:
    """The prose form alone: ``Thought: ... Action: tool Args: {...}`` or ``Thought: ... Answer: ...``."""
    prepared = _prepare(text)
    return _react_text(text, prepared.body, prepared.thinking, {})
