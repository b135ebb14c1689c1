"""The stand-in keeps the promises DESIGN.md records about the real E2B service.

Driven by the unmodified SDK only. If one of these fails, the stand-in stopped imitating E2B, and
every backend test built on it would prove less than it claims.
"""

from __future__ import annotations

import time

import anyio
import pytest
from support.backend_e2b import connection, standin, unavailable

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.e2b,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
]


async def _sandbox(**kwargs: object) -> object:
    from e2b import AsyncSandbox

    return await AsyncSandbox.create("base", **{"timeout": 60, **connection(), **kwargs})


async def test_commands_files_and_env_through_the_sdk():
    sandbox = await _sandbox(envs={"FROM_CREATE": "yes"})
    try:
        result = await sandbox.commands.run(
            "echo $FROM_CREATE $FROM_RUN; pwd; echo oops >&2", envs={"FROM_RUN": "1"}
        )
        await sandbox.files.write("dir/data.bin", b"\x00\xffbytes")
        data = await sandbox.files.read("dir/data.bin", format="bytes")
        same = await sandbox.files.read("/home/user/dir/data.bin", format="bytes")
        info = await sandbox.get_info()
    finally:
        await sandbox.kill()
    out_lines = result.stdout.splitlines()
    assert out_lines[0] == "yes 1" and out_lines[1].endswith("/home/user")
    assert result.stderr == "oops\n" and result.exit_code == 0
    assert bytes(data) == bytes(same) == b"\x00\xffbytes"
    assert info.sandbox_id == sandbox.sandbox_id


async def test_exit_codes_and_output_chunks_that_are_not_lines():
    from e2b import CommandExitException

    sandbox = await _sandbox()
    chunks: list[str] = []
    try:
        with pytest.raises(CommandExitException) as failed:
            await sandbox.commands.run("echo bad; exit 3")
        await sandbox.commands.run("printf 'a'; sleep 0.2; printf 'b\\nc'", on_stdout=chunks.append)
    finally:
        await sandbox.kill()
    assert failed.value.exit_code == 3
    assert "".join(chunks) == "ab\nc" and len(chunks) >= 2


async def test_a_background_command_still_dies_at_its_timeout_unless_it_is_zero():
    sandbox = await _sandbox()
    try:
        limited = await sandbox.commands.run("sleep 30", background=True, timeout=0.5)
        unlimited = await sandbox.commands.run("sleep 30", background=True, timeout=0)
        with pytest.raises(Exception, match="timeout"):
            await limited.wait()
        deadline = time.monotonic() + 3
        while limited.pid in (running := [p.pid for p in await sandbox.commands.list()]):
            if time.monotonic() > deadline:
                break
            await anyio.sleep(0.05)
    finally:
        await sandbox.kill()
    assert limited.pid not in running
    assert unlimited.pid in running


async def test_kill_signals_only_the_process_envd_started():
    sandbox = await _sandbox()
    try:
        handle = await sandbox.commands.run(
            "(sleep 1; touch child-survived) & sleep 30", background=True, timeout=0
        )
        await anyio.sleep(0.2)
        assert await handle.kill()
        await anyio.sleep(1.5)
        listing = await sandbox.commands.run("ls")
        survived = "child-survived" in listing.stdout.split()
    finally:
        await sandbox.kill()
    assert survived


async def test_stdin_conversation_with_a_long_lived_process():
    sandbox = await _sandbox()
    lines: list[str] = []
    try:
        handle = await sandbox.commands.run(
            "cat", background=True, stdin=True, timeout=0, on_stdout=lines.append
        )
        for n in range(3):
            await sandbox.commands.send_stdin(handle.pid, f"line {n}\n")
        deadline = time.monotonic() + 5
        while "".join(lines) != "line 0\nline 1\nline 2\n" and time.monotonic() < deadline:
            await anyio.sleep(0.01)
        await sandbox.commands.close_stdin(handle.pid)
        result = await handle.wait()
    finally:
        await sandbox.kill()
    assert "".join(lines) == "line 0\nline 1\nline 2\n"
    assert result.exit_code == 0


async def test_a_gone_sandbox_answers_502_not_found():
    from e2b import SandboxNotRunningException

    sandbox = await _sandbox()
    handle = await sandbox.commands.run("sleep 30", background=True, timeout=0)
    await anyio.to_thread.run_sync(standin().vanish, sandbox.sandbox_id)
    with pytest.raises(SandboxNotRunningException):
        await handle.wait()
    assert not await sandbox.is_running()
    with pytest.raises(SandboxNotRunningException, match="not found"):
        await sandbox.commands.run("echo hi")
    with pytest.raises(SandboxNotRunningException):
        await sandbox.files.read("anything")
    assert not await sandbox.kill()  # 404: already gone


async def test_a_sandbox_ends_at_its_timeout_and_set_timeout_moves_the_end():
    short = await _sandbox(timeout=1)
    extended = await _sandbox(timeout=1)
    await extended.set_timeout(30)
    await anyio.sleep(2)
    try:
        assert not await short.is_running()
        assert await extended.is_running()
    finally:
        await extended.kill()


async def test_wrong_credentials_are_refused():
    from e2b import AsyncSandbox, AuthenticationException

    with pytest.raises(AuthenticationException):
        await AsyncSandbox.create("base", **connection(api_key="e2b_wrong"))
    sandbox = await _sandbox()
    try:
        # The envd access token comes from create; a connection without it is refused by envd.
        stranger = AsyncSandbox(
            sandbox_id=sandbox.sandbox_id,
            sandbox_domain=None,
            envd_version=sandbox._envd_version,
            envd_access_token=None,
            connection_config=sandbox.connection_config.__class__(
                **{k: v for k, v in connection().items()},
                extra_sandbox_headers={"E2b-Sandbox-Id": sandbox.sandbox_id},
            ),
        )
        with pytest.raises(AuthenticationException):
            await stranger.commands.run("echo hi")
    finally:
        await sandbox.kill()


async def test_connect_by_id_reaches_the_same_sandbox():
    from e2b import AsyncSandbox

    sandbox = await _sandbox()
    try:
        await sandbox.files.write("note.txt", b"shared")
        again = await AsyncSandbox.connect(sandbox.sandbox_id, timeout=120, **connection())
        data = await again.files.read("note.txt")
        info = await again.get_info()
    finally:
        await sandbox.kill()
    assert data == "shared"
    assert info.sandbox_id == sandbox.sandbox_id
    assert (info.end_at.timestamp() - time.time()) > 100  # connect extended the timeout
