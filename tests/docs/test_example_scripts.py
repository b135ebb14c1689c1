"""Every script in examples/ runs as its docstring says, in a fresh interpreter of this checkout.

A model is the loopback LLM stand-in (litellm reads OPENAI_API_BASE for `openai/...` models); E2B is
a real `kodeagent serve` on loopback, reached by the unmodified E2B SDK through its variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.llm_standin import StandinLLM, code_final, code_step
from support.served import serving
from support.snippets import ROOT

EXAMPLES = ROOT / "examples"


def run(name: str, *args: str, cwd: Path | None = None, **env: str) -> str:
    command = ["bash"] if name.endswith(".sh") else [sys.executable]
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),  # this checkout's packages, also for the `kodeagent` command
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **env,
    }
    done = subprocess.run(
        [*command, str(EXAMPLES / name), *args],
        cwd=cwd or ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{name}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_example_is_run_here() -> None:
    tested = {
        "run_code.py",
        "agent_with_tools.py",
        "streaming.py",
        "fork_best.py",
        "build_images.sh",
        "run_benchmark.sh",
        "mcp_client.py",
        "smolagents_executor.py",
        "e2b_client.py",
    }
    assert {p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh")} == tested


def test_run_code() -> None:
    out = run("run_code.py")
    assert "area: 12.566" in out and "kept between runs: 20" in out
    assert "refused: PolicyViolation" in out and "timed out: True" in out and "the session goes on: 2" in out


def test_streaming_shows_output_before_the_result() -> None:
    lines = run("streaming.py").splitlines()
    assert [line.split("  ", 1)[1] for line in lines[:3]] == [f"stdout: 'step {i}\\n'" for i in range(3)]
    times = [float(line.split()[0]) for line in lines]
    assert times == sorted(times) and times[3] - times[0] >= 0.4  # each step arrived as it was printed
    assert lines[3].endswith("result: ok=True")


def test_fork_best() -> None:
    out = run("fork_best.py")
    assert "best ranked: 1 3.5" in out  # statistics.median of the six, ranked above the others
    assert "first success: " in out and "first success: 2" not in out  # the raising one never wins
    assert "parent untouched: False" in out


def test_agent_with_tools_against_a_model() -> None:
    with StandinLLM() as llm:
        llm.add(
            code_step("import statistics\nprint(statistics.mean([get_price('AAPL'), get_price('MSFT')]))"),
            code_final(300.0),
        )
        out = run("agent_with_tools.py", OPENAI_API_BASE=llm.api_base, OPENAI_API_KEY="sk-standin")
        assert llm.remaining == 0
        assert "300.0" in json.dumps(llm.requests[-1])  # the observation: the tool ran, the code printed
    assert "answer: 300.0" in out and "successful: True" in out


def test_smolagents_executor_against_a_model() -> None:
    def step(code: str) -> str:
        return f"Thought: I will run some code.\n<code>\n{code}\n</code>"

    with StandinLLM() as llm:
        llm.add(
            step("total = get_price('AAPL') + get_price('MSFT')\nprint(total)"), step("final_answer(total)")
        )
        out = run("smolagents_executor.py", OPENAI_API_BASE=llm.api_base, OPENAI_API_KEY="sk-standin")
        assert llm.remaining == 0
        assert "600.0" in json.dumps(llm.requests[-1])
    assert "answer: 600.0" in out


def test_mcp_client() -> None:
    out = run("mcp_client.py")
    assert "run_python" in out.split("tools:")[1].splitlines()[0]
    assert "run_python: value of the last expression: 2.8" in out  # `xs` persisted between calls


def test_e2b_client_against_kodeagent_serve() -> None:
    with serving() as server:
        out = run("e2b_client.py", **server.env())
    assert "run_code: 3628800" in out and "command: 2 data.csv" in out
    assert "connected: '1,2'" in out


def test_build_images_help() -> None:
    # A build needs the Docker daemon and minutes; its options are the real command's.
    out = run("build_images.sh", "--help")
    assert "--offline" in out and "--variant" in out


@pytest.mark.slow
def test_run_benchmark(tmp_path: Path) -> None:
    out = run("run_benchmark.sh", "3", cwd=tmp_path, RESULTS_DIR=str(tmp_path))
    assert "agree with the harness on all 3 programs" in out
    result = json.loads((tmp_path / "humaneval-example.json").read_text())
    assert result["benchmark"] == "humaneval" and result["sandbox"]["passed"] == 3
