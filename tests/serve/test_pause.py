"""Pause and resume through the unmodified `e2b` SDK: a paused sandbox uses no CPU (its processes,
found from the kernel, are stopped and their CPU time stands still) and keeps its memory (variables
survive); it resumes on `connect`, on its next in-sandbox request, or at once on `resume`; idle
sandboxes pause by themselves, and `on_timeout="pause"` pauses instead of killing. A second process
reaches a live sandbox with `Sandbox.connect`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from support.served import Served

from sandboxes.adapters.serve import ENVD_PORT
from sandboxes.adapters.serve.pause import stopped_processes

e2b = pytest.importorskip("e2b")
from e2b import Sandbox  # noqa: E402

pytestmark = pytest.mark.e2b

BURN = (
    "import subprocess, sys\n"
    "burner = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    "kept = 'still here'\n"
)


def wait_until(predicate: Any, limit: float = 20.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def cpu_ticks(pids: Any) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def run(served: Served, tenant: str, sandbox_id: str, code: str) -> Any:
    executor = served.app.registry.get(tenant, sandbox_id).sandbox.executor
    return served.call(lambda: executor.run(code))


def test_a_paused_sandbox_uses_no_cpu_and_keeps_its_memory(served: Served) -> None:
    sandbox = Sandbox.create(**served.sdk_options())
    executor = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.executor
    assert run(served, "alice", sandbox.sandbox_id, BURN).ok
    assert wait_until(lambda: len(stopped_processes(executor)) >= 2)  # the runner and its burner
    pids = list(stopped_processes(executor))
    before = cpu_ticks(pids)
    time.sleep(0.3)
    assert cpu_ticks(pids) > before  # running: the burner burns

    assert sandbox.pause() is True
    assert sandbox.get_info().state.value == "paused"
    assert Sandbox.list(**served.sdk_options()).next_items()[0].state.value == "paused"
    states = stopped_processes(executor)
    assert set(pids) <= set(states) and all(states.values()), states
    frozen = cpu_ticks(pids)
    time.sleep(0.5)
    assert cpu_ticks(pids) == frozen  # paused: not one tick
    assert sandbox.pause() is False  # already paused: the SDK's 409

    again = Sandbox.connect(sandbox.sandbox_id, **served.sdk_options())
    assert again.get_info().state.value == "running"
    assert not any(stopped_processes(executor).values())
    result = run(served, "alice", sandbox.sandbox_id, "print(kept)")
    assert result.stdout == "still here\n"  # memory kept


def test_an_in_sandbox_request_resumes_a_paused_sandbox(served: Served) -> None:
    reached: list[str] = []

    async def envd(scope: Any, receive: Any, send: Any) -> None:
        reached.append(served.app.registry.get("alice", sandbox.sandbox_id).state)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served.app.ports[ENVD_PORT] = envd
    sandbox = Sandbox.create(**served.sdk_options())
    sandbox.pause()
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": str(ENVD_PORT),
        "X-Access-Token": sandbox._envd_access_token or "",
    }
    assert httpx.get(served.url + "/health", headers=headers).status_code == 200
    assert reached == ["running"]  # resumed before the request reached envd
    assert sandbox.get_info().state.value == "running"


def test_pausing_another_tenants_sandbox_is_not_found(served: Served) -> None:
    from e2b.exceptions import NotFoundException

    sandbox = Sandbox.create(**served.sdk_options())
    with pytest.raises(NotFoundException):
        Sandbox.pause(sandbox.sandbox_id, **served.sdk_options("bob"))
    assert sandbox.get_info().state.value == "running"


def test_an_idle_sandbox_pauses_and_its_next_request_resumes_it(serve_with: Any) -> None:
    served = serve_with(idle_pause=0.5)
    sandbox = Sandbox.create(**served.sdk_options())
    executor = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.executor
    assert run(served, "alice", sandbox.sandbox_id, "x = 41").ok
    assert wait_until(lambda: served.app.registry.get("alice", sandbox.sandbox_id).state == "paused")
    assert all(stopped_processes(executor).values())
    assert served.app.registry.paused_idle >= 1
    Sandbox.connect(sandbox.sandbox_id, **served.sdk_options())
    assert run(served, "alice", sandbox.sandbox_id, "print(x + 1)").stdout == "42\n"


def test_on_timeout_pause_pauses_instead_of_killing(served: Served) -> None:
    sandbox = Sandbox.create(timeout=1, lifecycle={"on_timeout": "pause"}, **served.sdk_options())
    assert run(served, "alice", sandbox.sandbox_id, "y = 'kept'").ok
    assert wait_until(lambda: sandbox.get_info().state.value == "paused")
    assert served.app.registry.killed_on_timeout == 0 and served.app.registry.paused_on_timeout == 1
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=60, **served.sdk_options())
    info = resumed.get_info()
    assert info.state.value == "running"
    assert (info.end_at.timestamp() - time.time()) > 50  # a new lifetime, not the spent one
    assert run(served, "alice", sandbox.sandbox_id, "print(y)").stdout == "kept\n"


def test_a_second_process_connects_to_a_live_sandbox(served: Served) -> None:
    reached: list[str] = []

    async def envd(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"from the sandbox"})

    served.app.ports[ENVD_PORT] = envd
    sandbox = Sandbox.create(**served.sdk_options())
    sandbox.pause()
    script = (
        "import json, sys\n"
        "from e2b import Sandbox\n"
        "sandbox = Sandbox.connect(sys.argv[1])\n"
        "print(json.dumps({'id': sandbox.sandbox_id, 'state': sandbox.get_info().state.value,\n"
        "                  'read': sandbox.files.read('/home/user/x')}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    done = subprocess.run(
        [sys.executable, "-c", script, sandbox.sandbox_id],
        env={**env, **served.env()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer == {"id": sandbox.sandbox_id, "state": "running", "read": "from the sandbox"}
    assert reached == ["/files"]
    other = subprocess.run(
        [sys.executable, "-c", script, sandbox.sandbox_id],
        env={**env, **served.env("bob")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert other.returncode != 0 and "NotFoundException" in other.stderr


@pytest.mark.docker
def test_a_docker_sandbox_pauses_and_resumes_with_its_memory(serve_with: Any) -> None:
    from support import backend_docker

    backend_docker.require()
    code_interpreter = pytest.importorskip("e2b_code_interpreter")
    served = serve_with(backend="docker", backend_options={"image": backend_docker.IMAGE})
    sandbox = code_interpreter.Sandbox.create(**served.sdk_options())
    sandbox.run_code("x = 5")
    held = served.app.registry.get("alice", sandbox.sandbox_id)
    container = held.sandbox.executor.session.worker.container_id  # type: ignore[union-attr]
    import docker

    assert sandbox.pause() is True
    assert docker.from_env().containers.get(container).status == "paused"
    again = code_interpreter.Sandbox.connect(sandbox.sandbox_id, **served.sdk_options())
    assert docker.from_env().containers.get(container).status == "running"
    assert again.run_code("x + 1").text == "6"
