"""Containers come and go as promised: one per session, replaced after a kill, never leaked."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import pytest
from support import backend_docker

from sandboxes import Policy
from sandboxes.errors import BackendUnavailable, SandboxFileError

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.fixture(autouse=True)
def _docker() -> None:
    backend_docker.require()


def api():
    from sandboxes.backends.docker import client

    return client().api


def state(container_id: str) -> dict | None:
    """The container's State, or None when it no longer exists."""
    import docker.errors

    try:
        return api().inspect_container(container_id)["State"]
    except docker.errors.NotFound:
        return None


def wait_for(predicate, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


async def test_container_is_gone_after_close_and_sessions_never_share_one():
    seen = set()
    for _ in range(4):  # pooled: the pool hands out fresh containers only
        async with backend_docker.make_executor(timeout=10) as ex:
            await ex.run("x = 1")
            container = ex.container_id
        assert container not in seen
        seen.add(container)
    # close() stops the container at once and removes it in the background, shortly after
    for container in seen:
        assert await anyio.to_thread.run_sync(wait_for, lambda c=container: state(c) is None), container


async def test_labels_name_the_owner_process():
    from sandboxes.images import LABEL_OWNER, LABEL_SANDBOX, owner_alive

    async with backend_docker.make_executor(timeout=10, pool=False) as ex:
        labels = api().inspect_container(ex.container_id)["Config"]["Labels"]
    assert labels[LABEL_SANDBOX] == "1"
    assert labels[LABEL_OWNER].split(":")[1] == str(os.getpid())
    assert owner_alive(labels[LABEL_OWNER])


async def test_container_removed_from_outside_between_runs_gives_state_lost():
    async with backend_docker.make_executor(timeout=10, pool=False) as ex:
        await ex.run("x = 41")
        first = ex.container_id
        await anyio.to_thread.run_sync(lambda: api().remove_container(first, force=True))
        result = await ex.run("print('x' in dir())")
        assert result.state_lost and result.error is None and result.stdout == "False\n"
        assert ex.container_id != first


async def test_container_killed_from_outside_during_a_run_is_reported():
    async with backend_docker.make_executor(timeout=20, pool=False) as ex:
        await ex.run("x = 1")
        container = ex.container_id

        async def kill_soon() -> None:
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(lambda: api().kill(container))

        async with anyio.create_task_group() as group:
            group.start_soon(kill_soon)
            result = await ex.run("while True:\n    pass")
        assert result.state_lost and not result.timed_out
        assert result.error is not None and result.error.type == "WorkerCrashed"
        assert state(container) is None, "the dead container is removed, not left stopped"
        assert (await ex.run("print(2)")).stdout == "2\n"


async def test_timeout_replaces_the_container():
    async with backend_docker.make_executor(timeout=1.5, pool=False) as ex:
        await ex.run("x = 1")
        first = ex.container_id
        result = await ex.run("while True:\n    pass")
        assert result.timed_out and result.state_lost
        assert state(first) is None
        assert (await ex.run("print(3)")).stdout == "3\n"
        assert ex.container_id != first


async def test_upload_download_through_the_docker_api():
    async with backend_docker.make_executor(timeout=10, pool=False) as ex:
        payload = bytes(range(256)) * 100
        await ex.upload("data/deep/blob.bin", payload)
        result = await ex.run("print(len(open('data/deep/blob.bin', 'rb').read()))")
        assert result.stdout == "25600\n"
        result = await ex.run("open('data/out.txt', 'w').write('made inside')")
        assert [a.path for a in result.artifacts] == ["data/out.txt"]
        assert await ex.download("data/out.txt") == b"made inside"
        assert await ex.download("data/deep/blob.bin") == payload
        with pytest.raises(SandboxFileError):
            await ex.download("missing.txt")
        with pytest.raises(SandboxFileError):
            await ex.download("data")


async def test_missing_image_says_how_to_build_it():
    ex = backend_docker.make_executor(image="kodeagent-sandbox:no-such-variant-000", timeout=5)
    with pytest.raises(BackendUnavailable, match="docker pull|sandboxes.images build"):
        await ex.open()
    ex = backend_docker.make_executor(image="kodeagent-sandbox:datascience-000000000000", timeout=5)
    with pytest.raises(BackendUnavailable, match="python -m sandboxes.images build --variant datascience"):
        await ex.open()


async def test_garbage_collected_session_removes_its_container():
    ex = backend_docker.make_executor(timeout=10, pool=False)
    await ex.open()
    container = ex.container_id
    del ex
    gc.collect()
    assert await anyio.to_thread.run_sync(wait_for, lambda: state(container) is None)


CHILD = textwrap.dedent(
    """
    import os, signal, sys, anyio
    # As at a terminal: a suite started in the background (`cmd &`) hands its children SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    from support import backend_docker

    async def main():
        ex = backend_docker.make_executor(timeout=60, pool=False)
        await ex.open()
        print(ex.container_id, flush=True)
        {action}

    anyio.run(main)
    """
)


def start_child(action: str) -> tuple[subprocess.Popen[str], str]:
    code = CHILD.format(tests=os.path.join(ROOT, "tests"), action=action)
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stderr is not None
    container = child.stdout.readline().strip()
    if not container:
        child.wait(timeout=30)
        pytest.fail(f"the child did not open an executor:\n{child.stderr.read()[-3000:]}")
    return child, container


async def test_parent_killed_with_sigkill_leaves_nothing_running_and_cleanup_removes_it():
    from sandboxes.images import cleanup

    child, container = start_child("os.kill(os.getpid(), signal.SIGKILL)")
    assert child.wait(timeout=30) == -signal.SIGKILL
    # no atexit, no finally ran: the closed attach stream ends the runner's stdin, so it stops
    stopped = await anyio.to_thread.run_sync(wait_for, lambda: not (state(container) or {}).get("Running"))
    assert stopped
    removed = await anyio.to_thread.run_sync(lambda: cleanup(progress=lambda _m: None))
    assert container in removed
    assert state(container) is None


async def test_ctrl_c_during_a_run_removes_the_container():
    child, container = start_child("await ex.run('while True:\\n    pass')")
    child.send_signal(signal.SIGINT)
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        _, stderr = child.communicate(timeout=30)
        pytest.fail(
            f"the child was still running 30 s after SIGINT (container state: {state(container)}); "
            f"its stderr:\n{stderr[-3000:]}"
        )
    assert await anyio.to_thread.run_sync(wait_for, lambda: state(container) is None)


async def test_cleanup_leaves_live_sessions_alone():
    from sandboxes.images import cleanup

    async with backend_docker.make_executor(timeout=10, pool=False) as ex:
        await anyio.to_thread.run_sync(lambda: cleanup(progress=lambda _m: None))
        assert (await ex.run("print(5)")).stdout == "5\n"
        assert not (await ex.run("print(6)")).state_lost


async def test_policy_still_applies_inside_the_container():
    async with backend_docker.make_executor(timeout=10, policy=Policy(), pool=False) as ex:
        result = await ex.run("import os")
        assert result.error is not None and result.error.type == "PolicyViolation"


def test_daemon_unreachable_is_a_clear_error(tmp_path):
    """A daemon that is not there (a socket path nobody listens on) gives BackendUnavailable that says what to do."""
    code = textwrap.dedent(
        """
        import anyio
        from sandboxes import open_executor, BackendUnavailable

        async def main():
            try:
                async with open_executor("docker", timeout=5):
                    print("opened")
            except BackendUnavailable as exc:
                print("unavailable:", exc)

        anyio.run(main)
        """
    )
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith("unavailable: cannot reach the Docker daemon"), done.stdout + done.stderr
    assert "start it" in done.stdout


REFILL_TMP_MB = 73
"""/tmp size of the refill test's containers: settings (a pool) of their own."""


async def test_the_shared_pool_counts_a_container_being_cleaned_as_coming_back(monkeypatch):
    """A refill while a shared container is being cleaned starts none: that one is back in
    milliseconds, a start costs hundreds of them (sessions opened back to back, as a grader opens
    them, started a container every few programs). The clean-up is held here by stopping the
    container's session host, so the refill surely comes while it is under way."""
    from sandboxes.backends.docker import shared as shared_module

    starts = []
    real_start = shared_module.start_shared

    def counted(settings):
        starts.append(settings)
        return real_start(settings)

    ex = backend_docker.make_executor(
        policy=Policy(python_guards=False), sessions_per_container=4, pool_size=0, tmp_mb=REFILL_TMP_MB
    )
    stopped = None
    try:
        async with ex:
            assert (await ex.run("print(1)")).ok
            container = shared_module._LIVE[ex.container_id]
            settings = ex.settings
            (host,) = backend_docker.children(int(api().inspect_container(ex.container_id)["State"]["Pid"]))
            monkeypatch.setattr(shared_module, "start_shared", counted)
            os.kill(host, signal.SIGSTOP)
            stopped = host
        assert container in shared_module._CLEANING
        shared_module.refill_shared(settings, 1)
        await anyio.sleep(1.0)
        assert starts == [], "the refill started a container while one was on its way back"
        os.kill(host, signal.SIGCONT)
        stopped = None
        with anyio.fail_after(30):
            while container in shared_module._CLEANING:
                await anyio.sleep(0.02)
        assert shared_module.idle_count(settings) == 1 and not container.removed, container.last_problems
        assert starts == []
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
