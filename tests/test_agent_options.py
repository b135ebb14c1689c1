"""Agent options are declared once (`AgentOptions`), and the two agents are siblings under `Agent`."""

from __future__ import annotations

import inspect

import pytest

from kodeagent import Agent, CodeActAgent, ReActAgent
from kodeagent.options import AGENT_DEFAULTS, AGENT_OPTIONS


def test_every_option_has_one_default() -> None:
    assert set(AGENT_DEFAULTS) == AGENT_OPTIONS


@pytest.mark.parametrize("cls", [ReActAgent, CodeActAgent])
def test_every_option_is_taken_with_its_default(cls: type[Agent]) -> None:
    agent = cls("openai/x")
    assert agent.max_iterations == 20 and agent.max_retries == 3
    assert agent.tool_calling == "auto" and agent.structured_output == "auto"
    assert agent.allowed_tools is None and agent.planner is None and agent.tools == []
    configured = cls(
        "openai/x", name="n", description="d", persona="p", max_iterations=5, max_retries=0,
        planning_interval=2, tool_calling="text", structured_output="off", allowed_tools=["a*"],
    )  # fmt: skip
    assert (configured.name, configured.description, configured.persona) == ("n", "d", "p")
    assert configured.max_iterations == 5 and configured.max_retries == 0
    assert configured.planner is not None and configured.planner.update_every == 2
    assert configured.tool_calling == "text" and configured.structured_output == "off"
    assert configured.allowed_tools == ["a*"]


@pytest.mark.parametrize("cls", [ReActAgent, CodeActAgent])
def test_an_unknown_option_is_a_type_error_naming_it(cls: type[Agent]) -> None:
    with pytest.raises(TypeError, match=r"'max_iteration' \(did you mean 'max_iterations'\?\)"):
        cls("openai/x", max_iteration=3)  # type: ignore[call-arg]


def test_codeact_options_stay_its_own() -> None:
    agent = CodeActAgent("openai/x", run_env="host", timeout=7, allowed_imports=["math"], max_iterations=4)
    assert agent.timeout == 7 and agent.allowed_imports == ["math"] and agent.max_iterations == 4
    with pytest.raises(TypeError, match="run_env"):
        ReActAgent("openai/x", run_env="host")  # type: ignore[call-arg]
    assert "run_env" in inspect.signature(CodeActAgent).parameters


def test_the_agents_are_siblings() -> None:
    assert issubclass(ReActAgent, Agent) and issubclass(CodeActAgent, Agent)
    assert not issubclass(CodeActAgent, ReActAgent)
    for react_only in ("execute_tool_calls", "_tool_observation", "_resolve_input_args", "TOOL_OUTPUT_LIMIT"):
        assert hasattr(ReActAgent, react_only) and not hasattr(CodeActAgent, react_only), react_only
    for shared in ("run", "arun", "run_sync", "clone", "_request_step", "format_candidates", "_finish"):
        assert getattr(CodeActAgent, shared) is getattr(Agent, shared), shared


@pytest.mark.anyio
async def test_codeact_refuses_inputs_that_would_hide_a_tool_or_builtin() -> None:
    def lookup(key: str) -> str:
        """Look a key up. Args: key: the key."""
        return key

    agent = CodeActAgent(model_name="openai/never-called", run_env="host", tools=[lookup])
    for name in ("final_answer", "print", "lookup"):
        with pytest.raises(ValueError, match=f"inputs \\['{name}'\\] would hide"):
            await agent.arun("t", inputs={name: 1})
