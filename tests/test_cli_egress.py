"""The network flags of `kodeagent exec`, `run` and `mcp` (`--network`, `--allow-egress`,
`--deny-egress`) and doctor's egress line, through the real command and the real egress gateway.

The "service on this machine" is an HTTP server on the host's loopback (`loopback_http.py`): what
network-on code must never reach unless a rule names it. Every proof is on its side too: which
requests arrived.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.loopback_http import GATEWAY_GET, LoopbackHttp
from support.needs import require

import kodeagent_cli as cli

CLI = [sys.executable, "-m", "kodeagent_cli"]
ROOT = Path(__file__).resolve().parent.parent
SOCKET = ["--allow-import", "socket"]


def egress_problem() -> str | None:
    from sandboxes.backends.host.process import namespaces_available
    from sandboxes.egress.service import unavailable

    return unavailable() or (None if namespaces_available() else "bubblewrap cannot make namespaces here")


@pytest.fixture
def service() -> Iterator[LoopbackHttp]:
    require(egress_problem(), "the egress gateway")
    with LoopbackHttp() as server:
        yield server


def kodeagent(
    *args: str, stdin: str | None = None, timeout: float = 120, **run: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=timeout, **run)  # type: ignore[call-overload, no-any-return]


def fetch_both(port: int, other: int) -> str:
    return (
        GATEWAY_GET + f"print(gateway_get('127.0.0.1', {port}))\nprint(gateway_get('127.0.0.1', {other}))\n"
    )


def test_exec_allow_egress_reaches_only_the_named_service(service: LoopbackHttp) -> None:
    other = LoopbackHttp()
    try:
        code = fetch_both(service.port, other.port)
        done = kodeagent(
            "exec", "-", *SOCKET, "--allow-egress", f"127.0.0.1:{service.port}", "--json", stdin=code
        )
    finally:
        other.close()
    assert done.returncode == cli.EXIT_OK, done.stderr
    result = json.loads(done.stdout)
    first, second = result["stdout"].splitlines()
    assert "200 OK" in first and LoopbackHttp.BODY in first
    assert "403 Forbidden" in second and '"refused_by": "loopback"' in second
    assert service.paths == ["/"] and other.paths == []  # nothing reached the port no rule names
    connections = result["network"]["connections"]
    assert [(c["port"], c["allowed"], c["rule"]) for c in connections] == [
        (service.port, True, f"allow '127.0.0.1:{service.port}'"),
        (other.port, False, "loopback"),  # a rule for one port leaves the rest of this machine shut
    ]


def test_exec_network_is_the_public_internet_only_and_says_why_on_stderr(service: LoopbackHttp) -> None:
    code = GATEWAY_GET + f"print(gateway_get('127.0.0.1', {service.port}))\n"
    done = kodeagent("exec", "-", *SOCKET, "--network", stdin=code)
    assert done.returncode == cli.EXIT_OK, done.stderr
    assert "403 Forbidden" in done.stdout
    assert f"[network: 127.0.0.1:{service.port} refused by loopback" in done.stderr
    assert service.paths == []  # this machine's service never saw the request


def test_exec_deny_egress_wins_over_allow(service: LoopbackHttp) -> None:
    code = GATEWAY_GET + f"print(gateway_get('127.0.0.1', {service.port}))\n"
    done = kodeagent(
        "exec",
        "-",
        *SOCKET,
        "--allow-egress",
        "127.0.0.0/8",
        "--deny-egress",
        f"127.0.0.1:{service.port}",
        stdin=code,
    )
    assert done.returncode == cli.EXIT_OK, done.stderr
    assert f"refused by deny '127.0.0.1:{service.port}'" in done.stderr
    assert service.paths == []


def test_exec_a_bad_egress_rule_is_a_usage_error_naming_it() -> None:
    done = kodeagent("exec", "-", "--allow-egress", "pypi.org,no such host!", stdin="print(1)\n")
    assert done.returncode == cli.EXIT_USAGE
    assert "invalid egress rule" in done.stderr and "'no such host!'" in done.stderr
    assert "Traceback" not in done.stderr


def test_exec_egress_on_a_level_without_its_own_network_is_refused_with_the_fix() -> None:
    done = kodeagent("exec", "-", "--allow-egress", "pypi.org", "-o", "isolation=process", stdin="print(1)\n")
    assert done.returncode == cli.EXIT_UNAVAILABLE
    assert "namespaces" in done.stderr and "docker" in done.stderr  # what to do instead
    assert "1\n" not in done.stdout  # the code never ran on this machine's network


def test_run_allow_egress_reaches_the_agents_code(
    service: LoopbackHttp, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.llm_standin import StandinLLM, code_final, code_step, register_standin_models

    register_standin_models()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-standin")
    step = GATEWAY_GET + f"print(gateway_get('127.0.0.1', {service.port})[1])"
    with StandinLLM() as llm:
        llm.add(code_step(step), code_final("done"))
        code = cli.main(
            [
                "run",
                "Fetch the page",
                "--model",
                llm.model("json"),
                "--api-base",
                llm.api_base,
                "--allow-import",
                "socket",
                "--allow-egress",
                f"127.0.0.1:{service.port}",
                "--json",
            ]
        )
    out = json.loads(capsys.readouterr().out)
    assert code == cli.EXIT_OK, out
    assert LoopbackHttp.BODY in json.dumps([r for r in out["responses"] if r["type"] == "step"])
    assert service.paths == ["/"]


def test_run_without_network_flags_gets_no_network(
    service: LoopbackHttp, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.llm_standin import StandinLLM, code_final, code_step, register_standin_models

    register_standin_models()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-standin")
    step = (
        GATEWAY_GET
        + f"try:\n    gateway_get('127.0.0.1', {service.port})\nexcept OSError as e:\n    print(repr(e))"
    )
    with StandinLLM() as llm:
        llm.add(code_step(step), code_final("done"))
        cli.main(
            ["run", "Fetch", "--model", llm.model("json"), "--api-base", llm.api_base]
            + ["--allow-import", "socket", "--json"]
        )
    out = json.loads(capsys.readouterr().out)
    assert "network access is not allowed" in json.dumps(out)  # the guards say so first
    assert service.paths == []


# ---------------------------------------------------------------------- doctor


def test_doctor_names_the_egress_mechanism() -> None:
    require(egress_problem(), "the egress gateway")
    done = kodeagent("doctor", "--backend", "host", "--json")
    assert done.returncode == cli.EXIT_OK, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    egress = checks["egress (host)"]
    assert egress["ok"], egress
    assert "gateway" in egress["detail"] and "network namespace of its own" in egress["detail"]


@pytest.mark.docker
def test_doctor_names_the_docker_egress_mechanism() -> None:
    from support import backend_docker

    require(backend_docker.unavailable(), "doctor's docker line")
    require(egress_problem(), "the egress gateway")
    done = kodeagent("doctor", "--backend", "docker", "--json", timeout=300)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    egress = checks["egress (docker)"]
    assert egress["ok"], egress
    assert "container's namespace" in egress["detail"] and "'none'" in egress["detail"]


def test_doctor_says_how_to_fix_egress_when_the_gateway_cannot_be_built() -> None:
    """Without CAP_SYS_ADMIN no session gets a network namespace of its own, so no gateway can
    contain it: doctor says network=True is refused, and the fix; the host backend still runs."""
    setpriv = shutil.which("setpriv")
    require(None if setpriv and os.geteuid() == 0 else "needs root and setpriv (util-linux)", "this test")
    done = subprocess.run(
        [setpriv or "setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", *CLI, "doctor"]
        + ["--backend", "host", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == cli.EXIT_OK, done.stderr  # network is not essential
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["backend host"]["ok"] and "process" in checks["backend host"]["detail"]
    egress = checks["egress (host)"]
    assert not egress["ok"] and "refused" in egress["detail"]
    assert "seccomp=unconfined" in egress["fix"]  # bubblewrap's own fix: why namespaces fail here
