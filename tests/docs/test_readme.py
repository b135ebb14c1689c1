"""Every block of the README runs as written (each found by its `<!-- readme:NAME -->` marker)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.llm_standin import StandinLLM, code_final, code_step
from support.snippets import ROOT, fences, marked

README = ROOT / "README.md"
BLOCKS = marked(README, "readme")


def python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a README block as a user would paste it into a file: a fresh interpreter of this checkout."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True", **env}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True, timeout=300
    )


def test_every_block_is_marked_and_the_readme_is_short() -> None:
    assert len(fences(README)) == len(BLOCKS), "a README block without a <!-- readme:NAME --> marker"
    assert set(BLOCKS) == {"install", "executor", "agent", "main-job", "tests"}
    assert len(README.read_bytes()) < 10_000


def test_the_executor_example_runs(tmp_path: Path) -> None:
    done = python(BLOCKS["executor"].code, tmp_path)
    assert done.returncode == 0, done.stderr  # its asserts held
    assert len(BLOCKS["executor"].code.splitlines()) <= 10


def test_the_agent_example_runs_against_a_model(tmp_path: Path) -> None:
    # The provider is the loopback LLM stand-in (litellm reads OPENAI_API_BASE for `openai/...`
    # models): one code step that calls the tool, then the answer.
    with StandinLLM() as llm:
        llm.add(
            code_step("import statistics\nprint(statistics.mean([get_price('AAPL'), get_price('MSFT')]))"),
            code_final("300.0"),
        )
        done = python(
            BLOCKS["agent"].code, tmp_path, OPENAI_API_BASE=llm.api_base, OPENAI_API_KEY="sk-standin"
        )
        assert done.returncode == 0, done.stderr
        assert llm.remaining == 0
        assert "300.0" in repr(llm.requests[-1])  # the tool ran here and the sandboxed code printed its mean
    assert done.stdout.startswith("300.0")


def extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def test_the_install_block_names_real_extras_and_doctor_runs(tmp_path: Path) -> None:
    code = BLOCKS["install"].code
    named = {e for group in re.findall(r"\.\[([\w,-]+)\]", code) for e in group.split(",")}
    named |= set(re.search(r"# extras: (.*)", code).group(1).split())  # type: ignore[union-attr]
    assert named and named <= extras(), named - extras()
    doctor = [line for line in code.splitlines() if line.startswith("kodeagent doctor")]
    assert doctor
    # `--backend host`: the doctor's default also probes a Ray cluster, and on a shared machine that
    # is another user's.
    args = [*shlex.split(doctor[0].split("#")[0])[1:], "--backend", "host"]
    done = subprocess.run(
        [sys.executable, "-m", "kodeagent_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"backend host\s+ok", done.stdout), done.stdout


def test_the_test_command_is_what_ci_runs() -> None:
    lines = [line.split("#")[0].strip() for line in BLOCKS["tests"].code.splitlines()]
    assert lines[0] == "bash scripts/test.sh"
    assert lines[0] in (ROOT / ".ci" / "run").read_text().splitlines()
    assert (
        '"--quick"' in (ROOT / "scripts" / "test.sh").read_text()
        and lines[1] == "bash scripts/test.sh --quick"
    )


@pytest.mark.slow
def test_the_main_job_runs(tmp_path: Path) -> None:
    install, command = BLOCKS["main-job"].code.strip().split(" && ")
    assert set(re.findall(r"\.\[([\w,-]+)\]", install)) <= extras()
    # The README's command, on the first 5 problems so the test takes seconds: every verdict agrees.
    args = [*shlex.split(command)[1:], "--limit", "5", "--output", str(tmp_path / "he.json")]
    done = subprocess.run(
        [sys.executable, "-m", "kodeagent_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5/5" in done.stdout and "agree with the harness on all 5 programs" in done.stdout
