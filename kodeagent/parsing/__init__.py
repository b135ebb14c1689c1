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

The readers, one concept a module: `reply` (what all share: reasoning blocks, sections, tags, the
refusal), `lenient_json`, `code` (fences and tags), `toolcalls` (the open models' text syntaxes),
`codeact_reply` and `react_reply` (the two step formats).
"""

from .codeact_reply import CODEACT_FORMAT, parse_codeact_reply
from .lenient_json import extract_json_object
from .react_reply import REACT_FORMAT, ToolSignature, parse_react_reply, parse_react_text, tool_signatures

__all__ = [
    "CODEACT_FORMAT",
    "REACT_FORMAT",
    "ToolSignature",
    "extract_json_object",
    "parse_codeact_reply",
    "parse_react_reply",
    "parse_react_text",
    "tool_signatures",
]
