"""`kodeagent mcp`, driven by the MCP SDK's own client over a real stdio subprocess and real HTTP.

Every server here is the real command (`python -m kodeagent_cli mcp ...`) in its own process, with
its watchdog; HTTP servers listen on an ephemeral loopback port. The attack cases are the security
suite's categories, each proving its effect did not happen (no ``ESCAPED`` printed, no connection
arrived, the secret not read), and the kill tests count sandbox processes in /proc.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import pytest
from support.needs import require
from support.security_helpers import ESCAPED
from support.server_process import ServerProcess

mcp = pytest.importorskip(
    "mcp", reason="the MCP server tests need the mcp package: pip install 'kodeagent[mcp]'"
)
import httpx2  # noqa: E402  (the MCP SDK's HTTP client)
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
ENV.pop("KODEAGENT_MCP_TOKEN", None)
COMMAND = [sys.executable, "-m", "kodeagent_cli", "mcp"]
ALICE = "alice-" + secrets.token_urlsafe(16)
BOB = "bob-" + secrets.token_urlsafe(16)
TOOLS = ["--tool", "support.mcp_tool_functions:double", "--tool", "support.mcp_tool_functions:noisy"]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


# ---------------------------------------------------------------------- servers and clients


ANNOUNCE = re.compile(
    r"listening on (\S+),.*server pid (\d+), watchdog pid (\d+), temporary files in (\S+)\)"
)


class HttpServer(ServerProcess):
    """`kodeagent mcp --http 127.0.0.1:0` in a subprocess; its stderr is collected in `lines`."""

    def __init__(self, directory: pathlib.Path, config: dict[str, Any], *flags: str) -> None:
        path = directory / f"mcp-{secrets.token_hex(4)}.json"
        path.write_text(json.dumps(config))
        super().__init__(
            [*COMMAND, "--http", "127.0.0.1:0", "--config", str(path), *flags],
            ANNOUNCE,
            env=ENV,
            cwd=ROOT,
            stop_wait=30,
        )
        assert self.announced is not None
        self.url, self.scratch = self.announced.group(1), pathlib.Path(self.announced.group(4))
        self.server_pid, self.watchdog_pid = int(self.announced.group(2)), int(self.announced.group(3))


@asynccontextmanager
async def http_session(url: str, token: str | None, **headers: str) -> AsyncIterator[ClientSession]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_session(*flags: str, errlog: pathlib.Path | None = None) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable, args=[*COMMAND[1:], *flags], env=ENV, cwd=str(ROOT)
    )
    with open(errlog or os.devnull, "w") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """One HTTP server for most tests: two tenants, socket importable (for the network attack)."""
    from sandboxes import DEFAULT_ALLOWED_IMPORTS

    config = {
        "tools": {"double": "support.mcp_tool_functions:double"},
        "policy": {"allowed_imports": [*DEFAULT_ALLOWED_IMPORTS, "socket"]},
        "max_sessions": 48,
        "max_sessions_per_token": 24,
        "max_file_bytes": 100_000,
        "http": {
            "tokens": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}],
            "max_request_bytes": 1_000_000,
        },
    }
    server = HttpServer(tmp_path_factory.mktemp("mcp"), config)
    yield server
    assert server.stop() == 0, "".join(server.lines)


async def connection_refusal(url: str, token: str | None) -> str:
    """Connect and initialize, which must fail with an MCP error; its message (the SDK's client raises
    it from inside its task group, so it may come wrapped in exception groups)."""
    try:
        async with http_session(url, token):
            pass
    except BaseException as exc:  # noqa: B036  (an ExceptionGroup is a BaseException)
        error: BaseException | None = exc
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        assert isinstance(error, MCPError), repr(exc)
        return error.error.message
    raise AssertionError("the connection was not refused")


async def run(session: ClientSession, code: str, **arguments: Any) -> tuple[dict[str, Any], str, bool]:
    """Call run_python: (structured result, text observation, is_error)."""
    result = await session.call_tool("run_python", {"code": code, **arguments})
    assert result.structured_content is not None, result
    text = result.content[0].text  # type: ignore[union-attr]
    return result.structured_content, text, bool(result.is_error)


async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    """Call a tool that must succeed; its structured content."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result
    return result.structured_content


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """Call a tool that must be refused; the refusal's text."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    return str(result.content[0].text)  # type: ignore[union-attr]


# ---------------------------------------------------------------------- stdio


async def test_stdio_keeps_state_across_calls_and_manages_sessions() -> None:
    async with stdio_session(*TOOLS) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {
            "run_python",
            "open_session",
            "reset_session",
            "close_session",
            "list_sessions",
            "upload_file",
            "download_file",
        }
        assert "double(...): Twice x." in (tools["run_python"].description or "")
        assert tools["run_python"].output_schema is not None
        assert "stdout" in tools["run_python"].output_schema["properties"]

        first, _, _ = await run(session, "x = 41")
        second, text, is_error = await run(session, "print(x + 1)")
        assert (second["stdout"], text, is_error) == ("42\n", "42\n", False)
        assert first["session_id"] == second["session_id"]  # the default session

        opened = await call(session, "open_session")
        other = opened["session_id"]
        assert other != first["session_id"] and len(other) >= 32
        await run(session, "x = 'other'", session_id=other)
        assert (await run(session, "print(x)", session_id=other))[0]["stdout"] == "other\n"
        assert (await run(session, "print(x)"))[0]["stdout"] == "41\n"  # untouched by the other session

        listed = await call(session, "list_sessions")
        assert {s["session_id"] for s in listed["sessions"]} == {first["session_id"], other}

        await call(session, "reset_session", session_id=other)
        forgotten, _, is_error = await run(session, "print(x)", session_id=other)
        assert is_error and forgotten["error"]["type"] == "NameError"

        assert (await run(session, "print(double(21))"))[0]["stdout"] == "42\n"  # a tool function

        await call(session, "close_session", session_id=other)
        assert "no open session" in await refused(session, "run_python", code="print(1)", session_id=other)
        assert "no open session" in await refused(session, "close_session", session_id=other)


async def test_stdio_text_shows_the_last_expressions_value() -> None:
    """A host that shows the model only the text content (the MCP Inspector does) sees the value."""
    async with stdio_session() as session:
        structured, text, is_error = await run(session, "2 + 2")
        assert (structured["value"], text, is_error) == (4, "value of the last expression: 4\n", False)
        _, text, _ = await run(session, "print('hi')\n'hi'")
        assert text == "hi\nvalue of the last expression: 'hi'\n"
        _, text, _ = await run(session, "x = 1")
        assert text == "(the code ran and printed nothing)"
        _, text, _ = await run(session, "'a\\nb'")
        assert text == "value of the last expression: 'a\\nb'\n"  # a repr: one line
        _, text, _ = await run(session, "list(range(200_000))")
        assert "characters omitted" in text and len(text) < 4_200


async def test_stdio_text_shows_the_values_type() -> None:
    async with stdio_session() as session:
        assert (await run(session, "(1, 2)"))[1] == "value of the last expression: (1, 2)\n"
        assert (await run(session, "{1: 'a'}"))[1] == "value of the last expression: {1: 'a'}\n"
        assert (await run(session, "{2, 1}"))[1] == "value of the last expression: {1, 2}\n"


async def test_stdio_stdout_carries_only_protocol_messages() -> None:
    """A raw client: every line on the server's stdout is JSON-RPC, even when a tool function and the
    sandboxed code print; their output goes to stderr (the function's) or into the result (the code's)."""
    process = await anyio.open_process([*COMMAND, *TOOLS], env=ENV, cwd=ROOT)
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "run_python",
                "arguments": {"code": "print('from the code')\nprint(noisy('hi'))"},
            },
        },
    ]
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stdout = b""
    with anyio.fail_after(60):
        for message in messages:
            await process.stdin.send(json.dumps(message).encode() + b"\n")
        while b'"id":2' not in stdout.replace(b" ", b""):
            stdout += await process.stdout.receive()
        await process.stdin.aclose()
        async for chunk in process.stdout:
            stdout += chunk
        stderr = b"".join([chunk async for chunk in process.stderr])
        assert await process.wait() == 0
    lines = stdout.decode().splitlines()
    assert lines and all(json.loads(line)["jsonrpc"] == "2.0" for line in lines), stdout
    reply = next(json.loads(line) for line in lines if json.loads(line).get("id") == 2)
    assert reply["result"]["structuredContent"]["stdout"] == "from the code\nHI\n"
    assert b"NOISE-ON-STDOUT hi" in stderr and b"NOISE-ON-STDERR hi" in stderr
    assert b"NOISE" not in stdout


async def test_stdio_cancellation_discards_the_worker_and_the_next_result_says_so() -> None:
    async with stdio_session() as session:
        await run(session, "x = 1")
        with anyio.move_on_after(2) as scope:  # the SDK sends notifications/cancelled for the call
            await session.call_tool("run_python", {"code": "while True:\n    pass", "timeout": 120})
        assert scope.cancelled_caught
        after, text, is_error = await run(session, "print(x)")
        assert after["state_lost"] and after["previous_run_cancelled"]
        assert is_error and after["error"]["type"] == "NameError"
        assert "cancelled" in text
        assert (await run(session, "print(6 * 7)"))[0]["stdout"] == "42\n"


async def test_stdio_idle_sessions_are_reaped() -> None:
    async with stdio_session("--idle-timeout", "0.5") as session:
        opened = await call(session, "open_session")
        kept, _, _ = await run(session, "x = 1")  # the default session
        with anyio.fail_after(30):
            while (await call(session, "list_sessions"))["sessions"]:
                await anyio.sleep(0.2)
        assert "no open session" in await refused(
            session, "run_python", code="1", session_id=opened["session_id"]
        )
        # A call without a session id gets a new default session, and is told the old one's state is gone.
        fresh, _, _ = await run(session, "print('again')")
        assert fresh["session_id"] != kept["session_id"] and fresh["state_lost"]
        assert not (await run(session, "print(1)"))[0]["state_lost"]


async def test_stdio_files_round_trip_bounded(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "mcp.toml"
    config.write_text("max_file_bytes = 1000\n[policy]\nallowed_imports = ['json']\n")
    async with stdio_session("--config", str(config)) as session:
        await call(session, "upload_file", path="data/in.txt", content="hello")
        blob = bytes(range(256))
        await call(
            session,
            "upload_file",
            path="blob.bin",
            content=base64.b64encode(blob).decode(),
            encoding="base64",
        )
        out, text, _ = await run(
            session, "print(open('data/in.txt').read())\nopen('out.txt', 'w').write('made here')"
        )
        assert out["stdout"] == "hello\n" and out["artifacts"] == [{"path": "out.txt", "size": 9}]
        # write() returned 9: the value of the last expression, as a notebook shows it
        assert text == "hello\nvalue of the last expression: 9\n[files changed: out.txt (9 bytes)]\n"
        assert (await call(session, "download_file", path="out.txt")) | {"session_id": ""} == {
            "session_id": "",
            "path": "out.txt",
            "size": 9,
            "encoding": "text",
            "content": "made here",
        }
        got = await call(session, "download_file", path="blob.bin")
        assert got["encoding"] == "base64" and base64.b64decode(got["content"]) == blob
        assert "limit is 1,000" in await refused(session, "upload_file", path="big.txt", content="x" * 1001)
        await run(session, "open('big.txt', 'w').write('y' * 5000)")
        assert "at most 1,000" in await refused(session, "download_file", path="big.txt")
        assert "outside the working directory" in await refused(
            session, "download_file", path="../etc/passwd"
        )
        assert "base64" in await refused(session, "upload_file", path="x", content="%%%", encoding="base64")


# ---------------------------------------------------------------------- the attack suite through MCP


class Listener:
    """A loopback TCP listener that records the connections it accepts (the proof for the network case)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections: list[Any] = []
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            with suppress(OSError):
                conn, address = self.sock.accept()
                self.connections.append(address)
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


