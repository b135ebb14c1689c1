"""The options every agent takes, declared once with their defaults (each agent adds its own beside them).

`Agent`, `ReActAgent` and `CodeActAgent` take ``**options: Unpack[AgentOptions]``, so type checkers see
every option with its type, and an option no agent knows is a `TypeError` naming it. The defaults live
in `AGENT_DEFAULTS`, the one place they are written.
"""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Literal, TypedDict

from .models import StepRecord
from .observer import Observer
from .tools import Tool
from .tracing import TracingType

OnStep = Callable[[StepRecord], Any] | Callable[[StepRecord], Awaitable[Any]]
ToolCallingMode = Literal["auto", "native", "json", "text"]
StructuredOutput = Literal["auto", "json_schema", "json_object", "off"]
Mode = Literal["native", "json", "text"]
"""How one run's replies are requested: native tool calls, a JSON response format, or free text."""


class AgentOptions(TypedDict, total=False):
    """The options of every agent (defaults in `AGENT_DEFAULTS`).

    name, description: how the agent presents itself (see `Agent.purpose`). Default None.
    tools: `Tool`s or plain functions (described from their signatures and docstrings). Default none.
    litellm_params: passed to every litellm call (api_base, api_key, temperature, timeout, ...).
    persona: a line about who the agent is, put into the system prompt.
    system_prompt: a replacement template (``{persona}``, ``{tools}`` placeholders).
    max_iterations: steps per run, unless `run()` says otherwise. Default 20.
    filter_tools_for_task: before a run, let the model pick the tools relevant to the task. Default False.
    max_retries: retries of a model call on transient errors (with exponential backoff). Default 3.
    work_dir: where files produced by a run are saved. Default None (not saved).
    tracing_type: ``"langfuse"`` or ``"langsmith"`` to trace runs (the package must be installed).
    allowed_tools: names or patterns of the tools this agent may use; excluded tools are neither
        described to the model nor callable. None (default) allows all, [] allows none.
    on_step: called (sync or async) with each step's `StepRecord` once the step is done.
    use_planner: make a plan before the first step and revise it as the run goes. Default False.
    planning_interval: revise the plan after every this many steps (3 when only `use_planner` is set;
        also on trouble). Setting it turns the planner on.
    observer: a configured `Observer` (e.g. with a `model_name` for advice); rules-only by default.
    tool_calling: ``"auto"`` (default: ask litellm what the model supports), or force ``"native"``
        (provider function calling; CodeAct, whose tools are functions inside its code, asks for JSON
        instead), ``"json"`` or ``"text"``.
    structured_output: how replies that are not native tool calls are constrained:
        ``"json_schema"`` (the reply schema as litellm's ``response_format``), ``"json_object"``
        (``{"type": "json_object", "schema": ...}``, which llama.cpp's server enforces), ``"off"`` (free
        text, parsed leniently), or ``"auto"`` (default): a schema when litellm knows the model supports
        one or an ``api_base`` server may, each refused format falling back to the next, down to text.
    stream: yield the model's step replies as they arrive (``"token"`` responses) and, in CodeAct, what
        the code prints while it runs (``"output"`` responses); steps and answer stay as without.
        Default False.
    """

    name: str | None
    description: str | None
    tools: Sequence[Callable[..., Any] | Tool] | None
    litellm_params: dict[str, Any] | None
    persona: str | None
    system_prompt: str | None
    max_iterations: int
    filter_tools_for_task: bool
    max_retries: int
    work_dir: str | None
    tracing_type: TracingType | None
    allowed_tools: Sequence[str] | None
    on_step: OnStep | None
    use_planner: bool
    planning_interval: int | None
    observer: Observer | None
    tool_calling: ToolCallingMode
    structured_output: StructuredOutput
    stream: bool


AGENT_DEFAULTS: Final[AgentOptions] = {
    "name": None,
    "description": None,
    "tools": None,
    "litellm_params": None,
    "persona": None,
    "system_prompt": None,
    "max_iterations": 20,
    "filter_tools_for_task": False,
    "max_retries": 3,
    "work_dir": None,
    "tracing_type": None,
    "allowed_tools": None,
    "on_step": None,
    "use_planner": False,
    "planning_interval": None,
    "observer": None,
    "tool_calling": "auto",
    "structured_output": "auto",
    "stream": False,
}

AGENT_OPTIONS: Final = frozenset(AgentOptions.__annotations__)


def resolve_options(owner: str, options: AgentOptions) -> AgentOptions:
    """`options` over `AGENT_DEFAULTS`; an unknown option is a `TypeError` naming it (and a near miss)."""
    unknown = sorted(set(options) - AGENT_OPTIONS)
    if unknown:
        hints = [
            f" (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, AGENT_OPTIONS, 1)) else ""
            for u in unknown
        ]
        listed = ", ".join(f"{u!r}{h}" for u, h in zip(unknown, hints, strict=True))
        raise TypeError(f"{owner} got unexpected option(s) {listed}")
    return {**AGENT_DEFAULTS, **options}
