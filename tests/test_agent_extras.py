"""The wider surface: MCP tools inside both agents, plan revision, images (the Observer's rules on
their own: `tests/unit/test_observer.py`)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest
from support.llm_standin import (
    StandinLLM,
    code_final,
    code_step,
    collect,
    react_call,
    react_finish,
    reply,
)

from kodeagent import CodeActAgent, Observer, ReActAgent, mcp_stdio_tools

pytestmark = pytest.mark.anyio
MCP_SERVER = str(Path(__file__).parent / "support" / "mcp_demo_server.py")


# ---------------------------------------------------------------------- MCP tools in agents


async def test_react_agent_uses_an_mcp_tool(llm: StandinLLM) -> None:
    llm.add(react_call("add", {"a": 20, "b": 22}), react_finish("42"))
    async with mcp_stdio_tools(sys.executable, [MCP_SERVER]) as tools:
        agent = ReActAgent(llm.model("json"), litellm_params=llm.params(), tools=tools, allowed_tools=["add"])
        responses = await collect(agent.run("20 + 22?"))
    assert responses[-1].value == "42"
    assert llm.requests[1]["messages"][-1]["content"] == "Observation: 42"
    system = llm.requests[0]["messages"][0]["content"]
    assert "add" in system and "shout" not in system


async def test_codeact_code_calls_an_mcp_tool(llm: StandinLLM) -> None:
    llm.add(code_step("print(shout(text='quiet') + '!' * add(a=1, b=2))"), code_final("QUIET!!!"))
    async with mcp_stdio_tools(sys.executable, [MCP_SERVER]) as tools:
        agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), tools=tools)
        responses = await collect(agent.run("Shout"))
    assert responses[-1].value == "QUIET!!!"
    assert llm.requests[1]["messages"][-1]["content"] == "Observation:\nOutput:\nQUIET!!!"


# ---------------------------------------------------------------------- planning


async def test_plan_is_revised_as_steps_go(llm: StandinLLM) -> None:
    llm.add(
        reply("1. [ ] first\n2. [ ] second"),
        code_step("print('one')"),
        code_step("print('two')"),
        reply("1. [x] first\n2. [x] second"),
        code_final("done"),
    )
    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), use_planner=True)
    assert agent.planner is not None
    agent.planner.update_every = 2
    responses = await collect(agent.run("Two things"))
    plans = [r.value for r in responses if r.channel == "planner"]
    assert plans == ["1. [ ] first\n2. [ ] second", "1. [x] first\n2. [x] second"]
    assert agent.current_plan == "1. [x] first\n2. [x] second"
    update_request = llm.requests[3]["messages"]
    assert update_request[0]["role"] == "system" and "plan" in update_request[0]["content"].lower()
    assert "one" in update_request[1]["content"] and "two" in update_request[1]["content"]
    # the revised plan reached the agent as a message, after the second step's observation
    assert "[x] second" in llm.requests[4]["messages"][-1]["content"]
    assert agent.get_usage_metrics()["by_component"]["planner"]["calls"] == 2


# ---------------------------------------------------------------------- images and content


async def test_images_are_attached_for_vision_models(llm: StandinLLM, tmp_path: Path) -> None:
    image = tmp_path / "dot.png"
    image.write_bytes(
        base64.b64decode(
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
        )
    )
    llm.add(reply("A single dot."), react_finish("no image here"))  # native, then JSON mode
    agent = ReActAgent(llm.model("native"), litellm_params=llm.params())
    assert agent.is_visual_model
    await collect(agent.run("What is in the image?", files=[str(image)]))
    content = llm.requests[0]["messages"][1]["content"]
    assert isinstance(content, list)
    assert content[0]["type"] == "text" and "dot.png" in content[0]["text"]
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")

    plain = ReActAgent(llm.model("plain"), litellm_params=llm.params())
    await collect(plain.run("What is in the image?", files=[str(image)]))
    assert isinstance(llm.requests[1]["messages"][1]["content"], str)


async def test_observer_with_a_model_gives_advice(llm: StandinLLM) -> None:
    bad = code_step("print(undefined_name)")
    llm.add(bad, bad, bad, reply("Define the variable first.", usage=(30, 5)), code_final("gave up", False))
    agent = CodeActAgent(
        llm.model("json"), litellm_params=llm.params(), observer=Observer(model_name=llm.model("plain"))
    )
    responses = await collect(agent.run("Print it"))
    [note] = [r.value for r in responses if r.channel == "observer"]
    assert "failed 3 times" in note and "Define the variable first." in note
    assert llm.requests[3]["model"] == "standin-plain"  # the observer's own model
    assert "undefined_name" in llm.requests[3]["messages"][0]["content"]
    assert agent.get_usage_metrics()["by_component"]["observer"]["prompt_tokens"] == 30
    assert "Define the variable first." in llm.requests[4]["messages"][-1]["content"]


def test_importing_kodeagent_is_cheap() -> None:
    import subprocess

    code = (
        "import sys, kodeagent\n"
        "heavy = [m for m in ('litellm', 'mcp', 'rich', 'sandboxes') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


async def test_a_blocking_sync_tool_cannot_outlast_the_timeout(llm: StandinLLM) -> None:
    import time

    from kodeagent import tool

    @tool
    def stuck() -> str:
        """Blocks its thread for a while, as a slow network call would."""
        time.sleep(6)
        return "late"

    llm.add(code_step("print(stuck())"), code_final("gave up on the slow tool", successful=False))
    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), tools=[stuck], timeout=2)
    responses = await collect(agent.run("Call the slow tool"))
    assert "ran past the time limit of 2 s" in llm.requests[1]["messages"][-1]["content"]
    assert responses[-1].metadata["task_successful"] is False


async def test_tool_output_is_neutralised_for_react(llm: StandinLLM) -> None:
    from kodeagent import tool

    @tool
    def noisy() -> str:
        """Returns text with terminal escapes."""
        return "\x1b[2Jcleared\rrewritten\x1b]8;;http://x\x07link"

    llm.add(react_call("noisy"), react_finish("ok"))
    await collect(ReActAgent(llm.model("json"), litellm_params=llm.params(), tools=[noisy]).run("noise"))
    told = llm.requests[1]["messages"][-1]["content"]
    assert "\x1b" not in told and "\r" not in told and "\x07" not in told
    assert "cleared\nrewritten" in told


async def test_an_agent_as_a_tool_of_another(llm: StandinLLM) -> None:
    helper = CodeActAgent(
        llm.model("json"),
        litellm_params=llm.params(),
        name="calculator",
        description="Computes arithmetic with Python.",
    )
    boss = ReActAgent(llm.model("json"), litellm_params=llm.params(), tools=[helper.as_tool()])
    llm.add(
        react_call("calculator", {"task": "2**10"}),  # the boss delegates
        code_step("print(2**10)"),  # the helper computes
        code_final("1024"),
        react_finish("2**10 is 1024"),
    )
    responses = await collect(boss.run("What is 2**10?"))
    assert responses[-1].value == "2**10 is 1024"
    assert "Computes arithmetic with Python." in llm.requests[0]["messages"][0]["content"]
    assert llm.requests[3]["messages"][-1]["content"] == "Observation: 1024"
