"""The MCP server over HTTP against hostile clients: each attack is made over loopback against the real
`kodeagent mcp --http` (the MCP SDK's own client for the victim, raw HTTP for the attacker), and each
test proves its effect did not happen: the victim's connection, run and output untouched, another
tenant still served, the server's memory not grown by a refused file, no run left going for nobody.

Not attack-corpus entries: the attacker is an HTTP client, not code in a session.
"""

from __future__ import annotations

import json
import pathlib
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="the MCP server tests need the mcp package: pip install 'kodeagent[mcp]'")
import httpx2  # noqa: E402  (the MCP SDK's HTTP client)
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from support.raw_http import RawConnection  # noqa: E402
from test_mcp_server import ALICE, BOB, HttpServer, call, descendants, refused, run  # noqa: E402

pytestmark = pytest.mark.anyio

VERSION = "2025-11-25"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}
TENANTS = [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def _server(directory: pathlib.Path, **http: Any) -> HttpServer:
    config = {
        "max_file_bytes": 1_000_000,
        "backend_options": {"isolation": "process"},
        "http": {"tokens": TENANTS, "max_request_bytes": 2_000_000, **http},
    }
    return HttpServer(directory, config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """The server most attacks here are made against (its limits small enough to reach)."""
    started = _server(
        tmp_path_factory.mktemp("mcp-security"), max_connections=16, max_connections_per_token=8
    )
    yield started
    assert started.stop() == 0, "".join(started.lines)


@asynccontextmanager
async def watched_session(url: str, token: str) -> AsyncIterator[tuple[ClientSession, dict[str, Any]]]:
    """An SDK client session, and what its traffic showed: its transport id and its request ids."""
    seen: dict[str, Any] = {"transport": None, "calls": []}

    async def on_request(request: Any) -> None:
        try:
            message = json.loads(request.content or b"null")
        except ValueError:
            return
        if isinstance(message, dict) and message.get("method") == "tools/call":
            seen["calls"].append(message["id"])

    async def on_response(response: Any) -> None:
        seen["transport"] = seen["transport"] or response.headers.get("mcp-session-id")

    hooks = {"request": [on_request], "response": [on_response]}
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30, read=300),
            event_hooks=hooks,
        ) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session, seen


async def raw_initialize(client: Any, url: str, token: str) -> Any:
    """A bare `initialize`: the answer (its Mcp-Session-Id header opens a connection)."""
    return await client.post(url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {token}"})


# ---------------------------------------------------------------------- repeated headers


async def test_a_repeated_session_header_cannot_take_over_another_tenants_connection(
    server: HttpServer,
) -> None:
    """Bob sends Alice's transport id first and his own second (the SDK would read the first, a
    last-wins guard the second): to reuse her in-flight request id, cancel her run, and delete her
    connection. Every such request is refused; her run finishes with its output, which Bob never sees."""
    secret = "alice-output-" + secrets.token_hex(8)
    code = f"import time\ntime.sleep(4)\nprint({secret!r})"
    answers: list[Any] = []
    async with watched_session(server.url, ALICE) as (alice, seen), httpx2.AsyncClient(timeout=30) as bob:
        opened = await raw_initialize(bob, server.url, BOB)
        own = opened.headers["mcp-session-id"]
        outcome: dict[str, Any] = {}

        async def alice_runs() -> None:
            outcome["result"] = await run(alice, code)

        async with anyio.create_task_group() as group:
            group.start_soon(alice_runs)
            with anyio.fail_after(30):
                while not seen["calls"]:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # her call is in flight on her connection
            victim, request_id = seen["transport"], seen["calls"][-1]
            base = [
                ("Mcp-Session-Id", victim),
                ("mcp-session-id", own),  # another spelling: header names are case-insensitive
                ("Authorization", f"Bearer {BOB}"),
                ("Mcp-Protocol-Version", VERSION),
                *ACCEPT.items(),
            ]
            reuse = {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {"name": "run_python", "arguments": {"code": "print('bob')"}},
            }
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": request_id, "reason": "bob"},
            }
            for body in (reuse, cancel):
                answers.append(await bob.post(server.url, content=json.dumps(body), headers=base))
            answers.append(await bob.request("DELETE", server.url, headers=base))
            answers.append(await bob.get(server.url, headers=base))
        result, _, is_error = outcome["result"]
        after, _, _ = await run(alice, "print('still mine')")
    assert [a.status_code for a in answers] == [400, 400, 400, 400], [a.text for a in answers]
    assert all("repeats the header 'mcp-session-id'" in a.json()["error"]["message"] for a in answers)
    assert not is_error and result["stdout"] == secret + "\n" and not result["state_lost"], result
    assert all(secret not in a.text for a in answers)
    assert after["stdout"] == "still mine\n"


