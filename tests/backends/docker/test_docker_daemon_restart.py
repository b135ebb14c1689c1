"""A Docker daemon restart is survived: the session notices on its next run (`state_lost`) and goes on.

The shared daemon is never restarted (other tests use it): a private daemon is started for this
module on its own socket, data root, exec root and bridge interface, without iptables rules, and
the sandbox image is copied into it. (Not `--bridge=none`: a daemon started so deletes docker0.) The scenario runs in a child process pointed at that daemon with
DOCKER_HOST, so it uses exactly the code path of a user whose daemon restarts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import backend_docker
from support.needs import require

pytestmark = pytest.mark.docker

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _daemon_command(base: Path) -> list[str]:
    return [
        "dockerd",
        "--data-root",
        str(base / "data"),
        "--exec-root",
        str(base / "exec"),
        "-H",
        f"unix://{base / 'docker.sock'}",
        "--pidfile",
        str(base / "docker.pid"),
        f"--bridge={_bridge_name(base)}",
        "--iptables=false",
        "--ip-masq=false",
        "--ip-forward=false",
    ]


def _bridge_name(base: Path) -> str:
    # Its own bridge: with --bridge=none dockerd *deletes* docker0, which the shared daemon needs.
    return f"kdr{base.name.rsplit('-', 1)[1]}"[:15]


def _wait_up(env: dict[str, str], seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if subprocess.run(["docker", "info"], env=env, capture_output=True).returncode == 0:
            return True
        time.sleep(0.3)
    return False


@pytest.fixture(scope="module")
def private_daemon() -> Iterator[Path]:
    backend_docker.require()
    if os.geteuid() != 0 or not all(shutil.which(c) for c in ("dockerd", "docker", "ip")):
        require("a private Docker daemon needs root, and dockerd, docker and ip on PATH", "this test")
    base = Path(f"/tmp/kodeagent-dockerd-{os.getpid()}")  # short: unix socket paths are limited
    base.mkdir()
    env = {**os.environ, "DOCKER_HOST": f"unix://{base / 'docker.sock'}"}
    bridge = _bridge_name(base)
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", "10.213.77.1/24", "dev", bridge], check=True)
    subprocess.run(["ip", "link", "set", bridge, "up"], check=True)
    log = open(base / "log", "ab")
    daemon = subprocess.Popen(_daemon_command(base), stdout=log, stderr=log)
    try:
        assert _wait_up(env), (base / "log").read_text()[-2000:]
        save = subprocess.Popen(["docker", "save", backend_docker.IMAGE], stdout=subprocess.PIPE)
        subprocess.run(["docker", "load"], stdin=save.stdout, env=env, check=True, capture_output=True)
        assert save.wait() == 0
        yield base
    finally:
        pid_file = base / "docker.pid"
        pid = int(pid_file.read_text()) if pid_file.exists() else daemon.pid
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        daemon.wait(timeout=30)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)
        log.close()
        subprocess.run(["umount", "-R", str(base / "data")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


SCENARIO = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    import anyio
    from sandboxes import open_executor

    base, command = sys.argv[1], sys.argv[2:]

    def running(pid):
        # the first daemon is the test process's child: once dead it stays a zombie until reaped
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def restart():
        pid = int(open(os.path.join(base, "docker.pid")).read())
        os.kill(pid, signal.SIGTERM)
        while running(pid):
            time.sleep(0.1)
        log = open(os.path.join(base, "log"), "ab")
        subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        for _ in range(200):
            if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
                return
            time.sleep(0.3)
        raise SystemExit("the daemon did not come back")

    async def main():
        async with open_executor("docker", timeout=20, pool=False) as ex:
            await ex.run("x = 1")
            before = ex.container_id
            print("restarting", file=sys.stderr, flush=True)
            await anyio.to_thread.run_sync(restart)
            print("restarted", file=sys.stderr, flush=True)
            result = await ex.run("print('x' in dir())")
            print(result.stdout.strip(), result.state_lost, result.error, ex.container_id != before)
        print("closed", file=sys.stderr, flush=True)

    anyio.run(main)
    """
)


def test_daemon_restart_is_survived_with_state_lost(private_daemon: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{private_daemon / 'docker.sock'}"}
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(private_daemon), *_daemon_command(private_daemon)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the variable is gone, the result says so, there was no error, and a new container serves the session
    assert done.stdout.split() == ["False", "True", "None", "True"], done.stdout + done.stderr[-2000:]
    left = subprocess.run(["docker", "ps", "-aq"], env=env, capture_output=True, text=True).stdout.split()
    assert left == [], "the session's containers are removed on close, even across the restart"
