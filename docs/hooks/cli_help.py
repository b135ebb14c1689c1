"""MkDocs hook: replace `<!-- kodeagent-help: ARGS -->` with the real `kodeagent ARGS --help` output.

The command-line page then cannot drift from the parser: it is the parser's own text at build time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

MARKER = re.compile(r"<!-- kodeagent-help:([a-z ]*)-->")


def _help(args: str) -> str:
    env = {**os.environ, "COLUMNS": "100", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-m", "kodeagent_cli", *args.split(), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"`kodeagent {args} --help` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.rstrip()


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda m: f"```text\n{_help(m.group(1).strip())}\n```", markdown)
