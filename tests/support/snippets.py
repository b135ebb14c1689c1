"""Code blocks of the README and the docs pages, found by the marker before each one.

A block is marked by an HTML comment on the line before its fence, `<!-- readme:NAME -->` in the
README or `<!-- snippet:NAME -->` on a docs page, so a test finds it whatever the headings say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
MARKED = re.compile(r"<!-- (\w+):([\w-]+) -->\n```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Snippet:
    name: str
    language: str
    code: str


def marked(path: Path, kind: str) -> dict[str, Snippet]:
    """Every block of `path` marked `<!-- kind:NAME -->`, by NAME (a repeated NAME is an error)."""
    found: dict[str, Snippet] = {}
    for marker_kind, name, language, code in MARKED.findall(path.read_text()):
        if marker_kind != kind:
            continue
        if name in found:
            raise ValueError(f"{path.name}: two blocks marked {kind}:{name}")
        found[name] = Snippet(name, language, code)
    return found


def fences(path: Path) -> list[tuple[str, str]]:
    """Every fenced block of `path`, marked or not: (language, code)."""
    return FENCE.findall(path.read_text())
