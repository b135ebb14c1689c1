"""E2B-specific behaviour, on the loopback stand-in driven by the unmodified SDK over real HTTP.

Each test proves an effect in the sandbox (files that do or do not appear, sandboxes the stand-in
saw alive), not only what the client reports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from support.backend_e2b import connection, make_executor, standin, unavailable

from sandboxes import BackendUnavailable, Policy, WorkerStartError
from sandboxes.backends.e2b import E2BExecutor

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.e2b,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
]

SLOW_WRITER = "import time\ntime.sleep({delay})\nopen('late.txt', 'w').write('too late')\nprint('wrote')"


async def _eventually(predicate: object, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await anyio.to_thread.run_sync(predicate):  # type: ignore[arg-type]
            return True
        await anyio.sleep(0.05)
    return False


async def test_a_sandbox_that_vanishes_while_idle_is_replaced_with_state_lost():
    async with make_executor(timeout=10) as ex:
        first = ex.sandbox_id
        await ex.run("x = 1")
        await anyio.to_thread.run_sync(standin().vanish, first)
        await anyio.sleep(0.3)  # the SDK's output stream reports the loss on its own
        after = await ex.run("print('fresh')")
        gone = await ex.run("print(x)")
        second = ex.sandbox_id
    assert after.ok and after.stdout == "fresh\n" and after.state_lost
    assert gone.error is not None and gone.error.type == "NameError"
    assert second is not None and second != first


async def test_a_sandbox_that_vanishes_mid_run_gives_state_lost_and_the_session_recovers():
    policy = Policy(allowed_imports=["time"])
    async with make_executor(policy=policy, timeout=20) as ex:
        await ex.run("x = 1")
        sandbox_id = ex.sandbox_id
        assert sandbox_id is not None

        async def vanish_soon() -> None:
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(standin().vanish, sandbox_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(vanish_soon)
            lost = await ex.run("import time\ntime.sleep(10)\nprint('finished')")
        after = await ex.run("print('again')")
        gone = await ex.run("print(x)")
    assert lost.state_lost and not lost.timed_out
    assert lost.error is not None and lost.error.type == "WorkerCrashed"
    assert lost.duration < 10
    assert after.ok and after.stdout == "again\n"
    assert gone.error is not None and gone.error.type == "NameError"


async def test_a_timeout_stops_the_code_in_the_sandbox():
    policy = Policy(allowed_imports=["time"])
    async with make_executor(policy=policy, timeout=0.5) as ex:
        sandbox_id = ex.sandbox_id
        assert sandbox_id is not None
        workdir = await anyio.to_thread.run_sync(standin().home_dir, sandbox_id) / "work"
        result = await ex.run(SLOW_WRITER.format(delay=1.5))
        await anyio.sleep(2.5)  # well past the moment the code would have written the file
        late_file_exists = (workdir / "late.txt").exists()
        after = await ex.run("print('still usable')")
        same_sandbox = ex.sandbox_id == sandbox_id
    assert result.timed_out and result.state_lost
    assert not late_file_exists
    assert after.ok and after.stdout == "still usable\n"
    assert same_sandbox  # the runner was replaced; the sandbox and its files were kept


async def test_the_slow_writer_does_write_when_given_time():
    """The control for the timeout test: the same code, with time to finish, leaves the file."""
    policy = Policy(allowed_imports=["time"])
    async with make_executor(policy=policy, timeout=10) as ex:
        result = await ex.run(SLOW_WRITER.format(delay=0.2))
        data = await ex.download("late.txt")
    assert result.ok and result.stdout == "wrote\n"
    assert data == b"too late"


async def test_a_timeout_also_kills_processes_the_code_started():
    policy = Policy(allowed_imports=["os", "time"], subprocess=True)
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(1.5)\n"
        "    open('child.txt', 'w').write('child outlived the timeout')\n"
        "    os._exit(0)\n"
        "time.sleep(30)"
    )
    async with make_executor(policy=policy, timeout=0.5) as ex:
        sandbox_id = ex.sandbox_id
        assert sandbox_id is not None
        workdir = await anyio.to_thread.run_sync(standin().home_dir, sandbox_id) / "work"
        result = await ex.run(code)
        await anyio.sleep(2.5)
        child_wrote = (workdir / "child.txt").exists()
    assert result.timed_out
    assert not child_wrote


@pytest.mark.parametrize("template", ["x; touch {marker}", "$(touch {marker})", "`touch {marker}`"])
async def test_pip_packages_are_never_interpreted_by_a_shell(tmp_path: Path, template: str):
    marker = tmp_path / "pwned"
    before = set(await anyio.to_thread.run_sync(standin().running_ids))
    ex = make_executor(timeout=10, pip_packages=[template.format(marker=marker)])
    with pytest.raises(WorkerStartError, match="pip"):
        await ex.open()
    assert not marker.exists()
    # The failed open killed the sandbox it had created.
    assert set(await anyio.to_thread.run_sync(standin().running_ids)) <= before


async def test_pip_packages_are_installed_once_per_sandbox():
    # `anyio` is installed where the stand-in's commands run, so pip succeeds without a network.
    async with make_executor(timeout=10, pip_packages=["anyio"]) as ex:
        result = await ex.run("print('ok')")
    assert result.ok and result.stdout == "ok\n"


async def test_env_is_the_sandbox_environment():
    policy = Policy(allowed_imports=["os"])
    async with make_executor(policy=policy, timeout=10, env={"TZ": "UTC", "GREETING": "hi"}) as ex:
        result = await ex.run("import os\nprint(os.environ.get('GREETING'), os.environ.get('TZ'))")
    assert result.stdout == "hi UTC\n"


async def test_the_sandbox_timeout_is_set_explicitly_and_extended_while_in_use():
    # timeout 1 s and sandbox_timeout 2 s: the lifetime becomes 1 + 10 = 11 s; extended after 5.5 s of use.
    async with make_executor(timeout=1, sandbox_timeout=2) as ex:
        sandbox_id = ex.sandbox_id
        assert sandbox_id is not None
        end_at = await anyio.to_thread.run_sync(standin().end_at, sandbox_id)
        assert 9 < end_at - time.time() <= 11.5
        await anyio.sleep(6)
        result = await ex.run("print('in use')")
        extended = await anyio.to_thread.run_sync(standin().end_at, sandbox_id)
    assert result.ok
    assert extended - end_at > 5


async def test_close_kills_the_sandbox():
    ex = make_executor(timeout=10)
    await ex.open()
    sandbox_id = ex.sandbox_id
    await ex.run("print(1)")
    await ex.close()
    assert sandbox_id not in await anyio.to_thread.run_sync(standin().running_ids)


async def test_concurrent_sessions_are_bounded_per_api_key():
    from support.e2b_standin import StandIn

    # A stand-in of its own that refuses a third sandbox (HTTP 429, as E2B does at the account limit).
    limited = StandIn(max_sandboxes=2)
    await anyio.to_thread.run_sync(limited.start)
    try:
        options = {"api_key": limited.api_key, "api_url": limited.api_url, "sandbox_url": limited.sandbox_url}
        policy = Policy(allowed_imports=["time"])
        results = []

        async def session(n: int) -> None:
            async with E2BExecutor(policy=policy, timeout=10, max_concurrent_sandboxes=2, **options) as ex:
                results.append(await ex.run(f"import time\ntime.sleep(0.3)\nprint({n})"))

        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(session, n)
        stats = await anyio.to_thread.run_sync(limited.stats)
    finally:
        await anyio.to_thread.run_sync(limited.stop)
    assert sorted(r.stdout for r in results) == [f"{n}\n" for n in range(5)]
    assert stats["created"] == 5
    assert stats["peak_running"] == 2  # parallel up to the bound, never beyond it


async def test_a_rejected_api_key_is_a_clear_error():
    ex = E2BExecutor(**connection(api_key="e2b_not_a_valid_key"))
    with pytest.raises(BackendUnavailable, match="rejected the API key"):
        await ex.open()


def test_a_missing_sdk_is_a_clear_error():
    # A real interpreter in which `import e2b` fails, as when the extra is not installed.
    script = (
        "import sys; sys.modules['e2b'] = None\n"
        "from sandboxes import open_executor, BackendUnavailable\n"
        "try:\n"
        "    open_executor('e2b', api_key='k')\n"
        "except BackendUnavailable as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert "pip install 'kodeagent[e2b]'" in out.stdout, out.stderr


async def test_many_sessions_share_one_event_loop_without_cross_talk():
    async def session(n: int, results: dict[int, list[str]]) -> None:
        async with make_executor(timeout=10) as ex:
            await ex.run(f"mine = {n}")
            outputs = []
            for step in range(5):
                outputs.append((await ex.run(f"mine = mine * 10 + {step}\nprint(mine)")).stdout)
            results[n] = outputs

    results: dict[int, list[str]] = {}
    async with anyio.create_task_group() as tg:
        for n in range(1, 7):
            tg.start_soon(session, n, results)
    for n, outputs in results.items():
        expected, value = [], n
        for step in range(5):
            value = value * 10 + step
            expected.append(f"{value}\n")
        assert outputs == expected
    assert len(results) == 6


async def test_messages_larger_than_one_stdin_chunk_cross_intact():
    # A tool result of 3 MB travels as several SendInput calls; its reply is many output chunks.
    blob = "é" * 1_500_000
    # (An output limit above the answer's size: a longer final answer would come back cut.)
    async with make_executor(timeout=30, output_limit=2_000_000, tools={"blob": lambda: blob}) as ex:
        result = await ex.run("value = blob()\nprint(len(value), value[:3], value[-3:])\nfinal_answer(value)")
    assert result.ok, result.error
    assert result.stdout == "1500000 ééé ééé\n"
    assert result.final_answer == blob


@pytest.mark.parametrize("network", [False, True])
async def test_egress_is_closed_after_setup_unless_the_policy_allows_network(network: bool):
    async with make_executor(timeout=10, policy=Policy(network=network)) as ex:
        sandbox_id = ex.sandbox_id
        assert sandbox_id is not None
        settings = await anyio.to_thread.run_sync(standin().network, sandbox_id)
    if network:  # E2B's internet, never a private, link-local (metadata) or reserved range
        assert "0.0.0.0/0" not in settings["denyOut"]
        assert {"10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8", "100.64.0.0/10"} <= set(settings["denyOut"])
    else:
        assert settings.get("denyOut") == ["0.0.0.0/0"]


async def test_set_network_on_a_live_session_is_refused_not_ignored():
    """E2B's network is E2B's, not behind this machine's gateway: a live change would not happen,
    so it is refused rather than recorded as if it had."""
    async with make_executor(timeout=10, policy=Policy(network=True)) as ex:
        await ex.run("x = 1")
        with pytest.raises(ValueError, match="cannot change a live session's network"):
            await ex.set_network(False)
        assert ex.policy.network is True  # unchanged
        assert (await ex.run("print(x)")).stdout == "1\n"
