"""Text hygiene for everything that crosses from a sandbox or tool to the model or the terminal.

Sandbox output is untrusted. ANSI escape sequences could recolour, hide or rewrite what a person sees
in their terminal; a carriage return can make the screen show a different line than the one the model
reads. So escapes are removed, other control characters are shown as visible `\\xNN` codes, and
text is capped keeping its head and tail (errors usually sit at the end).
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), and two-character escapes (ESC x).
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
# C0 controls except tab and newline, DEL, C1 controls, and Unicode bidi overrides/isolates.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def neutralize_control(text: str) -> str:
    """Remove terminal escape sequences and make other control characters visible.

    A lone carriage return becomes a newline, so that text a terminal would overwrite stays readable
    as its own line instead of silently replacing what came before it.
    """
    if not text:
        return ""
    text = _ANSI.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def cap_text(text: str, limit: int) -> str:
    """Keep at most about `limit` characters: the head and the tail, with a note of what was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}"


def truncate(text: str, limit: int) -> str:
    """Cut `text` to `limit` characters with an ellipsis (for history summaries and logs)."""
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."
