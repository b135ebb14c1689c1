"""`POST /run_code` through SandboxFusion's own client (`sandbox-fusion` from PyPI, unmodified)
against a real `kodeagent serve` on loopback: the shapes it reads, the verdicts it scores, and the
attacks (no key, another key, an oversized body, another language, writing outside the home),
each shown not to have had its effect."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

# In the dev extra: a missing client is a failure here, not a skip.
from sandbox_fusion import RunCodeRequest, RunStatus, run_code, set_endpoint
from sandbox_fusion.models import CommandRunStatus
from support.served import Served, serving
from support.server_process import ServerProcess


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    with serving() as served:
        yield served


def endpoint(served: Served, key: str | None = None) -> str:
    """The endpoint URL with the key as Basic auth's password (what the client can carry)."""
    parts = urlsplit(served.url)
    return f"http://kodeagent:{key or served.key}@{parts.netloc}"


def run(served: Served, code: str, **fields: object) -> object:
    request = RunCodeRequest(code=code, language=fields.pop("language", "python"), **fields)
    return run_code(request, endpoint=endpoint(served), max_attempts=1)


def test_a_pass_through_the_client_with_set_endpoint(server: Served) -> None:
    set_endpoint(endpoint(server))
    try:
        response = run_code(RunCodeRequest(code="print('hello')", language="python"), max_attempts=1)
    finally:
        set_endpoint("http://localhost:8080")
    assert response.status == RunStatus.Success and response.compile_result is None
    assert response.run_result is not None and response.run_result.status == CommandRunStatus.Finished
    assert (response.run_result.return_code, response.run_result.stdout) == (0, "hello\n")
    assert response.run_result.execution_time is not None and response.run_result.execution_time > 0


def test_an_exception_is_failed_with_its_traceback_on_stderr(server: Served) -> None:
    response = run(server, "def f():\n    raise ValueError('boom')\nf()\n")
    assert response.status == RunStatus.Failed and response.run_result.return_code == 1
    assert "ValueError: boom" in response.run_result.stderr and "Traceback" in response.run_result.stderr


def test_a_timeout_is_time_limit_exceeded(server: Served) -> None:
    response = run(server, "while True:\n    pass\n", run_timeout=1)
    assert response.status == RunStatus.Failed
    assert response.run_result.status == CommandRunStatus.TimeLimitExceeded


@pytest.mark.parametrize(
    "code", ["import sys\nsys.exit(0)\nassert False\n", "import os\nos._exit(0)\nassert False\n"]
)
def test_exit_zero_is_never_a_success(server: Served, code: str) -> None:
    # SandboxFusion's reward hack: the process's exit status is 0, the tests after it never ran.
    response = run(server, code)
    assert response.status == RunStatus.Failed and response.run_result.return_code != 0
    assert "not a pass" in response.message


def test_stdin_files_and_fetch_files(server: Served) -> None:
    files = {"data/in.txt": base64.b64encode(b"21").decode()}
    code = (
        "n = int(open('data/in.txt').read()) * int(input())\nopen('out.txt', 'w').write(str(n))\nprint(n)\n"
    )
    response = run(server, code, stdin="2\n", files=files, fetch_files=["out.txt"])
    assert response.status == RunStatus.Success and response.run_result.stdout == "42\n"
    assert base64.b64decode(response.files["out.txt"]) == b"42"


# ------------------------------------------------------------------------------ attacks


MARKER = "print('ran')"