SECRET = secrets.token_hex(16)
ATTACKS = {
    "forbidden import": f"import subprocess\nprint('{ESCAPED}', subprocess.run(['id']))",
    "file read outside": f"print('{ESCAPED}', open(SECRET_PATH).read())",
    "file read via ..": f"print('{ESCAPED}', open('../' * 12 + SECRET_PATH.lstrip('/')).read())",
    "network connect": f"import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=3)\nprint('{ESCAPED}')",
    "eval": f"eval(\"print('{ESCAPED}')\")",
    "exec": f"exec(\"print('{ESCAPED}')\")",
    "dunder escape": f"print('{ESCAPED}', ().__class__.__base__.__subclasses__())",
    "dunder via getattr": f"c = getattr((), '__cla' + 'ss__')\nprint('{ESCAPED}', c.__base__)",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_attack_through_mcp_is_contained(
    http_server: HttpServer, tmp_path: pathlib.Path, name: str
) -> None:
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    listener = Listener()
    code = f"SECRET_PATH = {str(secret_file)!r}\nPORT = {listener.port}\n" + ATTACKS[name]
    try:
        async with http_session(http_server.url, ALICE) as session:
            result, text, is_error = await run(session, code)
            usable, _, _ = await run(session, "print(6 * 7)")
    finally:
        listener.close()
    assert is_error and result["error"] is not None, result
    # Not the text: its traceback quotes the code. What the code printed is stdout and stderr.
    assert ESCAPED not in result["stdout"] and ESCAPED not in result["stderr"], result
    assert all(SECRET not in seen for seen in (result["stdout"], result["stderr"], text)), result
    assert listener.connections == [], "the sandbox reached the loopback listener"
    assert usable["stdout"] == "42\n"


async def test_infinite_loop_times_out_and_the_session_recovers(http_server: HttpServer) -> None:
    async with http_session(http_server.url, ALICE) as session:
        session_id = (await call(session, "open_session"))["session_id"]
        result, text, is_error = await run(session, "while True:\n    pass", session_id=session_id, timeout=1)
        assert is_error and result["timed_out"] and result["state_lost"]
        assert result["error"]["type"] == "Timeout" and "longer than 1 s" in text
        assert (await run(session, "print(6 * 7)", session_id=session_id))[0]["stdout"] == "42\n"
        assert "at most 300" in await refused(
            session, "run_python", code="1", session_id=session_id, timeout=301
        )
        await call(session, "close_session", session_id=session_id)


async def test_output_flood_is_bounded(http_server: HttpServer) -> None:
    async with http_session(http_server.url, ALICE) as session:
        result, text, _ = await run(session, "print('x' * 5_000_000)\nfor i in range(200_000):\n    print(i)")
    assert result["truncated"] and result["stdout_omitted"] > 5_000_000
    assert len(result["stdout"]) <= 64_000 + 200 and len(text) <= 64_000 + 1_000
    assert result["stdout"].rstrip().endswith("199999")  # the tail is kept


# ---------------------------------------------------------------------- HTTP: tokens, tenants, caps


async def test_missing_or_wrong_token_is_refused(http_server: HttpServer) -> None:
    assert "needs a bearer token" in await connection_refusal(http_server.url, None)
    assert "token is not valid" in await connection_refusal(http_server.url, "not-" + ALICE)
    async with httpx2.AsyncClient() as client:  # the same on the wire: 401, a JSON-RPC error, a challenge
        answer = await client.post(
            http_server.url,
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Authorization": "Bearer " + ALICE[:-1]},
        )
    assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
    assert answer.json()["error"]["message"] == "the bearer token is not valid for this server"
    assert not any(ALICE in line or BOB in line for line in http_server.lines)  # tokens are never logged


async def test_a_token_is_generated_and_printed_when_none_is_given(tmp_path: pathlib.Path) -> None:
    server = HttpServer(tmp_path, {})
    try:
        printed = re.search(r"'Authorization: Bearer (\S+)'", "".join(server.lines))
        assert printed is not None, server.lines
        token = printed.group(1)
        assert len(token) >= 40
        async with http_session(server.url, token) as session:
            assert (await run(session, "print(6 * 7)"))[0]["stdout"] == "42\n"
        assert "not valid" in await connection_refusal(server.url, token[:-1])
    finally:
        assert server.stop() == 0, "".join(server.lines)


async def test_dns_rebinding_host_and_origin_are_refused(http_server: HttpServer) -> None:
    port = http_server.url.split(":")[2].split("/")[0]
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with httpx2.AsyncClient(headers={"Authorization": "Bearer " + ALICE}) as client:
        host = await client.post(http_server.url, json=body, headers={"Host": f"attacker.example:{port}"})
        origin = await client.post(http_server.url, json=body, headers={"Origin": "http://attacker.example"})
    assert host.status_code == 421 and "DNS rebinding" in host.json()["error"]["message"]
    assert origin.status_code == 403 and "attacker.example" in origin.json()["error"]["message"]
    # A loopback origin (a local browser client) and a localhost Host are served.
    async with http_session(http_server.url, ALICE, Origin=f"http://localhost:{port}") as session:
        assert (await run(session, "print(1)"))[0]["stdout"] == "1\n"
    async with http_session(http_server.url.replace("127.0.0.1", "localhost"), ALICE) as session:
        assert (await run(session, "print(2)"))[0]["stdout"] == "2\n"


async def test_another_tokens_session_is_unreachable(http_server: HttpServer) -> None:
    async with http_session(http_server.url, ALICE) as alice, http_session(http_server.url, BOB) as bob:
        mine = (await call(alice, "open_session"))["session_id"]
        await run(alice, "secret = 'alice only'", session_id=mine)
        await call(alice, "upload_file", path="notes.txt", content="alice's file", session_id=mine)
        for tool, arguments in [
            ("run_python", {"code": "print(secret)", "session_id": mine}),
            ("download_file", {"path": "notes.txt", "session_id": mine}),
            ("upload_file", {"path": "notes.txt", "content": "bob was here", "session_id": mine}),
            ("reset_session", {"session_id": mine}),
            ("close_session", {"session_id": mine}),
        ]:
            assert "no open session" in await refused(bob, tool, **arguments), tool
        assert mine not in {s["session_id"] for s in (await call(bob, "list_sessions"))["sessions"]}
        # Bob's default session is his own, not Alice's.
        assert (await run(bob, "print(secret)"))[0]["error"]["type"] == "NameError"
        assert (await run(alice, "print(secret)", session_id=mine))[0]["stdout"] == "alice only\n"
        assert (await call(alice, "download_file", path="notes.txt", session_id=mine))[
            "content"
        ] == "alice's file"
        await call(alice, "close_session", session_id=mine)


async def test_another_tokens_mcp_transport_session_is_unusable(http_server: HttpServer) -> None:
    """An MCP transport session (Mcp-Session-Id) opened with one token answers no other token."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient() as client:
        opened = await client.post(
            http_server.url, json=initialize, headers={**accept, "Authorization": "Bearer " + ALICE}
        )
        session_id = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        headers = {**accept, "Mcp-Session-Id": session_id, "Mcp-Protocol-Version": "2025-11-25"}
        bob = await client.post(
            http_server.url, json=listing, headers={**headers, "Authorization": "Bearer " + BOB}
        )
        alice = await client.post(
            http_server.url, json=listing, headers={**headers, "Authorization": "Bearer " + ALICE}
        )
    assert opened.status_code == 200 and len(session_id) >= 32
    assert bob.status_code == 404 and "no such MCP session for this token" in bob.json()["error"]["message"]
    assert alice.status_code == 200 and "run_python" in alice.text


async def test_oversized_request_is_refused(http_server: HttpServer) -> None:
    async with http_session(http_server.url, ALICE) as session:
        with pytest.raises(MCPError, match="at most 1,000,000 bytes per request"):
            await session.call_tool("run_python", {"code": "x = '" + "a" * 1_200_000 + "'"})
        # The connection and the server are still fine.
        assert (await run(session, "print('still here')"))[0]["stdout"] == "still here\n"


async def test_session_caps_per_token_and_in_total(tmp_path: pathlib.Path) -> None:
    config = {
        "max_sessions": 3,
        "max_sessions_per_token": 2,
        "http": {"tokens": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}]},
    }
    server = HttpServer(tmp_path, config)
    try:
        async with http_session(server.url, ALICE) as alice, http_session(server.url, BOB) as bob:
            first = await call(alice, "open_session")
            await call(alice, "open_session")
            assert "max_sessions_per_token" in await refused(alice, "open_session")
            assert "max_sessions_per_token" in await refused(alice, "run_python", code="1")  # no default left
            await call(bob, "open_session")
            assert "max_sessions)" in await refused(bob, "open_session")  # the server's total
            await call(alice, "close_session", session_id=first["session_id"])
            assert (await run(bob, "print('room again')"))[0]["stdout"] == "room again\n"
    finally:
        assert server.stop() == 0, "".join(server.lines)


async def test_twenty_concurrent_clients_get_their_own_results(http_server: HttpServer) -> None:
    results: dict[int, tuple[str, str]] = {}

    async def client(i: int) -> None:
        async with http_session(http_server.url, ALICE if i % 2 else BOB) as session:
            session_id = (await call(session, "open_session"))["session_id"]
            await run(session, f"x = {i}", session_id=session_id)
            out, _, _ = await run(session, "print(x * 1000 + double(x))", session_id=session_id)
            results[i] = (out["stdout"], session_id)
            await call(session, "close_session", session_id=session_id)

    with anyio.fail_after(240):
        async with anyio.create_task_group() as group:
            for i in range(20):
                group.start_soon(client, i)
    assert {i: out for i, (out, _) in results.items()} == {i: f"{i * 1002}\n" for i in range(20)}
    ids = [session_id for _, session_id in results.values()]
    assert len(set(ids)) == 20 and all(re.fullmatch(r"[A-Za-z0-9_-]{32}", s) for s in ids)


# ---------------------------------------------------------------------- killed servers leave nothing


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


def still_alive(processes: dict[int, int]) -> list[int]:
    return [pid for pid, start in processes.items() if (info := _stat(pid)) is not None and info[1] == start]


async def _kill_mid_run(server: HttpServer, victim: str, sessions: int = 3) -> tuple[dict[int, int], bool]:
    """Open sessions, start an endless run, SIGKILL the victim; return the sandbox processes seen, and
    whether the server's temporary directory had the sessions' directories in it then."""
    seen: dict[int, int] = {}
    populated: list[bool] = []  # (the block below ends in a kill: a failed assertion there would be lost)
    with suppress(Exception), anyio.move_on_after(90):
        async with http_session(server.url, ALICE) as client:
            ids = [(await call(client, "open_session"))["session_id"] for _ in range(sessions)]
            for session_id in ids:
                await run(client, "x = 1", session_id=session_id)
            async with anyio.create_task_group() as group:
                group.start_soon(
                    client.call_tool,
                    "run_python",
                    {"code": "while True:\n    pass", "session_id": ids[0], "timeout": 120},
                )
                with anyio.fail_after(30):
                    while len(seen := descendants(server.server_pid)) < sessions:
                        await anyio.sleep(0.1)
                await anyio.sleep(0.5)  # the endless run is under way
                seen = descendants(server.server_pid)
                populated.append(any(server.scratch.iterdir()))
                os.kill(server.server_pid if victim == "server" else server.watchdog_pid, signal.SIGKILL)
                await anyio.sleep(0.5)
                group.cancel_scope.cancel()
    return seen, populated == [True]


async def _wait_until_gone(processes: dict[int, int], limit: float = 30) -> list[int]:
    deadline = time.monotonic() + limit
    while (left := still_alive(processes)) and time.monotonic() < deadline:
        await anyio.sleep(0.1)
    return left


@pytest.mark.parametrize("victim", ["server", "watchdog"])
@pytest.mark.parametrize("isolation", ["process", "auto"])
async def test_killed_server_leaves_no_sandbox_process(
    tmp_path: pathlib.Path, isolation: str, victim: str
) -> None:
    """SIGKILL the server (its watchdog kills what it left) or the watchdog (the server closes its
    sessions on the SIGTERM it then gets): either way, no sandbox process survives."""
    config = {"backend_options": {"isolation": isolation}, "http": {"tokens": [ALICE]}}
    server = HttpServer(tmp_path, config)
    server_itself = {server.server_pid: (_stat(server.server_pid) or (0, 0))[1]}
    try:
        seen, populated = await _kill_mid_run(server, victim)
        assert len(seen) >= 3, f"expected the sessions' processes under the server, found {seen}"
        assert populated, "the sessions' working directories were not in the server's temporary directory"
        assert await _wait_until_gone(seen) == [], "sandbox processes outlived the server"
        assert await _wait_until_gone(server_itself) == [], "the server outlived its watchdog"
        with anyio.fail_after(30):  # and its temporary files (the sessions' working directories) went too
            while server.scratch.exists():
                await anyio.sleep(0.1)
    finally:
        code = server.stop()
    if victim == "server":
        assert code == 128 + signal.SIGKILL  # the watchdog reports how the server ended
        assert any("killed by SIGKILL" in line for line in server.lines), server.lines


@pytest.mark.docker
async def test_killed_server_leaves_no_container(tmp_path: pathlib.Path) -> None:
    from support.backend_docker import unavailable

    require(unavailable(), "the Docker backend")
    import docker

    config = {"backend": "docker", "http": {"tokens": [ALICE]}}
    server = HttpServer(tmp_path, config)
    client = docker.from_env()
    owner = f"{socket.gethostname()}:{server.server_pid}:"

    def containers() -> list[str]:
        found = client.containers.list(all=True, sparse=True, filters={"label": "org.kodeagent.sandbox=1"})
        return [
            c.id
            for c in found
            if (c.attrs.get("Labels") or {}).get("org.kodeagent.owner", "").startswith(owner)
        ]

    try:
        async with http_session(server.url, ALICE) as session:
            for _ in range(2):
                session_id = (await call(session, "open_session"))["session_id"]
                assert (await run(session, "print(6 * 7)", session_id=session_id))[0]["stdout"] == "42\n"
        assert len(containers()) >= 2
        os.kill(server.server_pid, signal.SIGKILL)
        assert server.process.wait(120) == 128 + signal.SIGKILL
        assert containers() == [], "containers outlived the server"
    finally:
        server.stop()
