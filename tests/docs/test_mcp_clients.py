"""The MCP page's agent-framework snippets (LangChain, LlamaIndex, the OpenAI Agents SDK) run as
written against the real `kodeagent mcp`, their model the loopback LLM stand-in.

The frameworks' MCP adapters need the MCP SDK 1.x and the server needs 2.x, so the snippets run in
their own environment (`.venv-mcp-clients`, made by scripts/install.sh), as a client on a desktop
would: another process, starting the `kodeagent` command, which here is this checkout's.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.llm_standin import StandinLLM, reply
from support.needs import require
from support.snippets import ROOT, marked

VENV_PYTHON = ROOT / ".venv-mcp-clients" / "bin" / "python"
SNIPPETS = marked(ROOT / "docs" / "mcp.md", "snippet")
FRAMEWORKS = ["langchain", "llamaindex", "openai-agents"]
ANSWER = str(2**100)


def clients_missing() -> str | None:
    if not VENV_PYTHON.exists():
        return "the MCP client snippets need their environment: bash scripts/install.sh (.venv-mcp-clients)"
    return None


def kodeagent_command(directory: Path) -> Path:
    """A `kodeagent` on PATH that is this checkout's command, run by this interpreter."""
    command = directory / "kodeagent"
    command.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m kodeagent_cli "$@"\n')
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    return directory


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_framework_snippet_runs_code_through_the_server(framework: str, tmp_path: Path) -> None:
    require(clients_missing(), f"the {framework} MCP snippet")
    bin_dir = kodeagent_command(tmp_path)
    with StandinLLM() as llm:
        # The model asks for one run_python call, then answers with what the sandbox printed.
        llm.add(
            reply(tool_calls=[("run_python", {"code": "print(2**100)"})]), reply(content=f"It is {ANSWER}.")
        )
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTHON"))},
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "OPENAI_API_KEY": "sk-standin",
            "OPENAI_BASE_URL": llm.api_base,
            "OPENAI_API_BASE": llm.api_base,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        done = subprocess.run(
            [str(VENV_PYTHON), "-c", SNIPPETS[framework].code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert llm.remaining == 0
        # The tool's answer the framework sent back: the sandbox ran the code and printed 2**100.
        tool_messages = [m for m in llm.requests[-1]["messages"] if m.get("role") == "tool"]
        assert tool_messages and ANSWER in json.dumps(tool_messages), llm.requests[-1]["messages"]
    assert f"It is {ANSWER}." in done.stdout


def test_every_snippet_on_the_page_is_run() -> None:
    assert set(FRAMEWORKS) <= set(SNIPPETS)
    servers = json.loads(SNIPPETS["mcp-servers"].code)["mcpServers"]
    assert all(entry["command"] == "kodeagent" and entry["args"][0] == "mcp" for entry in servers.values())