class Started:
    """How many programs the route started: a refused request must not add one (checked against a
    request that runs, so that the count is known to move)."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.before = served.app.run_code.started

    def none(self) -> bool:
        return self.served.app.run_code.started == self.before


def test_the_started_count_moves_for_a_program_that_runs(server: Served) -> None:
    started = Started(server)
    run(server, MARKER)
    assert not started.none()


@pytest.mark.parametrize("how", ["none", "wrong", "other-tenant-form"])
def test_no_key_or_a_wrong_key_runs_nothing(server: Served, how: str) -> None:
    started = Started(server)
    body = {"code": MARKER, "language": "python"}
    url = f"{server.url}/run_code"
    headers = {
        "none": {},
        "wrong": {"X-API-Key": "e2b_" + "0" * 40},
        "other-tenant-form": {"Authorization": "Bearer nope"},
    }
    answer = httpx.post(url, json=body, headers=headers[how], timeout=60)
    assert answer.status_code == 401 and answer.json()["status"] == "SandboxError"
    assert started.none()
    # and through the client, with a wrong key in the endpoint: it raises, nothing ran
    with pytest.raises(Exception, match="401"):
        run_code(
            RunCodeRequest(code=MARKER, language="python"), endpoint=endpoint(server, "bad"), max_attempts=1
        )
    assert started.none()


@pytest.mark.parametrize("header", ["X-API-Key", "Authorization"])
def test_a_repeated_key_header_runs_nothing(server: Served, header: str) -> None:
    """Two keys in one request (one of them valid) are not read as either: 400, nothing ran."""
    started = Started(server)
    valid = server.keys["alice"] if header == "X-API-Key" else f"Bearer {server.keys['alice']}"
    wrong = "e2b_" + "0" * 40 if header == "X-API-Key" else "Bearer nope"
    for pair in ([(header, wrong), (header, valid)], [(header, valid), (header, wrong)]):
        answer = httpx.post(
            f"{server.url}/run_code",
            json={"code": MARKER, "language": "python"},
            headers=pair,
            timeout=60,
        )
        assert answer.status_code == 400 and "repeats the header" in answer.text, answer.text
    assert started.none()


def test_every_key_form_is_accepted(server: Served) -> None:
    url, key = f"{server.url}/run_code", server.keys["bob"]
    for headers in ({"X-API-Key": key}, {"Authorization": f"Bearer {key}"}):
        answer = httpx.post(url, json={"code": "print(2)", "language": "python"}, headers=headers, timeout=60)
        assert answer.status_code == 200 and answer.json()["run_result"]["stdout"] == "2\n", answer.text


def test_an_oversized_body_is_refused_before_it_is_parsed(server: Served) -> None:
    from sandboxes.adapters.serve.runcode import MAX_RUN_CODE_BYTES

    started = Started(server)
    code = MARKER + "\n#" + "x" * MAX_RUN_CODE_BYTES
    answer = httpx.post(
        f"{server.url}/run_code",
        content=json.dumps({"code": code, "language": "python"}),
        headers={"X-API-Key": server.key, "Content-Type": "application/json"},
        timeout=120,
    )
    assert answer.status_code == 413 and "at most" in answer.json()["message"]
    assert started.none()

    def chunks() -> Iterator[bytes]:  # no Content-Length: cut off when the bytes pass the bound
        yield b'{"language": "python", "code": "' + MARKER.replace("'", "\\u0027").encode() + b"\\n#"
        for _ in range(MAX_RUN_CODE_BYTES // (1 << 20) + 2):
            yield b"x" * (1 << 20)
        yield b'"}'

    answer = httpx.post(
        f"{server.url}/run_code", content=chunks(), headers={"X-API-Key": server.key}, timeout=120
    )
    assert answer.status_code == 413
    assert started.none()


@pytest.mark.parametrize("language", ["cpp", "nodejs", "bash"])
def test_another_language_is_refused_clearly(server: Served, language: str) -> None:
    started = Started(server)
    with pytest.raises(Exception, match="Python only"):
        run(server, "touch /tmp/x", language=language)
    assert started.none()


def test_a_program_cannot_write_outside_its_home(server: Served, tmp_path: pathlib.Path) -> None:
    # The server's own files, and a directory of the host the test can see: neither changes.
    target = tmp_path / "escaped.txt"
    code = (
        "import os\n"
        f"for path in ({str(target)!r}, os.path.expanduser('~/.kodeagent-escaped'), '/etc/kodeagent-escaped'):\n"
        "    try:\n"
        "        open(path, 'w').write('escaped')\n"
        "        print('wrote', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, type(exc).__name__)\n"
    )
    response = run(server, code)
    assert response.status == RunStatus.Success
    assert f"wrote {target}" not in response.run_result.stdout
    assert not target.exists() and not os.path.exists("/etc/kodeagent-escaped")
    assert not os.path.exists(os.path.expanduser("~/.kodeagent-escaped"))


def test_a_path_out_of_the_home_in_files_is_refused(server: Served) -> None:
    started = Started(server)
    with pytest.raises(Exception, match="relative"):
        run(server, "print(1)", files={"../../escaped": base64.b64encode(b"x").decode()})
    with pytest.raises(Exception, match="relative"):
        run(server, "print(1)", fetch_files=["/etc/passwd"])
    assert started.none()


def test_the_kodeagent_serve_command_answers_run_code() -> None:
    """The command as a user starts it, in its own process: its key from KODEAGENT_SERVE_KEY."""
    root = pathlib.Path(__file__).resolve().parents[2]
    key = "e2b_" + "e5" * 20
    env = {**os.environ, "PYTHONPATH": str(root), "KODEAGENT_SERVE_KEY": key}
    server = ServerProcess(
        [sys.executable, "-m", "kodeagent_cli", "serve", "--http", "127.0.0.1:0", "--no-internet"],
        re.compile(r"listening on http://(\S+) "),
        env=env,
        cwd=root,
    )
    try:
        assert server.announced is not None
        endpoint = f"http://user:{key}@{server.announced.group(1).rstrip('/')}"
        response = run_code(
            RunCodeRequest(code="print(sum(range(5)))", language="python"), endpoint=endpoint, max_attempts=1
        )
        assert response.status == RunStatus.Success and response.run_result.stdout == "10\n"
    finally:
        assert server.stop() == 0, "".join(server.lines)
