"""`kodeagent serve` as the real command in a subprocess, reached with the unmodified `e2b` SDK: its
keys (given, from the environment, generated in E2B's form), its shutdown (every sandbox ends with a
SIGTERM) and its watchdog (a SIGKILLed server's sandbox processes and temporary files go too)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from support.server_process import ServerProcess

e2b = pytest.importorskip("e2b")
from e2b import Sandbox  # noqa: E402
from e2b.exceptions import AuthenticationException  # noqa: E402

pytestmark = pytest.mark.e2b

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
ENV.pop("KODEAGENT_SERVE_KEY", None)
COMMAND = [sys.executable, "-m", "kodeagent_cli", "serve"]
KEY = "e2b_" + "d4" * 20
ANNOUNCE = re.compile(
    r"listening on (\S+) .*\(server pid (\d+)(?:, watchdog pid (\d+), temporary files in ([^)\s]+))?"
)


class ServeProcess(ServerProcess):
    """`kodeagent serve --http 127.0.0.1:0` in a subprocess; its stderr is collected in `lines`."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        super().__init__(
            [*COMMAND, "--http", "127.0.0.1:0", "--no-internet", *flags], ANNOUNCE, env=env or ENV, cwd=ROOT
        )
        assert self.announced is not None
        self.url, self.server_pid = self.announced.group(1), int(self.announced.group(2))
        scratch = self.announced.group(4)
        self.scratch: pathlib.Path | None = pathlib.Path(scratch) if scratch else None

    def options(self, key: str = KEY) -> dict[str, Any]:
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": key}


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every process under `root`, by pid, with its start time (to tell it from a reused pid)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (info := _stat(int(entry.name))) is not None:
            children.setdefault(info[0], []).append((int(entry.name), info[1]))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            found[pid] = start
            todo.append(pid)
    return found


def wait_gone(processes: dict[int, int], limit: float = 30) -> list[int]:
    deadline = time.monotonic() + limit
    while True:
        left = [p for p, start in processes.items() if (info := _stat(p)) is not None and info[1] == start]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_generated_key_has_e2bs_form_and_is_the_only_one() -> None:
    server = ServeProcess()
    try:
        printed = [m.group(1) for line in server.lines if (m := re.search(r"E2B_API_KEY=(\S+)", line))]
        assert len(printed) == 1 and re.fullmatch(r"e2b_[0-9a-f]{40}", printed[0])
        sandbox = Sandbox.create(**server.options(printed[0]))
        assert Sandbox.list(**server.options(printed[0])).next_items()[0].sandbox_id == sandbox.sandbox_id
        with pytest.raises(AuthenticationException):
            Sandbox.list(**server.options(KEY)).next_items()
    finally:
        assert server.stop() == 0


def test_the_key_comes_from_the_environment_or_the_config_file(tmp_path: pathlib.Path) -> None:
    server = ServeProcess(env={**ENV, "KODEAGENT_SERVE_KEY": KEY})
    try:
        assert not any("E2B_API_KEY=" in line for line in server.lines)  # nothing printed: it was given
        Sandbox.create(**server.options(KEY))
    finally:
        assert server.stop() == 0
    config = tmp_path / "serve.toml"
    other = "e2b_" + "e5" * 20
    config.write_text(f'keys = [{{name = "ops", token = "{other}"}}]\nmax_sandboxes_per_key = 1\n')
    server = ServeProcess("--config", str(config), env={**ENV, "KODEAGENT_SERVE_KEY": KEY})
    try:
        assert any("keys: ops" in line for line in server.lines)
        Sandbox.create(**server.options(other))
        with pytest.raises(AuthenticationException):
            Sandbox.create(**server.options(KEY))  # the file's keys replace the environment's
    finally:
        server.stop()


def test_sigterm_ends_every_sandbox_before_the_server_exits() -> None:
    server = ServeProcess(env={**ENV, "KODEAGENT_SERVE_KEY": KEY})
    try:
        made = [Sandbox.create(**server.options()) for _ in range(2)]
        assert len(made) == 2
        seen = descendants(server.server_pid)
        assert seen, "expected the sandboxes' processes under the server"
    finally:
        code = server.stop()
    assert code == 0, server.lines
    assert wait_gone(seen) == [], "sandbox processes outlived the server"
    assert any("closed 2 sandbox(es) at shutdown" in line for line in server.lines), server.lines
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/v2/sandboxes", headers={"X-API-KEY": KEY})


