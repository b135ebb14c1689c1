"""What the model is told about one run of its code: the `ExecutionResult` as an observation.

Output is untrusted and may be huge: each stream is neutralised (no terminal escapes) and cut head and
tail under one marker that states the real number of characters left out — what the sandbox dropped
plus what this cut drops. The value of the code's last expression is shown as its repr (as a notebook
shows it), so the model sees `(1, 2)` as a tuple and `'4'` as a string. Lost state, timeouts and crashes are said plainly, since the model must
define its variables again; a run that printed nothing gets a hint to print what it needs.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .text import cap_text, neutralize_control

if TYPE_CHECKING:
    from sandboxes import ExecutionResult

_OMITTED = re.compile(r"\n\.\.\. \[([\d,]+) characters omitted\] \.\.\.\n")


def _marker(omitted: int) -> str:
    return f"\n... [{omitted:,} characters omitted] ...\n"


def cut_stream(text: str, sandbox_omitted: int, limit: int) -> str:
    """One output stream for the model: about `limit` characters kept, head and tail, and one marker
    stating how many characters were really left out — what the sandbox dropped plus what this cut
    drops — so the model is never told a wrong count. Control characters are neutralised after the cut,
    so the count is of the characters the code printed."""
    head, tail, located = text, "", False
    if sandbox_omitted:
        found = [m for m in _OMITTED.finditer(text) if int(m.group(1).replace(",", "")) == sandbox_omitted]
        if found:  # the sandbox's own marker (printed look-alikes rarely carry the same count)
            middle = found[len(found) // 2]
            head, tail, located = text[: middle.start()], text[middle.end() :], True
    if len(head) + len(tail) <= limit:
        if sandbox_omitted and not located:
            return (
                neutralize_control(text) + f"\n(... and {sandbox_omitted:,} characters the sandbox left out)"
            )
        return neutralize_control(text)  # with the sandbox's marker, if it cut
    keep_head = limit * 2 // 3
    keep_tail = max(1, limit - keep_head)
    if not located:
        omitted = sandbox_omitted + len(text) - keep_head - keep_tail
        return neutralize_control(text[:keep_head]) + _marker(omitted) + neutralize_control(text[-keep_tail:])
    new_head = head[:keep_head]
    new_tail = tail[-keep_tail:] if len(tail) > keep_tail else tail
    omitted = sandbox_omitted + (len(head) - len(new_head)) + (len(tail) - len(new_tail))
    return neutralize_control(new_head) + _marker(omitted) + neutralize_control(new_tail)


def format_observation(result: ExecutionResult, *, limit: int = 8000, timeout: float | None = None) -> str:
    """What the model is told about one run of its code (an `ExecutionResult`)."""
    parts: list[str] = []
    if (
        result.state_lost
        and not result.timed_out
        and not (result.error and result.error.type == "WorkerCrashed")
    ):
        parts.append(
            "Notice: the Python session was restarted before this code ran. Variables, functions and "
            "imports from earlier steps are gone; define again what you need."
        )
    stdout = cut_stream((result.stdout or "").rstrip("\n"), result.stdout_omitted, limit)
    stderr = cut_stream((result.stderr or "").rstrip("\n"), result.stderr_omitted, limit // 2)
    if stdout.strip():
        parts.append("Output:\n" + stdout)
    if stderr.strip():
        parts.append("Standard error:\n" + stderr)
    if result.truncated and not (result.stdout_omitted or result.stderr_omitted):
        parts.append("(The output was longer than the sandbox keeps; only its beginning and end are shown.)")
    error = result.error
    if result.timed_out:
        limit_text = f" of {timeout:g} s" if timeout else ""
        parts.append(
            f"Error: the code was stopped because it ran past the time limit{limit_text}. The session was "
            "restarted, so every variable from earlier steps is lost. Make the code faster or split the "
            "work, and define again what you need."
        )
    elif error is not None:
        if error.type == "WorkerCrashed":
            cause = "it ran out of memory" if result.oom else "the sandbox process ended"
            parts.append(
                f"Error: the code did not finish ({cause}). The session was restarted, so every variable "
                "from earlier steps is lost."
            )
        else:
            detail = neutralize_control(error.traceback or f"{error.type}: {error.message}")
            parts.append("Error:\n" + cap_text(detail.rstrip("\n"), 3000))
    shown = result.shown_value(limit // 2)
    if shown is not None:
        shown = neutralize_control(shown)
        separator = "\n" if "\n" in shown else " "
        parts.append(f"Value of the last expression:{separator}{shown}")
    if result.has_final_answer:
        parts.append("final_answer() was called.")
    artifacts = result.artifacts
    if artifacts:
        listing = ", ".join(f"{a.path} ({a.size} bytes)" for a in artifacts[:20])
        parts.append(f"Files created or changed: {listing}")
    if (
        not stdout.strip()
        and not stderr.strip()
        and error is None
        and not result.timed_out
        and not result.has_final_answer
        and shown is None
    ):
        parts.append(
            "The code ran without errors and printed nothing. Print the values you need to see, "
            "e.g. print(result)."
        )
    return "\n".join(parts)
