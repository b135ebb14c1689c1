"""The options every agent takes, each declared once: its name, type, default and check together.

`AgentOptions` is the declaration. Type checkers read it through ``**options: Unpack[AgentOptions]``
(so an editor completes every option and a misspelt one is a type error), and pydantic validates a
call's options against it (`check_options`): the defaults are filled in from it, its constraints
checked, and what fails is a `ConfigurationError` naming the option. It is a TypedDict rather than a
`BaseModel` because only a TypedDict can type ``**options``; pydantic treats both alike. An agent adds
its own options by extending it (`CodeActOptions`).
"""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    SkipValidation,
    TypeAdapter,
    ValidationError,
    with_config,
)
from typing_extensions import TypedDict

from .errors import ConfigurationError
from .llm import check_litellm_params
from .models import StepRecord
from .observer import Observer
from .tools import Tool, as_tool
from .tracing import TracingType

__all__ = ["AgentOptions", "Mode", "OnStep", "StructuredOutput", "ToolCallingMode", "check_options"]

OnStep = Callable[[StepRecord], Any] | Callable[[StepRecord], Awaitable[Any]]
ToolCallingMode = Literal["auto", "native", "json", "text"]
StructuredOutput = Literal["auto", "json_schema", "json_object", "off"]
Mode = Literal["native", "json", "text"]
"""How one run's replies are requested: native tool calls, a JSON response format, or free text."""


def _unique_tools(tools: list[Tool] | None) -> list[Tool]:
    chosen = [as_tool(t) for t in tools or []]
    names = [t.name for t in chosen]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"two tools share the name(s) {duplicates}; tool names must be unique")
    return chosen


def _litellm_params(params: dict[str, Any] | None) -> dict[str, Any]:
    check_litellm_params(params)
    return dict(params or {})


def _copy_list(values: Sequence[str] | None) -> list[str] | None:
    return list(values) if values is not None else None


@with_config(ConfigDict(arbitrary_types_allowed=True, validate_default=True))
class AgentOptions(TypedDict, total=False):
    """The options of every agent (`Agent`, `ReActAgent`, `CodeActAgent`), with their defaults.

    name, description: how the agent presents itself (see `Agent.purpose`). Default None.
    tools: `Tool`s or plain functions (described from their signatures and docstrings); names must
        be unique. Default none.
    litellm_params: passed to every litellm call (api_base, api_key, temperature, timeout, ...);
        ``stream`` is refused (use the `stream` option).
    persona: a line about who the agent is, put into the system prompt.
    system_prompt: a replacement template (``{persona}``, ``{tools}`` placeholders).
    max_iterations: steps per run (at least 1), unless `run()` says otherwise. Default 20.
    filter_tools_for_task: before a run, let the model pick the tools relevant to the task. Default False.
    max_retries: retries of a model call on transient errors (with exponential backoff). Default 3.
    work_dir: where files produced by a run are saved. Default None (not saved).
    tracing_type: ``"langfuse"`` or ``"langsmith"`` to trace runs (the package must be installed;
        checked when the tracer is made, which imports it).
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

    name: Annotated[str | None, Field(default=None)]
    description: Annotated[str | None, Field(default=None)]
    tools: Annotated[
        Sequence[Callable[..., Any] | Tool] | None, Field(default=None), AfterValidator(_unique_tools)
    ]
    litellm_params: Annotated[dict[str, Any] | None, Field(default=None), AfterValidator(_litellm_params)]
    persona: Annotated[str | None, Field(default=None)]
    system_prompt: Annotated[str | None, Field(default=None)]
    max_iterations: Annotated[int, Field(default=20, ge=1)]
    filter_tools_for_task: Annotated[bool, Field(default=False)]
    max_retries: Annotated[int, Field(default=3, ge=0)]
    work_dir: Annotated[str | None, Field(default=None)]
    tracing_type: Annotated[TracingType | None, Field(default=None), SkipValidation]
    allowed_tools: Annotated[Sequence[str] | None, Field(default=None), AfterValidator(_copy_list)]
    on_step: Annotated[OnStep | None, Field(default=None)]
    use_planner: Annotated[bool, Field(default=False)]
    planning_interval: Annotated[int | None, Field(default=None, ge=1)]
    observer: Annotated[Observer | None, Field(default=None)]
    tool_calling: Annotated[ToolCallingMode, Field(default="auto")]
    structured_output: Annotated[StructuredOutput, Field(default="auto")]
    stream: Annotated[bool, Field(default=False)]


def option_names(declaration: type[Mapping[str, Any]]) -> frozenset[str]:
    """The options a declaration (`AgentOptions` or an extension of it) holds."""
    return frozenset(declaration.__annotations__)


@cache
def _adapter(declaration: type[Mapping[str, Any]]) -> TypeAdapter[Any]:
    return TypeAdapter(declaration)


def check_options(
    owner: str,
    options: Mapping[str, Any],
    declaration: type[Mapping[str, Any]] = AgentOptions,
    *,
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`options` validated against `declaration`, every option present (the defaults filled in).

    `aliases` maps other names an option may be given by to its name (both declared); the result holds
    the names only. An option the declaration does not hold is a `TypeError` naming it (and a near
    miss, if any); an alias given with its name is a `ConfigurationError` naming both; a value that
    fails its check is a `ConfigurationError` naming the option as given, the value and the rule.
    """
    known = option_names(declaration)
    unknown = sorted(set(options) - known)
    if unknown:
        hints = [
            f" (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, known, 1)) else ""
            for u in unknown
        ]
        listed = ", ".join(f"{u!r}{h}" for u, h in zip(unknown, hints, strict=True))
        raise TypeError(f"{owner} got unexpected option(s) {listed}")
    named = dict(options)
    given_as: dict[str, str] = {}
    for alias, name in (aliases or {}).items():
        if alias not in named:
            continue
        if name in named:
            raise ConfigurationError(
                f"{owner} got both {name!r} and {alias!r}, which is another name of {name!r}; give one of them"
            )
        named[name] = named.pop(alias)
        given_as[name] = alias
    try:
        checked: dict[str, Any] = _adapter(declaration).validate_python(named)
    except ValidationError as exc:
        raise ConfigurationError(describe_error(exc, named, given_as)) from None
    return checked


def describe_error(exc: ValidationError, given: Mapping[str, Any], given_as: Mapping[str, str]) -> str:
    """The first problem of a failed validation, as a sentence naming the option (as the caller named
    it: `given_as` maps a name to the alias it was given by) and its value."""
    first = exc.errors()[0]
    ours = first.get("ctx", {}).get("error")
    if isinstance(ours, ValueError):  # one of the validators above: its message as it was written
        return str(ours)
    option = str(first["loc"][0]) if first["loc"] else "options"
    value = given.get(option, first.get("input"))
    message = first["msg"]
    return f"{given_as.get(option, option)}: {message[:1].lower()}{message[1:]}, got {value!r}"
