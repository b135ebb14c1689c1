"""`AgentBase`: what every agent has — its options, tools, conversation, model calls and usage.

`Agent` (agent.py) builds the run on it; this half is what a run reads and writes: the configuration
(`AgentOptions`, resolved once), the per-run state (`_reset_state`, and `clone()` for a fresh agent), the
conversation (system prompt first, the task message, the history), and the model calls with their
usage, traces and retries.
"""

from __future__ import annotations

import asyncio
import copy
import fnmatch
import json
import os
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar, Self, Unpack

from pydantic import BaseModel

from . import prompts
from .conversation import (
    check_run_arguments,
    image_files,
    mark_system_prompt_for_cache,
    normalize_content,
    render_history,
    user_message,
)
from .errors import ConfigurationError
from .llm import LLMReply, call_llm, check_litellm_params, supports
from .models import AgentResponse, ChatMessage, ResponseType, StepRecord, Task
from .observer import Observer
from .options import AgentOptions, Mode, StructuredOutput, ToolCallingMode, resolve_options
from .planner import Planner
from .text import truncate
from .tools import Tool, as_tool
from .tracing import AbstractObservation, AbstractTracerManager, make_tracer_manager
from .usage import UsageTracker


def select_tools(tools: Sequence[Tool], allowed: Sequence[str] | None) -> dict[str, Tool]:
    """The tools whose names match `allowed` (names or shell-style patterns); None allows all."""
    if allowed is None:
        return {t.name: t for t in tools}
    return {t.name: t for t in tools if any(fnmatch.fnmatchcase(t.name, p) for p in allowed)}


