"""Every Python example on the site runs, as written, and its asserts hold (pytest-examples)."""

from __future__ import annotations

import pytest
from pytest_examples import CodeExample, EvalExample, find_examples

from .conftest import ROOT

# Fragments (top-level `await`, a fork of an `ex` defined elsewhere) on pages written before the site;
# each is still to be made runnable. Listed by page so a new page cannot join them unnoticed.
FRAGMENT_PAGES = {"fork.md", "egress.md"}
EXAMPLES = [e for e in find_examples(ROOT / "docs") if e.path.name not in FRAGMENT_PAGES]


def test_the_site_has_runnable_examples() -> None:
    pages = {e.path.relative_to(ROOT / "docs").as_posix() for e in EXAMPLES}
    assert {"quickstart.md", "concepts.md"} <= pages, pages


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_docs_example_runs(example: CodeExample, eval_example: EvalExample) -> None:
    eval_example.run(example)
