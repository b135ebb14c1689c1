"""The pure parts of agent streaming: the option, the response kinds, and how they print."""

from __future__ import annotations

import io

import pytest

from kodeagent import AgentResponse, CodeActAgent, ReActAgent, StepRecord, printing
from kodeagent.errors import ConfigurationError


def test_stream_is_an_agent_option_off_by_default() -> None:
    assert ReActAgent("openai/x").stream is False
    assert CodeActAgent("openai/x", stream=True).stream is True
    assert CodeActAgent("openai/x", stream=True).clone().stream is True


def test_litellm_stream_param_points_to_the_option() -> None:
    with pytest.raises(ConfigurationError, match=r"stream=True"):
        ReActAgent("openai/x", litellm_params={"stream": True})


@pytest.mark.parametrize("kind", ["token", "output"])
def test_new_kinds_are_responses(kind: str) -> None:
    response = AgentResponse(type=kind, value="piece", metadata={"step": 1})  # type: ignore[arg-type]
    assert AgentResponse.model_validate(response.model_dump(mode="json")) == response


def test_pieces_print_inline_and_the_next_panel_starts_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    out = io.StringIO()
    monkeypatch.setattr(printing, "_console", Console(file=out, width=120, color_system=None))
    monkeypatch.setattr(printing, "_line_open", False)
    for piece in ('{"thought": ', '"hi"}'):
        printing.print_response(AgentResponse(type="token", value=piece), only_final=False)
    printing.print_response(
        AgentResponse(type="output", value="out\x1b[2J", metadata={"stream": "stdout"}), only_final=False
    )
    printing.print_response(
        AgentResponse(type="step", value=StepRecord(index=1, thought="t"), metadata={"step": 1}),
        only_final=False,
    )
    text = out.getvalue()
    first, rest = text.split("\n", 1)
    assert first.startswith('{"thought": "hi"}out')  # inline, in order, nothing between pieces
    assert "\x1b" not in first  # what the sandbox printed cannot drive the terminal
    assert "Step 1" in rest.splitlines()[0]  # the panel opens on its own line
    # only_final (the default) shows no pieces
    out.truncate(0)
    out.seek(0)
    printing.print_response(AgentResponse(type="token", value="x"))
    assert out.getvalue() == ""
