"""The MCP server's pure parts: its settings (file, flags), bearer tokens, and the HTTP guard's decisions
(driven as the ASGI app it is, without a network)."""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import MutableMapping
from typing import Any

import anyio
import pytest
from support.snippets import ROOT, marked

from kodeagent_cli import build_parser
from kodeagent_cli.common import CommandError
from kodeagent_cli.mcp import parse_address, settings_from_flags
from sandboxes import DEFAULT_ALLOWED_IMPORTS
from sandboxes.adapters.mcp import McpConfigError, ServerConfig, load_config, make_config, with_tokens
from sandboxes.adapters.mcp.auth import SINGLE_HEADERS, TENANT_KEY, Connections, HttpGuard, TokenTable
from sandboxes.adapters.mcp.config import TokenConfig, load_tool

TOKEN = "t" * 20


def test_defaults_are_safe() -> None:
    config = ServerConfig()
    assert config.backend == "host" and config.http.host == "127.0.0.1"
    assert config.policy.network is False and config.http.tokens == ()
    assert config.max_sessions_per_token <= config.max_sessions
    assert config.http.max_connections_per_token <= config.http.max_connections // 4
    assert 60 <= config.http.connection_idle_timeout <= 600  # minutes, not the SDK's half hour


def test_tokens_tools_and_limits_are_validated() -> None:
    config = make_config(
        {
            "http": {"tokens": [TOKEN, {"name": "bob", "token": "b" * 20}]},
            "tools": ["support.mcp_tool_functions:double", "pkg.mod:Class.method"],
        }
    )
    assert [t.name for t in config.http.tokens] == ["token-1", "bob"]
    assert config.tools == {"double": "support.mcp_tool_functions:double", "method": "pkg.mod:Class.method"}
    assert TOKEN not in repr(config.http.tokens[0])  # a token is never shown
    cases: list[tuple[dict[str, Any], str]] = [
        ({"http": {"tokens": ["short"]}}, "http.tokens.0.token"),
        ({"http": {"tokens": [TOKEN, TOKEN]}}, "same token is listed twice"),
        ({"http": {"tokens": ["has space " + TOKEN]}}, "without spaces"),
        ({"tools": {"f": "no_colon"}}, "not an import path"),
        ({"tools": {"_private": "m:f"}}, "Python identifier"),
        ({"timeout": 400}, "above max_timeout"),
        ({"max_sessions": 2, "max_sessions_per_token": 3}, "max_sessions_per_token is above"),
        (
            {"http": {"max_connections": 2, "max_connections_per_token": 3}},
            "max_connections_per_token is above",
        ),
        ({"http": {"connection_idle_timeout": 0}}, "http.connection_idle_timeout"),
        ({"backend": "nowhere"}, "backend"),
        ({"policy": {"allowed_imports": "os"}}, "not a single string"),
        ({"unknown_key": 1}, "unknown_key: Extra inputs are not permitted"),
    ]
    for bad, words in cases:
        with pytest.raises(McpConfigError, match=words):
            make_config(bad)