class AgentBase:
    """An agent's configuration, tools, conversation, model calls and usage; `Agent` adds the run.

    Takes a litellm `model_name` and the `AgentOptions`; an unknown option is a `TypeError`.
    """

    HISTORY_TRUNCATE_CHARS: ClassVar[int] = 1000
    MAX_FILES: ClassVar[int] = 20
    response_format_class: ClassVar[type[ChatMessage]] = ChatMessage
    channel_name: ClassVar[str] = "agent"

    def __init__(self, model_name: str, **options: Unpack[AgentOptions]) -> None:
        o = resolve_options(type(self).__name__, options)
        max_iterations, max_retries = o["max_iterations"], o["max_retries"]
        planning_interval = o["planning_interval"]
        if not model_name or not isinstance(model_name, str):
            raise ConfigurationError("model_name must be a non-empty litellm model string")
        if max_iterations < 1:
            raise ConfigurationError(f"max_iterations must be at least 1, got {max_iterations}")
        if planning_interval is not None and planning_interval < 1:
            raise ConfigurationError(f"planning_interval must be at least 1 step, got {planning_interval}")
        if max_retries < 0:
            raise ConfigurationError(f"max_retries cannot be negative, got {max_retries}")
        self.id: uuid.UUID = uuid.uuid4()
        self.model_name = model_name
        self.name = o["name"]
        self.description = o["description"]
        self.tools: list[Tool] = [as_tool(t) for t in (o["tools"] or [])]
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(f"two tools share the name(s) {duplicates}; tool names must be unique")
        check_litellm_params(o["litellm_params"])
        self.litellm_params: dict[str, Any] = dict(o["litellm_params"] or {})
        self.persona = o["persona"]
        self.system_prompt = o["system_prompt"]
        self.max_iterations = max_iterations
        self.filter_tools_for_task = o["filter_tools_for_task"]
        self.max_retries = max_retries
        self.work_dir = o["work_dir"]
        self.tracing_type = o["tracing_type"]
        allowed_tools = o["allowed_tools"]
        self.allowed_tools: list[str] | None = list(allowed_tools) if allowed_tools is not None else None
        self.on_step = o["on_step"]
        self.retry_base_delay = 1.0
        self.prompt_cache: bool | None = None

        self.tracer_manager: AbstractTracerManager = make_tracer_manager(self.tracing_type)
        self.current_trace: AbstractObservation | None = None
        self.usage_tracker = UsageTracker()
        observer = o["observer"]
        self.observer = observer if observer is not None else Observer()
        self.planner: Planner | None = (
            Planner(model_name, litellm_params=self.litellm_params, usage_tracker=self.usage_tracker,
                    max_retries=max_retries, update_every=planning_interval or 3)
            if o["use_planner"] or planning_interval is not None else None
        )  # fmt: skip
        self._is_visual: bool | None = None

        tool_calling, structured_output = o["tool_calling"], o["structured_output"]
        if tool_calling not in ("auto", "native", "json", "text"):
            raise ValueError(f"tool_calling must be auto, native, json or text; got {tool_calling!r}")
        self.tool_calling: ToolCallingMode = tool_calling
        if structured_output not in ("auto", "json_schema", "json_object", "off"):
            raise ConfigurationError(
                f"structured_output must be auto, json_schema, json_object or off; got {structured_output!r}"
            )
        self.structured_output: StructuredOutput = structured_output
        self._formats_refused: frozenset[str] = frozenset()
        self.format_used: str | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        """Give this agent fresh per-run state (history, steps, usage): at construction and in `clone()`."""
        self.chat_history: list[dict[str, Any]] = []
        self.msg_idx_of_new_task = 0
        self.task: Task | None = None
        self.task_output_files: list[str] = []
        self.final_answer_found = False
        self.steps: list[StepRecord] = []
        self._run_tools: dict[str, Tool] = select_tools(self.tools, self.allowed_tools)
        self._response_model: type[BaseModel] | None = None
        self._inputs: dict[str, Any] = {}
        self.current_trace = None
        self._mode: Mode = "text"
        self._final: AgentResponse | None = None
        self._trouble = False
        self._run_token: object | None = None
        self._owner: asyncio.Task[Any] | None = None

    def clone(self) -> Self:
        """A new agent with this one's configuration and none of its state.

        An agent runs one task at a time (a second concurrent `run()` raises `AgentBusyError`); to run
        tasks in parallel, give each its own clone. Tools, model and options are shared (tools are
        stateless); history, steps, usage, observer and planner state, and the sandbox are not.
        """
        twin = copy.copy(self)
        twin.id = uuid.uuid4()
        twin.tools = list(self.tools)
        twin.litellm_params = dict(self.litellm_params)
        twin.usage_tracker = UsageTracker()
        twin.observer = copy.copy(self.observer)
        twin.observer.reset()
        if self.planner is not None:
            twin.planner = copy.copy(self.planner)
            twin.planner.usage_tracker = twin.usage_tracker
            twin.planner.plan = None
        twin._reset_state()
        return twin

    # ------------------------------------------------------------------ tools

    @property
    def tool_name_to_func(self) -> dict[str, Tool]:
        """The tools callable in the current run (all allowed tools outside a run)."""
        return dict(self._run_tools)

    @property
    def tool_names(self) -> set[str]:
        return set(self._run_tools)

    def get_tools_description(self, tools: list[Any] | None = None) -> str:
        """Describe tools for the model, one block each, with required arguments marked."""
        chosen = [as_tool(t) for t in tools] if tools is not None else list(self._run_tools.values())
        return "\n".join(t.describe() for t in chosen) if chosen else prompts.NO_TOOLS

    @property
    def is_visual_model(self) -> bool:
        """Whether the model accepts images (asked of litellm once, on first use)."""
        if self._is_visual is None:
            self._is_visual = supports(self.model_name, "vision")
        return self._is_visual

    @property
    def purpose(self) -> str:
        """Who the agent is, what it is for, and which tools it has."""
        lines = [f"Name: {self.name or type(self).__name__}"]
        if self.description:
            lines.append(f"Description: {self.description}")
        lines.append("Tools:\n" + self.get_tools_description())
        return "\n".join(lines)

    # ------------------------------------------------------------------ history

    def get_system_prompt_content(self) -> str:
        """The system prompt of this agent, rendered. Subclasses add their own placeholders."""
        template = self.system_prompt or "{persona}\n\nTools:\n{tools}"
        return prompts.render_template(
            template, persona=self.persona or "", tools=self.get_tools_description()
        )

    def init_history(self) -> None:
        """Start a fresh conversation: the system prompt alone."""
        self.chat_history = [{"role": "system", "content": self.get_system_prompt_content()}]
        self.msg_idx_of_new_task = len(self.chat_history)

    def add_to_history(self, message: ChatMessage | dict[str, Any]) -> None:
        """Append a message (a `ChatMessage` or an OpenAI-format dict) to the conversation."""
        self.chat_history.append(message.to_openai() if isinstance(message, ChatMessage) else dict(message))

    def clear_history(self) -> None:
        self.chat_history = []
        self.msg_idx_of_new_task = 0

    normalize_content = staticmethod(normalize_content)

    def get_history(self) -> str:
        """The conversation without the system prompt, each message cut to `HISTORY_TRUNCATE_CHARS`."""
        return render_history(self.chat_history, self.HISTORY_TRUNCATE_CHARS)

    # ------------------------------------------------------------------ files, plan, usage, responses

    def add_output_file(self, path: str) -> None:
        """Record a file produced by the run (absolute path)."""
        absolute = os.path.abspath(path)
        if absolute not in self.task_output_files:
            self.task_output_files.append(absolute)
            if self.task is not None:
                self.task.output_files.append(absolute)

    @property
    def artifacts(self) -> list[str]:
        """Files produced by the current (or last) run."""
        return list(self.task_output_files)

    @property
    def current_plan(self) -> str | None:
        return self.planner.plan if self.planner else None

    def get_usage_metrics(self) -> dict[str, Any]:
        """Tokens and cost of the current (or last) run, in total and per component."""
        return self.usage_tracker.metrics()

    def get_usage_report(self, include_breakdown: bool = True) -> str:
        return self.usage_tracker.report(include_breakdown)

    def response(
        self,
        rtype: ResponseType,
        value: Any,
        channel: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AgentResponse:
        """Build a response; a final one is also stored as the task's result."""
        if rtype == "final" and self.task is not None:
            self.task.result = value
            self.task.is_finished = True
        return AgentResponse(
            type=rtype,
            value=value,
            channel=channel or self.name or self.channel_name,
            metadata=metadata or {},
        )

    # ------------------------------------------------------------------ model calls

    async def _call_model(
        self,
        messages: list[dict[str, Any]] | None = None,
        *,
        component: str = "agent",
        tools: list[dict[str, Any]] | None = None,
        response_format: dict[str, Any] | None = None,
    ) -> LLMReply:
        span = self.tracer_manager.start_span(self.current_trace, f"llm:{component}")
        try:
            reply = await call_llm(
                self.model_name,
                messages if messages is not None else self._mark_for_cache(self.chat_history),
                component=component,
                usage_tracker=self.usage_tracker,
                litellm_params=self.litellm_params,
                max_retries=self.max_retries,
                retry_base_delay=self.retry_base_delay,
                tools=tools,
                response_format=response_format,
            )
        except Exception as exc:
            span.end(error=str(exc))
            raise
        span.end(output=reply.content)
        return reply

    def _prompt_cache_wanted(self) -> bool:
        if self.prompt_cache is not None:
            return self.prompt_cache
        name = self.model_name.lower()
        return name.startswith("anthropic/") or "claude" in name

    def _mark_for_cache(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Mark the system prompt as a cache breakpoint for providers that need explicit markers."""
        return mark_system_prompt_for_cache(messages) if self._prompt_cache_wanted() else messages

    async def salvage_response(self) -> str:
        """When the steps run out: ask the model to sum up what was found and what is missing."""
        task = self.task.description if self.task else ""
        prompt = prompts.SALVAGE_PROMPT.format(task=task, history=self.get_history())
        reply = await self._call_model([{"role": "user", "content": prompt}], component="salvage")
        return (reply.content or "").strip()

    async def _filter_tools(self, task: str) -> None:
        """Let the model choose the tools relevant to `task` (when `filter_tools_for_task` is set)."""
        if not self._run_tools:
            return
        prompt = prompts.TOOL_FILTER_PROMPT.format(task=task, tools=self.get_tools_description())
        reply = await self._call_model([{"role": "user", "content": prompt}], component="tool_filter")
        text = reply.content or ""
        try:
            start, end = text.index("["), text.rindex("]") + 1
            names = json.loads(text[start:end])
        except ValueError:
            return  # the model did not answer with a list: keep every tool rather than guess
        if isinstance(names, list):
            chosen = {n for n in names if isinstance(n, str)}
            self._run_tools = {k: v for k, v in self._run_tools.items() if k in chosen}

    # ------------------------------------------------------------------ task messages

    def _check_run_arguments(
        self,
        task: str,
        files: list[str] | None,
        max_iterations: int | None,
        recurrent_mode: bool,
        chat_history: list[dict[str, Any]] | None,
        history: Sequence[Any] | None,
        inputs: dict[str, Any] | None,
        response_model: type[BaseModel] | None,
    ) -> None:
        check_run_arguments(
            task, files, max_iterations, recurrent_mode, chat_history, history, inputs, response_model,
            max_files=self.MAX_FILES,
        )  # fmt: skip
        self._check_inputs(inputs or {})

    def _check_inputs(self, inputs: dict[str, Any]) -> None:
        """A hook for what an agent refuses in `inputs` beyond the common checks (default: nothing)."""

    def _task_text(self, task: str, previous: Task | None, recurrent_mode: bool) -> str:
        parts = []
        if recurrent_mode and previous is not None:
            parts.append(prompts.RECURRENT_NOTE.format(
                previous_task=previous.description, previous_result=self.normalize_content(previous.result)))  # fmt: skip
        parts.append(prompts.TASK_TEMPLATE.format(task=task.strip()))
        if self.msg_idx_of_new_task > 1 and self._continuation_note():
            parts.append(self._continuation_note())
        if self._inputs:
            rendered = "\n".join(
                f"- {k} = {truncate(json.dumps(v, ensure_ascii=False), 2000)}"
                for k, v in self._inputs.items()
            )
            parts.append(prompts.INPUTS_NOTE.format(inputs=rendered + self._inputs_suffix()))
        if self.task and self.task.files:
            parts.append(prompts.FILES_NOTE.format(files="\n".join(f"- {f}" for f in self._file_labels())))
        if self._response_model is not None:
            schema = json.dumps(self._response_model.model_json_schema(), ensure_ascii=False)
            parts.append(prompts.RESPONSE_MODEL_NOTE.format(schema=schema))
        return "\n".join(parts)

    def _inputs_suffix(self) -> str:
        """Said after the list of `inputs`: how this agent's replies refer to them (nothing by default)."""
        return ""

    def _continuation_note(self) -> str:
        """Said with the task when the run continues an earlier conversation (none by default)."""
        return ""

    def _file_labels(self) -> list[str]:
        return list(self.task.files) if self.task else []

    def _task_message(self, text: str) -> dict[str, Any]:
        """The task as a user message; with a vision model, local images are attached."""
        images = image_files(self.task.files if self.task else [])
        return user_message(text, images if images and self.is_visual_model else ())
