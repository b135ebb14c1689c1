"""The site builds with warnings as errors, and what it generates is the code's own text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kodeagent
import sandboxes

from .conftest import ROOT, BuiltSite


def test_the_site_builds_strict(built_site: BuiltSite) -> None:
    assert built_site.returncode == 0, built_site.log
    assert "WARNING" not in built_site.log, built_site.log


def nav_pages() -> list[str]:
    import yaml

    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [page for item in node for page in walk(item)]
        if isinstance(node, dict):
            return [page for value in node.values() for page in walk(value)]
        return []

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return walk(config["nav"])


def test_every_page_in_the_nav_is_built(built_site: BuiltSite) -> None:
    pages = nav_pages()
    assert "security.md" in pages and "values.md" in pages and "fork.md" in pages
    for page in pages:
        assert (built_site.directory / Path(page).with_suffix(".html")).is_file(), page


def test_the_api_reference_has_every_public_name(built_site: BuiltSite) -> None:
    for module, page in ((sandboxes, "sandboxes"), (kodeagent, "kodeagent")):
        html = (built_site.directory / "reference" / f"{page}.html").read_text()
        missing = [name for name in module.__all__ if f'id="{module.__name__}.{name}"' not in html]
        assert not missing, f"{page}: no entry for {missing}"


def test_the_command_line_page_is_the_parsers_help(built_site: BuiltSite) -> None:
    html = (built_site.directory / "cli.html").read_text()
    env = {**os.environ, "COLUMNS": "100", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for command in ("exec", "mcp"):
        done = subprocess.run(
            [sys.executable, "-m", "kodeagent_cli", command, "--help"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
        # Each option line of the real help appears on the page (HTML-escaped like the page).
        for line in done.stdout.splitlines():
            if line.strip().startswith("--"):
                option = line.strip().split()[0]
                assert option in html, f"kodeagent {command}: {option} not on the page"
    assert "&lt;!-- kodeagent-help" not in html and "kodeagent-help:" not in html
