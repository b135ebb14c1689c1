"""The `kodeagent` command line: real subprocesses, a real sandbox, the LLM stand-in over real HTTP.

Exit codes are part of the interface (scripts and CI branch on them), so each one is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.needs import require

import kodeagent_cli as cli

CLI = [sys.executable, "-m", "kodeagent_cli"]


def kodeagent(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["run"],
        ["exec"],
        ["bench"],
        ["images"],
        ["images", "build"],
        ["images", "list"],
        ["cleanup"],
        ["doctor"],
    ],
)
def test_every_command_has_help(command: list[str]) -> None:
    done = kodeagent(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kodeagent")


def test_benchmark_help_comes_from_the_benchmark() -> None:
    done = kodeagent("bench", "humaneval", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: kodeagent bench humaneval" in done.stdout and "--samples" in done.stdout


def test_no_command_is_a_usage_error() -> None:
    done = kodeagent()
    assert done.returncode == cli.EXIT_USAGE
    assert "usage:" in done.stderr


def test_start_up_imports_no_sdk() -> None:
    probe = (
        "import sys, kodeagent_cli as c; c.build_parser(); "
        "print(sorted(m for m in ('litellm', 'docker', 'e2b', 'benchmarks') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_exec_stdin_prints_output_and_final_answer() -> None:
    done = kodeagent("exec", "-", stdin="import math\nprint(math.factorial(5))\nfinal_answer({'n': 120})\n")
    assert done.returncode == cli.EXIT_OK, done.stderr
    assert done.stdout == '120\n{"n": 120}\n'


def test_exec_shows_the_last_expressions_value_as_the_python_prompt_does() -> None:
    done = kodeagent("exec", "-", stdin="print('sum')\n2 + 2\n")
    assert done.returncode == cli.EXIT_OK, done.stderr
    assert done.stdout == "sum\n4\n"
    text = kodeagent("exec", "-", stdin="'4'\n")
    assert text.stdout == "'4'\n"  # a str shows as one
    assert kodeagent("exec", "-", stdin="x = 4\n").stdout == ""


def test_exec_file_keeps_stdout_and_stderr_apart(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint('out')\nprint('err', file=sys.stderr)\n")
    done = kodeagent("exec", str(script), "--allow-import", "sys")
    assert done.returncode == cli.EXIT_OK, done.stderr
    assert done.stdout == "out\n"
    assert done.stderr == "err\n"


def test_exec_exception_exits_1_with_traceback() -> None:
    done = kodeagent("exec", "-", stdin="print('before')\n1 / 0\n")
    assert done.returncode == cli.EXIT_FAILED
    assert done.stdout == "before\n"
    assert "ZeroDivisionError" in done.stderr and "Traceback" in done.stderr


def test_exec_policy_violation_exits_1_and_names_what_is_allowed() -> None:
    done = kodeagent("exec", "-", stdin="import subprocess\n")
    assert done.returncode == cli.EXIT_FAILED
    assert "PolicyViolation" in done.stderr and "subprocess" in done.stderr and "math" in done.stderr


def test_exec_allow_import_and_allow_builtin() -> None:
    assert kodeagent("exec", "-", stdin="print(eval('6*7'))\n").returncode == cli.EXIT_FAILED
    done = kodeagent("exec", "-", "--allow-builtin", "eval", stdin="print(eval('6*7'))\n")
    assert (done.returncode, done.stdout) == (cli.EXIT_OK, "42\n"), done.stderr
    done = kodeagent("exec", "-", "--only-imports", "--allow-import", "json", stdin="import math\n")
    assert done.returncode == cli.EXIT_FAILED and "math" in done.stderr
    done = kodeagent(
        "exec", "-", "--only-imports", "--allow-import", "json,math", stdin="import math\nprint(1)\n"
    )
    assert (done.returncode, done.stdout) == (cli.EXIT_OK, "1\n"), done.stderr


def test_exec_timeout_exits_124() -> None:
    done = kodeagent("exec", "-", "--timeout", "1", stdin="while True:\n    pass\n")
    assert done.returncode == cli.EXIT_TIMEOUT
    assert "Timeout" in done.stderr


def test_exec_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    done = kodeagent("exec", str(tmp_path / "missing.py"))
    assert done.returncode == cli.EXIT_USAGE
    assert "cannot read" in done.stderr


def test_exec_json_is_the_execution_result() -> None:
    done = kodeagent("exec", "-", "--json", stdin="print('hi')\nraise ValueError('bad')\n")
    assert done.returncode == cli.EXIT_FAILED
    result = json.loads(done.stdout)
    assert result["stdout"] == "hi\n"
    assert result["error"]["type"] == "ValueError"
    assert result["backend"] == "host"


@pytest.mark.e2b  # the SDK must be there for the missing key to be what is reported
def test_exec_unavailable_backend_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    done = subprocess.run(
        [*CLI, "exec", "-", "--backend", "e2b"],
        input="print(1)\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in __import__("os").environ.items() if k != "E2B_API_KEY"},
    )
    assert done.returncode == cli.EXIT_UNAVAILABLE
    assert "E2B_API_KEY" in done.stderr


def test_doctor_finds_the_host_backend_working() -> None:
    done = kodeagent("doctor", "--backend", "host", "--json")
    assert done.returncode == cli.EXIT_OK, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["backend host"]["ok"], checks
    assert "isolation" in checks["backend host"]["detail"]
    assert checks["python"]["ok"]
    assert checks["serve"]["ok"], checks["serve"]  # a real server on loopback served a sandbox
    assert "served a sandbox over loopback HTTP" in checks["serve"]["detail"]


@pytest.mark.e2b  # the SDK must be there for the missing key to be what is reported
def test_doctor_names_the_fix_for_a_missing_backend() -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "E2B_API_KEY"}
    done = subprocess.run(
        [*CLI, "doctor", "--backend", "e2b"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == cli.EXIT_OK  # only python and host are essential, and host was not asked for
    assert "E2B_API_KEY" in done.stdout and "missing" in done.stdout


def test_run_streams_a_codeact_agent_against_the_llm_standin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.llm_standin import StandinLLM, code_final, code_step, register_standin_models

    register_standin_models()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-standin")
    with StandinLLM() as llm:
        llm.add(code_step("print(sum(range(10)))"), code_final("45"))
        code = cli.main(
            [
                "run",
                "What is the sum of 0..9?",
                "--model",
                llm.model("json"),
                "--api-base",
                llm.api_base,
                "--json",
            ]
        )
    out = json.loads(capsys.readouterr().out)
    assert code == cli.EXIT_OK
    assert out["final"] == {"value": "45", "successful": True}
    steps = [r for r in out["responses"] if r["type"] == "step"]
    assert steps and "45" in json.dumps(steps[0])
    assert out["usage"]["total"]["calls"] == 2


def test_exec_backend_options_reach_the_backend() -> None:
    done = kodeagent("exec", "-", "-o", "isolation=process", "--json", stdin="print(1)\n")
    assert done.returncode == cli.EXIT_OK, done.stderr
    assert json.loads(done.stdout)["stdout"] == "1\n"
    done = kodeagent("exec", "-", "-o", "no_such_option=1", stdin="print(1)\n")
    assert done.returncode == cli.EXIT_USAGE and "no_such_option" in done.stderr
    done = kodeagent("exec", "-", "-o", "not-key-value", stdin="print(1)\n")
    assert done.returncode == cli.EXIT_USAGE


def _docker_problem() -> str | None:
    try:
        from sandboxes.images import docker_client

        docker_client()
    except Exception as exc:  # noqa: BLE001 - any failure means no daemon to test against
        return str(exc)
    return None


@pytest.mark.docker
def test_images_list_talks_to_the_daemon() -> None:
    require(_docker_problem(), "the docker backend")
    done = kodeagent("images", "list", "--json")
    assert done.returncode == cli.EXIT_OK, done.stderr
    listed = json.loads(done.stdout)
    assert isinstance(listed, list) and all({"tag", "alias", "variant"} <= set(i) for i in listed)