async def _raw_http(url: str, head: list[tuple[str, str]], body: bytes) -> tuple[int, bytes]:
    """A POST written byte by byte (HTTP clients refuse to send some repeated headers): its status and
    what came back."""
    address = url.split("/")[2]
    host, port = address.rsplit(":", 1)
    lines = [f"POST /{url.split('/', 3)[3]} HTTP/1.1", *(f"{k}: {v}" for k, v in head), "Connection: close"]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(request)
        answer = b""
        with anyio.fail_after(30):
            try:
                while chunk := await stream.receive():
                    answer += chunk
            except anyio.EndOfStream:
                pass
    return int(answer.split(b" ", 2)[1]), answer


async def test_every_header_the_guard_or_the_sdk_reads_may_come_only_once(server: HttpServer) -> None:
    """Each header repeated with another value is refused before the app: by the guard (its message),
    or by the HTTP server's own parser where that already refuses the repeat (Host, Content-Length)."""
    port = server.url.split(":")[2].split("/")[0]
    body = json.dumps(INITIALIZE).encode()
    single = {
        "Host": f"127.0.0.1:{port}",
        "Origin": f"http://127.0.0.1:{port}",
        "Authorization": f"Bearer {ALICE}",
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        "Accept": "application/json, text/event-stream",
        "Mcp-Protocol-Version": VERSION,
        "Last-Event-ID": "1",
    }
    other = {
        "Host": f"localhost:{port}",
        "Origin": f"http://localhost:{port}",
        "Authorization": f"Bearer {BOB}",
        "Content-Type": "application/json; charset=utf-8",
        "Content-Length": str(len(body) + 1),
        "Accept": "application/json",
        "Mcp-Protocol-Version": "2025-06-18",
        "Last-Event-ID": "2",
    }
    by_guard = set()
    for name in single:
        status, answer = await _raw_http(server.url, [*single.items(), (name.lower(), other[name])], body)
        assert status == 400, (name, answer)
        if b"repeats the header '" + name.lower().encode() + b"'" in answer:
            by_guard.add(name)
        else:
            assert b"Invalid HTTP request" in answer, (name, answer)
    assert by_guard >= {
        "Origin",
        "Authorization",
        "Content-Type",
        "Accept",
        "Mcp-Protocol-Version",
        "Last-Event-ID",
    }
    # With each once, the same request is served.
    status, answer = await _raw_http(server.url, list(single.items()), body)
    assert status == 200 and b"mcp-session-id" in answer.lower(), answer


# ---------------------------------------------------------------------- connection slots


async def test_one_token_cannot_take_every_connection_and_idle_ones_end(tmp_path: pathlib.Path) -> None:
    """Bob opens bare connections until refused: he gets his share (4 of 8), Alice still connects and
    runs code, and once Bob's connections sit idle they end: their ids answer 404, his slots are back."""
    server = _server(tmp_path, max_connections=8, max_connections_per_token=4, connection_idle_timeout=2)
    try:
        await _flood(server)
    finally:
        assert server.stop() == 0, "".join(server.lines)


