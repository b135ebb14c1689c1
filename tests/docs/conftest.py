"""The docs site, built once per test session with warnings as errors (`mkdocs build --strict`)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.needs import require

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BuiltSite:
    directory: Path
    returncode: int
    log: str


def docs_tools_missing() -> str | None:
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return f"the docs tests need {module}: pip install -e '.[docs]'"
    return None


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> BuiltSite:
    require(docs_tools_missing(), "the docs site build")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    return BuiltSite(out, done.returncode, done.stdout + done.stderr)
