"""`print_response`: show an agent's responses in the terminal with rich.

Every value is passed through `neutralize_control` and printed as plain text (rich markup off), so
output that came from a sandbox or a tool cannot recolour, hide or rewrite the terminal.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from .models import AgentResponse, StepRecord
from .text import neutralize_control

_console: Any = None
_line_open = False  # streamed pieces left the cursor mid-line: the next panel starts a new one


def _get_console() -> Any:
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(highlight=False)
    return _console


def _plain(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, indent=2, default=str)
    return "" if value is None else str(value)


def _step_text(step: StepRecord) -> Any:
    from rich.text import Text

    text = Text()
    if step.thought:
        text.append("Thought: ", style="bold cyan")
        text.append(neutralize_control(step.thought) + "\n")
    if step.code:
        text.append("Code:\n", style="bold magenta")
        text.append(neutralize_control(step.code) + "\n", style="magenta")
    for call in step.tool_calls:
        text.append("Action: ", style="bold yellow")
        text.append(
            f"{call.name}({neutralize_control(json.dumps(call.args, ensure_ascii=False, default=str))})\n"
        )
    if step.observation:
        text.append("Observation:\n", style="bold green")
        text.append(neutralize_control(step.observation) + "\n")
    if step.is_final:
        text.append("Answer: ", style="bold blue")
        text.append(neutralize_control(_plain(step.output)))
    elif step.error:
        text.append("Problem: ", style="bold red")
        text.append(neutralize_control(step.error))
    return text


def print_response(response: AgentResponse, only_final: bool = True) -> None:
    """Print an agent's response in the terminal with colours.

    Args:
        response: a response yielded by `Agent.run()`.
        only_final: print only final answers (the default); False prints steps and logs too, and
            the ``token`` and ``output`` pieces of a streaming run inline, as they arrive.
    """
    from rich.panel import Panel
    from rich.text import Text

    global _line_open
    console = _get_console()
    kind = response.type
    if only_final and kind != "final":
        return
    if kind in ("token", "output"):  # pieces as they arrive: written inline, the line left open
        style = "dim" if kind == "token" else ("red" if response.metadata.get("stream") == "stderr" else "")
        text = neutralize_control(str(response.value or ""))
        console.print(Text(text, style=style), end="")
        _line_open = not text.endswith("\n")
        return
    if _line_open:
        console.print()
        _line_open = False
    channel = neutralize_control(response.channel or "")
    if kind == "final":
        ok = response.metadata.get("task_successful", True)
        body = Text(neutralize_control(_plain(response.value)))
        title = f"Final answer ({channel})" if channel else "Final answer"
        console.print(Panel(body, title=title, border_style="green" if ok else "red"))
    elif kind == "step":
        value = response.value
        body = _step_text(value) if isinstance(value, StepRecord) else Text(neutralize_control(_plain(value)))
        index = response.metadata.get("step")
        console.print(Panel(body, title=f"Step {index}" if index else "Step", border_style="cyan"))
    else:
        line = Text()
        line.append(f"[{channel or 'log'}] ", style="dim bold")
        line.append(neutralize_control(_plain(response.value)), style="dim")
        console.print(line)