async def _flood(server: HttpServer) -> None:
    async with httpx2.AsyncClient(timeout=30) as bob:
        held: list[str] = []
        for _ in range(20):
            answer = await raw_initialize(bob, server.url, BOB)
            if answer.status_code != 200:
                break
            held.append(answer.headers["mcp-session-id"])
        assert len(held) == 4 and answer.status_code == 429, answer.text
        assert "max_connections_per_token" in answer.json()["error"]["message"]
        async with watched_session(server.url, ALICE) as (alice, _):
            assert (await run(alice, "print(6 * 7)"))[0]["stdout"] == "42\n"
        with anyio.fail_after(60):  # idle for connection_idle_timeout (2 s): ended, not evicted early
            while (await raw_initialize(bob, server.url, BOB)).status_code != 200:
                await anyio.sleep(0.5)
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        stale = await bob.post(
            server.url,
            json=listing,
            headers={
                **ACCEPT,
                "Authorization": f"Bearer {BOB}",
                "Mcp-Session-Id": held[0],
                "Mcp-Protocol-Version": VERSION,
            },
        )
    assert stale.status_code == 404, stale.text


# ---------------------------------------------------------------------- files


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), bytes: a transient buffer shows here even after it
    was freed, where VmRSS would already have dropped back."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


async def test_a_file_over_the_cap_is_refused_without_being_read(server: HttpServer) -> None:
    size = 120_000_000
    async with watched_session(server.url, ALICE) as (alice, _):
        session_id = (await call(alice, "open_session"))["session_id"]
        made, _, _ = await run(
            alice,
            "with open('big.bin', 'wb') as f:\n    for _ in range(120):\n        f.write(b'x' * 1_000_000)\n"
            "open('small.txt', 'w').write('fine')",
            session_id=session_id,
        )
        assert made["error"] is None, made
        # Once first, so that what a download costs anyway is in the baseline.
        assert (await call(alice, "download_file", path="small.txt", session_id=session_id))[
            "content"
        ] == "fine"
        before = _peak_rss(server.server_pid)
        text = await refused(alice, "download_file", path="big.bin", session_id=session_id)
        grown = _peak_rss(server.server_pid) - before
        # An upload over the request cap is refused before its body is read whole.
        with pytest.raises(MCPError, match="at most 2,000,000 bytes per request"):
            await alice.call_tool("upload_file", {"path": "up.bin", "content": "y" * 3_000_000})
        await call(alice, "close_session", session_id=session_id)
    assert "larger than 1,000,000 bytes" in text and "max_file_bytes" in text, text
    assert grown < size // 2, f"the server's peak memory grew by {grown:,} bytes for a refused file"


# ---------------------------------------------------------------------- runs end with their client


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


async def _spinning(server: HttpServer) -> set[int]:
    """The sandbox processes under the server that are burning CPU (the endless loop), once there are."""
    with anyio.fail_after(60):
        while True:
            first = {pid: _cpu_ticks(pid) for pid in descendants(server.server_pid)}
            await anyio.sleep(0.5)
            busy = {
                pid
                for pid, ticks in first.items()
                if ticks is not None and (now := _cpu_ticks(pid)) is not None and now - ticks >= 10
            }
            if busy:
                return busy


async def _gone(pids: set[int]) -> bool:
    with anyio.move_on_after(60):
        while any(_cpu_ticks(pid) is not None for pid in pids):
            await anyio.sleep(0.1)
        return True
    return False


LOOP = "while True:\n    pass"


async def test_a_body_over_the_cap_is_answered_once_it_is_in(server: HttpServer) -> None:
    """The head of a request over the cap sent alone: no answer until its body is in (a client still
    writing is not answered mid-write), and then the 413."""
    path = "/" + server.url.split("/", 3)[3]
    body = b"x" * 2_500_000

    def exchange() -> tuple[bool, int]:
        with RawConnection(server.url) as conn:
            head = {"Authorization": f"Bearer {ALICE}", **ACCEPT, "Content-Length": str(len(body))}
            conn.send_head("POST", path, head)
            quiet = conn.nothing_within(0.5)
            conn.send(body)
            return quiet, conn.answer()[0]

    quiet, status = await anyio.to_thread.run_sync(exchange)
    assert quiet and status == 413


