"""The size bounds of everything a run returns, shared by the runner (which cuts) and the parent (which
checks again, so that a result stays bounded even if the code replaced the runner's reply).

A cut keeps the head and the tail of a text and puts between them a marker that says exactly how many
characters were left out. With an output limit ``L`` (``Executor(output_limit=L)``), a result holds at
most:

- ``stdout`` and ``stderr``: ``L`` characters each, plus the marker;
- the final answer: ``L`` characters of JSON (a longer answer comes back as the cut JSON text);
- the value of the code's last expression, in a run without a final answer: the same;
- the error: ``ERROR_TYPE_LIMIT`` + ``ERROR_MESSAGE_LIMIT`` + ``TRACEBACK_LIMIT`` characters;
- ``ARTIFACT_COUNT_LIMIT`` artifacts with paths of at most ``ARTIFACT_PATH_LIMIT`` characters.

So a serialized `ExecutionResult` stays under ``result_size_limit(L)`` characters (3 L + 48 KB) whatever
the code does; tool calls in either direction are refused past ``TOOL_MESSAGE_LIMIT`` bytes of JSON.

Only the standard library: this file runs inside every sandbox too.
"""

from __future__ import annotations

from typing import Any

ERROR_TYPE_LIMIT = 200
ERROR_MESSAGE_LIMIT = 4_000
TRACEBACK_LIMIT = 8_000
ARTIFACT_COUNT_LIMIT = 100
ARTIFACT_PATH_LIMIT = 240
TOOL_MESSAGE_LIMIT = 16 * 1024 * 1024
"""Bytes of JSON one tool call may carry across the bridge, arguments or result."""
DEFINE_MESSAGE_LIMIT = TOOL_MESSAGE_LIMIT
"""Variables sent into a session cross in one message of at most this many bytes of JSON (as
much as a tool's result): the parent refuses more before anything is sent."""

_MARKER_ROOM = 60  # the longest marker text


def omission_marker(omitted: int) -> str:
    """The line that stands where `omitted` characters were cut out."""
    return f"\n... [{omitted:,} characters omitted] ...\n"


def clip(text: str, limit: int) -> tuple[str, int]:
    """`text` cut to its first and last `limit // 2` characters when longer; and how many were dropped.

    A text at most a marker's length over `limit` is left whole, so that clipping what was already
    clipped (the parent checking the runner's cut) changes nothing."""
    if len(text) <= limit + _MARKER_ROOM:
        return text, 0
    half = limit // 2
    omitted = len(text) - 2 * half
    return text[:half] + omission_marker(omitted) + (text[-half:] if half else ""), omitted


def clipped(text: str, limit: int) -> str:
    """`clip` without the count."""
    return clip(text, limit)[0]


def result_size_limit(output_limit: int) -> int:
    """Characters a serialized result can take at most, for a given `output_limit` (see the module docs)."""
    error = ERROR_TYPE_LIMIT + ERROR_MESSAGE_LIMIT + TRACEBACK_LIMIT
    artifacts = ARTIFACT_COUNT_LIMIT * (ARTIFACT_PATH_LIMIT + _MARKER_ROOM + 40)
    return 3 * (output_limit + _MARKER_ROOM) + 2 * error + artifacts + 4_096


def line_limit(output_limit: int) -> int:
    """Bytes of one protocol line the parent accepts: the largest reply, every character escaped as
    ``\\uXXXX`` in the worst case, or the largest tool call, whichever is longer."""
    return max(6 * result_size_limit(output_limit), TOOL_MESSAGE_LIMIT) + 4_096


def bound_error(error: dict[str, Any]) -> dict[str, Any]:
    """An error description with each text part cut to its bound."""
    bounded = dict(error)
    for key, limit in (
        ("type", ERROR_TYPE_LIMIT),
        ("message", ERROR_MESSAGE_LIMIT),
        ("traceback", TRACEBACK_LIMIT),
    ):
        value = bounded.get(key)
        if isinstance(value, str):
            bounded[key] = clipped(value, limit)
    return bounded


def bound_artifacts(artifacts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The first `ARTIFACT_COUNT_LIMIT` artifacts with their paths cut, and how many were left out."""
    kept = [
        {**a, "path": clipped(str(a.get("path", "")), ARTIFACT_PATH_LIMIT)}
        for a in artifacts[:ARTIFACT_COUNT_LIMIT]
    ]
    return kept, max(0, len(artifacts) - ARTIFACT_COUNT_LIMIT)


STREAM_MESSAGE_CHARS = 64_000
"""Characters of output one streamed `output` message carries at most (longer chunks are split)."""
STREAM_BUFFER_CHARS = 256_000
"""Characters of output the runner holds for its sender thread at most; past it, output is dropped
and counted rather than making the code's writes wait for a slow channel."""


class TokenBucket:
    """A character budget refilled over time: at most `capacity` characters at once, `rate` per second
    after that. Used by the runner (what it sends) and the parent (what it accepts), so a stream stays
    bounded even when the code replaced the runner. The caller passes the clock: no timing here."""

    def __init__(self, capacity: int, rate: float, now: float) -> None:
        self.capacity = max(0, int(capacity))
        self.rate = max(0.0, float(rate))
        self.level = float(self.capacity)
        self.stamp = now

    def take(self, wanted: int, now: float) -> int:
        """Take up to `wanted` characters of budget at time `now`; returns how many were granted."""
        if now > self.stamp:
            self.level = min(float(self.capacity), self.level + (now - self.stamp) * self.rate)
            self.stamp = now
        granted = min(wanted, int(self.level))
        self.level -= granted
        return max(0, granted)