def test_config_files_json_and_toml(tmp_path: pathlib.Path) -> None:
    toml = tmp_path / "mcp.toml"
    toml.write_text(
        'backend = "host"\ntimeout = 5\n[policy]\nallowed_imports = ["math"]\nnetwork = false\n'
        '[policy.limits]\nmemory_mb = 512\n[tools]\ndouble = "support.mcp_tool_functions:double"\n'
        '[[http.tokens]]\nname = "alice"\ntoken = "' + TOKEN + '"\n'
    )
    config = load_config(toml)
    assert config.timeout == 5 and config.policy.allowed_imports == ("math",)
    assert config.policy.limits.memory_mb == 512 and config.http.tokens[0].name == "alice"
    as_json = tmp_path / "mcp.json"
    as_json.write_text(json.dumps({"max_sessions": 4, "max_sessions_per_token": 2}))
    assert load_config(as_json, timeout=7).timeout == 7
    broken = tmp_path / "broken.toml"
    broken.write_text("timeout = ")
    with pytest.raises(McpConfigError, match="broken.toml' is not valid TOML"):
        load_config(broken)
    with pytest.raises(McpConfigError, match="ends in .json or .toml"):
        load_config(tmp_path / "x.yaml")
    with pytest.raises(McpConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_tool_functions_import_or_say_why() -> None:
    assert load_tool("double", "support.mcp_tool_functions:double")(4) == 8
    with pytest.raises(McpConfigError, match="cannot import 'no_such_module_here'"):
        load_tool("f", "no_such_module_here:f")
    with pytest.raises(McpConfigError, match="has no attribute 'missing'"):
        load_tool("f", "support.mcp_tool_functions:missing")
    with pytest.raises(McpConfigError, match="not callable"):
        load_tool("f", "support.mcp_tool_functions:__doc__")


def _flags(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["mcp", *argv])


def test_flags_override_the_config_file() -> None:
    base = {
        "timeout": 10,
        "policy": {"allowed_imports": ["math"], "limits": {"cpu_seconds": 9}},
        "tools": {"a": "m:a"},
        "http": {"port": 9000},
    }
    settings = settings_from_flags(
        _flags(
            "--timeout",
            "3",
            "--allow-import",
            "numpy.*,json",
            "--limit",
            "memory_mb=256",
            "--tool",
            "b=m:b",
            "--tool",
            "pkg.mod:c",
            "--http",
            "0.0.0.0:8000",
            "-o",
            "isolation=process",
        ),
        base,
    )
    config = make_config(settings)
    assert config.timeout == 3 and config.policy.allowed_imports == ("math", "numpy.*", "json")
    assert config.policy.limits.memory_mb == 256 and config.policy.limits.cpu_seconds == 9
    assert config.tools == {"a": "m:a", "b": "m:b", "c": "pkg.mod:c"}
    assert (config.http.host, config.http.port) == ("0.0.0.0", 8000)
    assert config.backend_options == {"isolation": "process"}
    defaults = make_config(settings_from_flags(_flags("--allow-import", "numpy"), {}))
    assert defaults.policy.allowed_imports == (*DEFAULT_ALLOWED_IMPORTS, "numpy")
    only = make_config(settings_from_flags(_flags("--only-imports", "--allow-import", "math"), {}))
    assert only.policy.allowed_imports == ("math",)
    assert make_config(settings_from_flags(_flags("--http"), base)).http.port == 9000  # the file's address


def test_http_address_forms() -> None:
    assert parse_address("8765") == ("127.0.0.1", 8765)
    assert parse_address("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address(":5") == ("127.0.0.1", 5)
    for bad in ("host:", "host:port", "70000"):
        with pytest.raises(CommandError, match="give \\[HOST:\\]PORT"):
            parse_address(bad)


def test_token_from_the_environment_or_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KODEAGENT_MCP_TOKEN", raising=False)
    config, generated = with_tokens(ServerConfig())
    assert generated is not None and len(generated) >= 40
    assert config.http.tokens[0].token == generated
    assert with_tokens(ServerConfig())[1] != generated  # a new one each time
    monkeypatch.setenv("KODEAGENT_MCP_TOKEN", TOKEN)
    config, generated = with_tokens(ServerConfig())
    assert generated is None and config.http.tokens[0].token == TOKEN
    monkeypatch.setenv("KODEAGENT_MCP_TOKEN", "short")
    with pytest.raises(McpConfigError, match="KODEAGENT_MCP_TOKEN"):
        with_tokens(ServerConfig())
    own = make_config({"http": {"tokens": ["o" * 20]}})
    assert with_tokens(own) == (own, None)  # the config's own tokens win


def test_token_table() -> None:
    table = TokenTable([TokenConfig(name="alice", token=TOKEN), TokenConfig(name="bob", token="b" * 20)])
    assert table.tenant_for_header("Bearer " + TOKEN) == "alice"
    assert table.tenant_for_header("bearer  " + "b" * 20 + " ") == "bob"
    for wrong in (None, "", "Bearer", "Bearer ", "Basic " + TOKEN, "Bearer " + TOKEN[:-1], TOKEN, "Bearer é"):
        assert table.tenant_for_header(wrong) is None, wrong
    with pytest.raises(ValueError):
        TokenTable([])


# ---------------------------------------------------------------------- the guard, as an ASGI app


async def _call(guard: HttpGuard, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, Any, list[Any]]:
    """One HTTP request through the guard: (status, JSON body, what the inner app received)."""
    status, body, _ = await _raw(guard, [(k.lower(), v) for k, v in headers.items()], chunks)
    return status, body, inner_calls


inner_calls: list[Any] = []


async def _inner(scope: Any, receive: Any, send: Any) -> None:
    message = await receive()
    inner_calls.append((scope.get(TENANT_KEY), message["body"]))
    body = json.dumps({"ok": True}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def _guard() -> HttpGuard:
    tokens = TokenTable([TokenConfig(name="alice", token=TOKEN)])
    return HttpGuard(
        _inner,
        tokens,
        max_body=1000,
        allowed_hosts=["mcp.internal:*"],
        allowed_origins=["https://app.example"],
    )


def test_the_guard_lets_in_only_what_it_should() -> None:
    async def main() -> None:
        guard, auth = _guard(), {"Authorization": "Bearer " + TOKEN}
        inner_calls.clear()
        cases: list[tuple[dict[str, str], list[bytes], int, str]] = [
            ({"Host": "127.0.0.1:9", **auth}, [b"{}"], 200, ""),
            ({"Host": "localhost:9", **auth}, [b"{}"], 200, ""),
            ({"Host": "[::1]:9", **auth}, [b"{}"], 200, ""),
            ({"Host": "10.1.2.3:9", **auth}, [b"{}"], 200, ""),  # an IP literal cannot be rebound
            ({"Host": "mcp.internal:443", **auth}, [b"{}"], 200, ""),
            ({"Host": "127.0.0.1:9", "Origin": "http://localhost:6274", **auth}, [b"{}"], 200, ""),
            ({"Host": "127.0.0.1:9", "Origin": "https://app.example", **auth}, [b"{}"], 200, ""),
            ({"Host": "attacker.example:9", **auth}, [b"{}"], 421, "DNS rebinding"),
            ({**auth}, [b"{}"], 421, "Host ''"),
            ({"Host": "127.0.0.1:9", "Origin": "http://attacker.example", **auth}, [b"{}"], 403, "attacker"),
            ({"Host": "127.0.0.1:9", "Origin": "null", **auth}, [b"{}"], 403, "Origin 'null'"),
            ({"Host": "127.0.0.1:9"}, [b"{}"], 401, "needs a bearer token"),
            ({"Host": "127.0.0.1:9", "Authorization": "Bearer nope"}, [b"{}"], 401, "not valid"),
            ({"Host": "127.0.0.1:9", "Content-Length": "1001", **auth}, [b"x" * 1001], 413, "1,001 bytes"),
            ({"Host": "127.0.0.1:9", **auth}, [b"x" * 600, b"y" * 600], 413, "at most 1,000 bytes"),
        ]
        for headers, chunks, want, words in cases:
            status, body, _ = await _call(guard, headers, chunks)
            assert status == want, (headers, body)
            if want != 200:
                assert body["jsonrpc"] == "2.0" and body["id"] is None and words in body["error"]["message"]
        assert len(inner_calls) == 7 and all(call == ("alice", b"{}") for call in inner_calls)
        inner_calls.clear()
        status, _, _ = await _call(guard, {"Host": "127.0.0.1:9", **auth}, [b"a" * 500, b"b" * 500])
        assert status == 200 and inner_calls == [("alice", b"a" * 500 + b"b" * 500)]  # the body arrives whole

    anyio.run(main)


async def _raw(
    guard: HttpGuard,
    headers: list[tuple[str, str]],
    body: bytes | list[bytes] = b"{}",
    method: str = "POST",
    path: str = "/mcp",
) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
    """One request through the guard, its headers a list (repeats kept), its body whole or in chunks:
    (status, JSON body, response headers)."""
    sent: list[MutableMapping[str, Any]] = []
    chunks = [body] if isinstance(body, bytes) else body
    incoming = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in headers],
    }
    await guard(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(payload), start.get("headers", [])


def test_a_repeated_header_is_refused_before_the_app() -> None:
    async def main() -> None:
        guard = _guard()
        inner_calls.clear()
        single = [
            ("host", "127.0.0.1:9"),
            ("authorization", "Bearer " + TOKEN),
            ("content-type", "application/json"),
        ]
        for name in SINGLE_HEADERS:
            for spelling in (name, name.title()):  # names are case-insensitive: the server lower-cases
                value = dict(single).get(name, "x")
                status, body, _ = await _raw(guard, [*single, (spelling.lower(), value), (name, value)])
                assert status == 400, (name, body)
                assert f"repeats the header {name!r}" in body["error"]["message"]
        assert inner_calls == []  # not one reached the app
        assert (await _raw(guard, [*single, ("x-other", "1"), ("x-other", "2")]))[0] == 200

    anyio.run(main)


def test_oauth_discovery_answers_404_with_a_json_body() -> None:
    async def main() -> None:
        guard = _guard()
        for path in (
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-authorization-server",
            "/.well-known/oauth-authorization-server/mcp",
            "/.well-known/openid-configuration",
        ):
            for auth in ([], [("authorization", "Bearer " + TOKEN)]):
                status, body, _ = await _raw(guard, [("host", "127.0.0.1:9"), *auth], method="GET", path=path)
                assert status == 404 and "no OAuth" in body["error"]["message"], (path, auth)

    anyio.run(main)


class Minting:
    """An MCP app stand-in: a request without Mcp-Session-Id opens a transport (a fresh id in the
    answer); a request with one is served whatever it is, so only the guard keeps tenants apart."""

    def __init__(self) -> None:
        self.served: list[str | None] = []
        self.minted = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        transport = dict(scope["headers"]).get(b"mcp-session-id")
        self.served.append(transport and transport.decode())
        headers = []
        if transport is None:
            self.minted += 1
            headers = [(b"mcp-session-id", f"transport-{self.minted}".encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


def test_connections_stay_bound_while_they_live_and_are_capped_per_token() -> None:
    now = [0.0]
    app = Minting()
    tokens = TokenTable([TokenConfig(name="alice", token=TOKEN), TokenConfig(name="bob", token="b" * 20)])
    guard = HttpGuard(
        app, tokens, max_body=1000, connections=Connections(3, 2, idle_timeout=60, clock=lambda: now[0])
    )
    alice = [("host", "127.0.0.1:9"), ("authorization", "Bearer " + TOKEN)]
    bob = [("host", "127.0.0.1:9"), ("authorization", "Bearer " + "b" * 20)]

    async def open_(who: list[tuple[str, str]]) -> tuple[int, str]:
        status, body, headers = await _raw(guard, who)
        minted = dict(headers).get(b"mcp-session-id", b"").decode()
        return status, minted or body["error"]["message"]

    async def use(who: list[tuple[str, str]], transport: str, method: str = "POST") -> int:
        return (await _raw(guard, [*who, ("mcp-session-id", transport)], method=method))[0]

    async def main() -> None:
        first, second = (await open_(alice))[1], (await open_(alice))[1]
        status, message = await open_(alice)
        assert status == 429 and "max_connections_per_token" in message
        assert (await open_(bob))[0] == 200
        status, message = await open_(bob)  # the server's table is full: refused, nothing evicted
        assert status == 503 and "http.max_connections" in message
        assert await use(bob, first) == 404 and await use(alice, first) == 200  # the oldest still bound
        assert await use(alice, "transport-999") == 404  # an id the guard never bound is not passed on
        assert "transport-999" not in app.served and app.served.count(first) == 1
        now[0] = 59.0
        assert await use(alice, second) == 200 and (await open_(bob))[0] == 503  # used: not idle
        now[0] = 61.0  # first idle a minute: it ended (the SDK ends its side after the same time)
        assert await use(alice, first) == 404
        assert (await open_(bob))[0] == 200
        assert await use(alice, second, method="DELETE") == 200  # deleted: forgotten, the slot is free
        assert await use(alice, second) == 404 and (await open_(alice))[0] == 200

    anyio.run(main)


def test_the_mcp_pages_examples_are_valid(tmp_path: pathlib.Path) -> None:
    page = marked(ROOT / "docs" / "mcp.md", "snippet")
    servers = json.loads(page["mcp-servers"].code)["mcpServers"]
    entries = [entry for entry in servers.values() if entry["command"] == "kodeagent"]
    assert entries  # the page shows an MCP client starting `kodeagent mcp`
    for entry in entries:
        make_config(settings_from_flags(build_parser().parse_args(entry["args"]), {}))
    (tmp_path / "mcp-0.toml").write_text(page["mcp-config"].code)
    config = load_config(tmp_path / "mcp-0.toml")
    assert config.tools == {"lookup": "mytools:lookup"} and config.http.tokens[0].name == "alice"