async def test_a_run_cancelled_by_its_client_ends(server: HttpServer) -> None:
    """The SDK client cancels its call (``notifications/cancelled``): the endless run stops, not at its
    120 s timeout, and the session's next result says its state was lost."""
    async with watched_session(server.url, ALICE) as (alice, _):
        session_id = (await call(alice, "open_session"))["session_id"]
        await run(alice, "x = 1", session_id=session_id)
        async with anyio.create_task_group() as group:

            async def endless() -> None:
                with anyio.CancelScope() as scope:
                    holder.append(scope)
                    await alice.call_tool(
                        "run_python", {"code": LOOP, "session_id": session_id, "timeout": 120}
                    )

            holder: list[anyio.CancelScope] = []
            group.start_soon(endless)
            spinning = await _spinning(server)
            holder[0].cancel()
        assert await _gone(spinning), "the cancelled run's process is still running"
        with anyio.fail_after(60):
            after, text, is_error = await run(alice, "print(x)", session_id=session_id)
        await call(alice, "close_session", session_id=session_id)
    assert after["previous_run_cancelled"] and after["state_lost"], after
    assert is_error and after["error"]["type"] == "NameError" and "cancelled" in text


async def test_a_run_whose_client_disconnects_ends(server: HttpServer) -> None:
    """The client drops the HTTP stream of its call mid-run, sending no cancel: the run ends anyway,
    and the session's next result on the same connection says its state was lost."""
    auth = {"Authorization": f"Bearer {ALICE}"}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300)) as client:
        opened = await raw_initialize(client, server.url, ALICE)
        headers = {**ACCEPT, **auth, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
        headers["Mcp-Protocol-Version"] = VERSION
        await client.post(
            server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
        )

        async def tool(request_id: int, name: str, **arguments: Any) -> Any:
            body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
            body["params"] = {"name": name, "arguments": arguments}
            answer = await client.post(server.url, json=body, headers=headers)
            data = next(line for line in answer.text.splitlines() if line.startswith("data: {"))
            return json.loads(data[len("data: ") :])["result"]

        session_id = (await tool(1, "open_session"))["structuredContent"]["session_id"]
        await tool(2, "run_python", code="x = 1", session_id=session_id)
        endless = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {
                "name": "run_python",
                "arguments": {"code": LOOP, "session_id": session_id, "timeout": 120},
            },
        }
        async with client.stream("POST", server.url, json=endless, headers=headers) as streamed:
            assert streamed.status_code == 200
            spinning = await _spinning(server)
        # Leaving the block closed the stream's connection: the client is gone.
        assert await _gone(spinning), "the run went on after its client disconnected"
        with anyio.fail_after(60):
            after = (await tool(4, "run_python", code="print(x)", session_id=session_id))["structuredContent"]
        await tool(5, "close_session", session_id=session_id)
    assert after["previous_run_cancelled"] and after["state_lost"], after
    assert after["error"]["type"] == "NameError"


# ---------------------------------------------------------------------- no OAuth


@pytest.mark.parametrize("token", [None, ALICE])
async def test_oauth_discovery_answers_404(server: HttpServer, token: str | None) -> None:
    """MCP clients probe these before (or after a 401) starting a login: a 404 tells them there is none."""
    root = server.url.rsplit("/", 1)[0]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(timeout=30) as client:
        for path in (
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-authorization-server",
            "/.well-known/oauth-authorization-server/mcp",
            "/.well-known/openid-configuration",
        ):
            answer = await client.get(root + path, headers=headers)
            assert answer.status_code == 404, (path, answer.status_code, answer.text)
            assert "no OAuth" in answer.json()["error"]["message"], path