def test_a_sigkilled_server_leaves_no_sandbox_process() -> None:
    server = ServeProcess(env={**ENV, "KODEAGENT_SERVE_KEY": KEY})
    try:
        for _ in range(2):
            Sandbox.create(**server.options())
        seen = descendants(server.server_pid)
        assert seen and server.scratch is not None and server.scratch.exists()
        (homes,) = server.scratch.glob("kodeagent-serve-homes-*")  # durable homes: in the scratch directory
        assert len(list(homes.iterdir())) >= 2  # and a spare's (warm_sandboxes)
        os.kill(server.server_pid, signal.SIGKILL)
        assert server.process.wait(60) == 128 + signal.SIGKILL  # the watchdog reports how the server ended
        assert wait_gone(seen) == [], "sandbox processes outlived the server"
        assert not server.scratch.exists()
        assert any("killed by SIGKILL" in line for line in server.lines), server.lines
    finally:
        server.stop()


@pytest.mark.docker
def test_a_sigkilled_docker_server_leaves_no_container_and_no_home(tmp_path: pathlib.Path) -> None:
    import socket

    from support import backend_docker

    from sandboxes.backends.docker import client

    backend_docker.require()
    config = tmp_path / "serve.toml"
    config.write_text(f'backend = "docker"\nbackend_options = {{ image = "{backend_docker.IMAGE}" }}\n')
    server = ServeProcess("--config", str(config), env={**ENV, "KODEAGENT_SERVE_KEY": KEY})

    def containers() -> list[str]:
        owner = f"{socket.gethostname()}:{server.server_pid}:"
        found = client().containers.list(all=True, filters={"label": "org.kodeagent.sandbox=1"})
        return [c.id for c in found if c.labels.get("org.kodeagent.owner", "").startswith(owner)]

    try:
        for _ in range(2):
            sandbox = Sandbox.create(**server.options())
            sandbox.files.write("/home/user/kept.txt", "on the host")
        assert len(containers()) >= 2 and server.scratch is not None  # and a spare's (warm_sandboxes)
        (homes,) = server.scratch.glob("kodeagent-serve-homes-*")
        assert len(list(homes.iterdir())) >= 2  # bind-mounted homes, in the scratch directory
        os.kill(server.server_pid, signal.SIGKILL)
        assert server.process.wait(60) == 128 + signal.SIGKILL
        deadline = time.monotonic() + 60
        while containers() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert containers() == [], "the watchdog left the killed server's containers"
        assert not server.scratch.exists()
    finally:
        server.stop()


def test_bad_settings_and_a_busy_port_are_refused_before_serving(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "serve.json"
    bad.write_text(json.dumps({"max_sandboxes": 0}))
    done = subprocess.run([*COMMAND, "--config", str(bad)], env=ENV, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "max_sandboxes" in done.stderr
    server = ServeProcess(env={**ENV, "KODEAGENT_SERVE_KEY": KEY})
    try:
        port = server.url.rsplit(":", 1)[1]
        busy = subprocess.run(
            [*COMMAND, "--http", f"127.0.0.1:{port}"],
            env=ENV,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert busy.returncode == 3 and "cannot serve" in busy.stderr
    finally:
        server.stop()


def test_after_a_restart_a_reconnecting_client_is_told_its_sandbox_ended() -> None:
    from e2b.exceptions import NotFoundException, SandboxNotRunningException

    server = ServeProcess(env={**ENV, "KODEAGENT_SERVE_KEY": KEY})
    try:
        sandbox = Sandbox.create(**server.options())
    finally:
        assert server.stop() == 0
    again = ServeProcess(env={**ENV, "KODEAGENT_SERVE_KEY": KEY})
    try:
        with pytest.raises(NotFoundException):  # the SDK words a control-plane 404 itself
            Sandbox.connect(sandbox.sandbox_id, **again.options())
        said = httpx.get(f"{again.url}/sandboxes/{sandbox.sandbox_id}", headers={"X-API-KEY": KEY})
        assert said.status_code == 404 and "sandboxes end with the server" in said.json()["message"]
        # The old sandbox object, still holding its token, now reaches the new server: told the same.
        old = Sandbox(
            sandbox_id=sandbox.sandbox_id,
            sandbox_domain=None,
            envd_version=sandbox._envd_version,
            envd_access_token=sandbox._envd_access_token,
            traffic_access_token=None,
            connection_config=sandbox.connection_config.__class__(
                extra_sandbox_headers=sandbox.connection_config.sandbox_headers, **again.options()
            ),
        )
        with pytest.raises(SandboxNotRunningException, match="sandboxes end with the server"):
            old.files.read("/home/user/x")
    finally:
        again.stop()
