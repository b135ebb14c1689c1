"""`kodeagent mcp` with a network policy (config file and `--allow-egress` / `--deny-egress`), driven by
the MCP SDK's own client over a real stdio subprocess, through the real egress gateway: a run's
connection report in the structured result, the refusal and its rule in the text a model reads,
and a policy this machine cannot hold refused at start with the fix."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from support.loopback_http import GATEWAY_GET, LoopbackHttp
from support.needs import require

mcp = pytest.importorskip(
    "mcp", reason="the MCP server tests need the mcp package: pip install 'kodeagent[mcp]'"
)
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

import kodeagent_cli as cli  # noqa: E402

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
COMMAND = [sys.executable, "-m", "kodeagent_cli", "mcp"]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def service() -> Iterator[LoopbackHttp]:
    from sandboxes.backends.host.process import namespaces_available
    from sandboxes.egress.service import unavailable

    require(unavailable() or (None if namespaces_available() else "no namespaces here"), "the egress gateway")
    with LoopbackHttp() as server:
        yield server


@asynccontextmanager
async def stdio_session(*flags: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable, args=[*COMMAND[1:], *flags], env=ENV, cwd=str(ROOT)
    )
    with open(os.devnull, "w") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def run(session: ClientSession, code: str) -> tuple[dict[str, Any], str]:
    result = await session.call_tool("run_python", {"code": code})
    assert result.structured_content is not None, result
    return result.structured_content, result.content[0].text  # type: ignore[union-attr]


def fetch(port: int) -> str:
    return f"print(gateway_get('127.0.0.1', {port})[0])"


async def test_config_and_flags_rules_reach_the_run_and_its_report(
    service: LoopbackHttp, tmp_path: pathlib.Path
) -> None:
    denied = LoopbackHttp()
    config = tmp_path / "server.toml"
    # the file allows this machine's loopback; the flag denies one port of it (flags add to the file's lists)
    config.write_text('[policy]\nallowed_imports = ["socket"]\n[policy.network]\nallow = ["127.0.0.0/8"]\n')
    try:
        async with stdio_session(
            "--config", str(config), "--deny-egress", f"127.0.0.1:{denied.port}"
        ) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            description = tools["run_python"].description or ""
            assert "127.0.0.0/8" in description and f"never 127.0.0.1:{denied.port}" in description
            assert (await run(session, GATEWAY_GET))[0]["error"] is None
            allowed, text = await run(session, fetch(service.port))
            assert "200 OK" in allowed["stdout"]
            assert [(c["port"], c["allowed"], c["rule"]) for c in allowed["network"]["connections"]] == [
                (service.port, True, "allow '127.0.0.0/8'")
            ]
            refused, text = await run(session, fetch(denied.port))
    finally:
        denied.close()
    assert "403 Forbidden" in refused["stdout"]
    (connection,) = refused["network"]["connections"]
    assert (connection["allowed"], connection["rule"]) == (False, f"deny '127.0.0.1:{denied.port}'")
    assert (
        f"[network: 127.0.0.1:{denied.port} refused by deny '127.0.0.1:{denied.port}'" in text
    )  # the model reads it
    assert service.paths == ["/"] and denied.paths == []


async def test_network_on_keeps_this_machine_shut(service: LoopbackHttp) -> None:
    async with stdio_session("--allow-import", "socket", "--network") as session:
        await run(session, GATEWAY_GET)
        result, text = await run(session, fetch(service.port))
    assert "403 Forbidden" in result["stdout"]
    assert result["network"]["connections"][0]["rule"] == "loopback"
    assert "refused by loopback" in text
    assert service.paths == []


def start(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *flags], input="", capture_output=True, text=True, timeout=60, env=ENV, cwd=str(ROOT)
    )


def test_a_bad_rule_in_the_config_file_is_refused_at_start_naming_the_field(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "server.json"
    config.write_text(json.dumps({"policy": {"network": {"allow": ["pypi.org", "not a rule!"]}}}))
    done = start("--config", str(config))
    assert done.returncode == cli.EXIT_USAGE
    assert "policy.network" in done.stderr and "'not a rule!'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_policy_this_machine_cannot_hold_is_refused_at_start_with_the_fix() -> None:
    done = start("--allow-egress", "pypi.org", "-o", "isolation=process")
    assert done.returncode == cli.EXIT_USAGE
    assert "policy.network" in done.stderr and "isolation=process" in done.stderr
    assert "serving MCP" not in done.stderr  # it never started
