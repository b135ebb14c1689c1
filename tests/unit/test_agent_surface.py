"""Agents made and read without a model call: configuration errors, the tool descriptions prompts
show, observations and their cuts, printed responses, vision and tracing checks."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from kodeagent import (
    Agent,
    AgentResponse,
    CodeActAgent,
    ConfigurationError,
    ReActAgent,
    StepRecord,
    TracingUnavailable,
    format_observation,
    print_response,
    tool,
)


@tool
def get_price(symbol: str) -> float:
    """Latest price of a stock. Args: symbol: ticker, e.g. AAPL."""
    return {"AAPL": 200.0, "MSFT": 410.5}[symbol]


# ---------------------------------------------------------------------- configuration


def test_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="run_env"):
        CodeActAgent("openai/x", run_env="moon")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="E2B"):
        CodeActAgent("openai/x", run_env="host", pip_packages="numpy")
    with pytest.raises(ConfigurationError, match="timeout"):
        CodeActAgent("openai/x", timeout=0)


def test_observation_formatting_caps_head_and_tail() -> None:
    from sandboxes import ExecutionResult

    long = "".join(f"line {i}\n" for i in range(5000))
    text = format_observation(ExecutionResult(stdout=long), limit=1000)
    assert "line 0" in text and "line 4999" in text and "characters omitted" in text
    assert len(text) < 1300
    lost = format_observation(ExecutionResult(stdout="hi\n", state_lost=True))
    assert lost.startswith("Notice: the Python session was restarted")
    from sandboxes import ExecutionError

    crashed = format_observation(
        ExecutionResult(
            state_lost=True, oom=True, error=ExecutionError(type="WorkerCrashed", message="killed")
        )
    )
    assert "ran out of memory" in crashed and "lost" in crashed and "Notice" not in crashed
    final = format_observation(ExecutionResult(has_final_answer=True, final_answer=1))
    assert final == "final_answer() was called."


def test_structured_output_must_be_a_known_choice() -> None:
    with pytest.raises(ConfigurationError, match="structured_output"):
        ReActAgent("openai/x", structured_output="yaml")  # type: ignore[arg-type]


def test_stream_true_is_a_clear_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="stream"):
        CodeActAgent("openai/x", litellm_params={"stream": True})


def test_pydantic_model_arguments_show_their_fields_in_prompts() -> None:
    class Order(BaseModel):
        item: str = Field(description="what to buy")
        quantity: int = 1

    @tool
    def place_order(order: Order) -> str:
        """Place an order. Args: order: the order to place."""
        return "ok"

    for agent in (CodeActAgent("openai/x", tools=[place_order]), ReActAgent("openai/x", tools=[place_order])):
        text = agent.get_tools_description()
        assert "* item (string, required): what to buy" in text
        assert "* quantity (integer, optional, default 1)" in text
    assert (
        "place_order(order: dict) -> str"
        in CodeActAgent("openai/x", tools=[place_order]).get_tools_description()
    )


def test_cut_stream_adds_the_sandbox_count_to_its_own() -> None:
    from kodeagent.codeact import cut_stream

    sandbox_kept = "h" * 600 + "\n... [5,000 characters omitted] ...\n" + "t" * 600
    text = cut_stream(sandbox_kept, 5000, 300)
    assert text == "h" * 200 + "\n... [5,900 characters omitted] ...\n" + "t" * 100
    assert cut_stream(sandbox_kept, 5000, 2000) == sandbox_kept  # within budget: the sandbox's marker stands
    assert cut_stream("x" * 50, 0, 100) == "x" * 50


# ---------------------------------------------------------------------- what the model and the user are shown


def test_tools_description_and_purpose() -> None:
    agent = ReActAgent("openai/x", name="pricer", description="Finds prices.", tools=[get_price])
    assert "symbol (string, required)" in agent.get_tools_description()
    assert "pricer" in agent.purpose and "Finds prices." in agent.purpose and "get_price" in agent.purpose
    assert "tool_name_to_func" in dir(agent) and agent.tool_name_to_func["get_price"] is get_price


@pytest.mark.parametrize("kind", ["langfuse", "langsmith"])
def test_tracing_needs_its_package(kind: str) -> None:
    import importlib.util

    if importlib.util.find_spec(kind) is not None:
        pytest.skip(f"{kind} is installed here, so its absence cannot be tested")
    with pytest.raises(TracingUnavailable, match=f"pip install {kind}"):
        ReActAgent("openai/x", tracing_type=kind)  # type: ignore[arg-type]
    with pytest.raises(TracingUnavailable, match="unknown tracing_type"):
        ReActAgent("openai/x", tracing_type="zipkin")  # type: ignore[arg-type]


def test_print_response_neutralises_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    print_response(AgentResponse(type="step", value="hidden"), only_final=True)
    assert capsys.readouterr().out == ""
    print_response(AgentResponse(type="final", value="ok \x1b[31mred\x1b[0m\rover\x07"), only_final=True)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "red" in out and "over" in out and "\\x07" in out
    step = StepRecord(index=1, thought="t", code="print(1)", observation="Output:\n1")
    print_response(AgentResponse(type="step", value=step, metadata={"step": 1}), only_final=False)
    assert "print(1)" in capsys.readouterr().out


def test_normalize_content() -> None:
    assert Agent.normalize_content(None) == ""
    assert Agent.normalize_content("x") == "x"
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:"}}]
    assert Agent.normalize_content(parts) == "look\n[image_url]"
    assert Agent.normalize_content({"a": 1}) == '{"a": 1}'
