"""`Agent`: what every kodeagent agent shares (configuration, tools, history, usage, responses).

The step loop itself lives in `react.py` (`ReActAgent.run`), and CodeAct (`codeact.py`) changes only
what a step does. Design choices that hold for all agents:

* The system prompt is rendered once per run and stays the first message, unchanged, for the whole
  run; everything that changes (task, plan, observations, observer notes) is appended after it.
* Observations enter the conversation as `user` (or `tool`) messages and are never parsed as the
  model's words; only the model's own replies go through the reply parsers.
* Everything a run opens (the sandbox, traces) is released in a `finally`, whatever way the run ends.
"""

from __future__ import annotations

import base64
import copy
import fnmatch
import json
import keyword
import mimetypes
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ValidationError

from . import prompts
from .errors import ConfigurationError
from .llm import LLMReply, call_llm, check_litellm_params, supports
from .models import AgentResponse, ChatMessage, ResponseType, StepRecord, Task
from .observer import Observer
from .parsing import extract_json_object
from .planner import Planner
from .text import truncate
from .tools import Tool, as_tool
from .tracing import AbstractObservation, AbstractTracerManager, TracingType, make_tracer_manager
from .usage import CALLER_USAGE, UsageTracker

OnStep = Callable[[StepRecord], Any] | Callable[[StepRecord], Awaitable[Any]]
_ROLES = {"system", "user", "assistant", "tool", "developer"}
_PART_TYPES = {"text", "image_url", "input_audio", "file"}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}


def validate_openai_history(messages: Sequence[Any], *, what: str = "chat_history") -> list[dict[str, Any]]:
    """Check that `messages` is a valid OpenAI chat history; return it as plain dicts.

    Raises `ValueError` naming the first offending message and what is wrong with it.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise ValueError(f"{what} must be a list of messages, got {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for i, raw in enumerate(messages):
        message = raw.to_openai() if isinstance(raw, ChatMessage) else raw
        if not isinstance(message, dict):
            raise ValueError(
                f"{what}[{i}] must be a dict with 'role' and 'content', got {type(raw).__name__}"
            )
        role = message.get("role")
        if role not in _ROLES:
            raise ValueError(f"{what}[{i}] has role {role!r}; expected one of {sorted(_ROLES)}")
        content = message.get("content")
        tool_calls = message.get("tool_calls")
        if content is None:
            if not (role == "assistant" and tool_calls):
                raise ValueError(f"{what}[{i}] ({role}) has no content")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") not in _PART_TYPES:
                    raise ValueError(
                        f"{what}[{i}].content[{j}] must be a dict whose 'type' is one of {sorted(_PART_TYPES)}"
                    )
        elif not isinstance(content, str):
            raise ValueError(f"{what}[{i}].content must be a string or a list of parts")
        if tool_calls is not None:
            if role != "assistant" or not isinstance(tool_calls, list):
                raise ValueError(f"{what}[{i}]: only assistant messages carry a list of tool_calls")
            for j, call in enumerate(tool_calls):
                function = call.get("function") if isinstance(call, dict) else None
                if not (
                    isinstance(call, dict)
                    and call.get("id")
                    and isinstance(function, dict)
                    and function.get("name")
                    and isinstance(function.get("arguments", ""), str)
                ):
                    raise ValueError(
                        f"{what}[{i}].tool_calls[{j}] needs an 'id' and a 'function' with 'name' and "
                        "string 'arguments'"
                    )
                open_calls.add(str(call["id"]))
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not call_id:
                raise ValueError(f"{what}[{i}] is a tool message without 'tool_call_id'")
            if str(call_id) not in open_calls:
                raise ValueError(
                    f"{what}[{i}] answers tool call {call_id!r}, which no earlier assistant message made"
                )
        out.append(dict(message))
    return out


def select_tools(tools: Sequence[Tool], allowed: Sequence[str] | None) -> dict[str, Tool]:
    """The tools whose names match `allowed` (names or shell-style patterns); None allows all."""
    if allowed is None:
        return {t.name: t for t in tools}
    return {t.name: t for t in tools if any(fnmatch.fnmatchcase(t.name, p) for p in allowed)}


class Agent(ABC):
    """Base of every agent: configuration, tools, conversation, usage, and the response protocol.

    Args:
        model_name: any litellm model string, e.g. ``"gemini/gemini-2.5-flash"``.
        name, description: how the agent presents itself (see `purpose`).
        tools: `Tool`s or plain functions (described from their signatures and docstrings).
        litellm_params: passed to every litellm call (api_base, api_key, temperature, timeout, ...).
        persona: a line about who the agent is, put into the system prompt.
        system_prompt: a replacement template (``{persona}``, ``{tools}`` placeholders).
        max_iterations: steps per run, unless `run()` says otherwise.
        filter_tools_for_task: before a run, let the model pick the tools relevant to the task.
        max_retries: retries of a model call on transient errors (with exponential backoff).
        work_dir: where files produced by a run are saved.
        tracing_type: ``"langfuse"`` or ``"langsmith"`` to trace runs (the package must be installed).
        allowed_tools: names or patterns of the tools this agent may use; excluded tools are neither
            described to the model nor callable. None allows all, [] allows none.
        on_step: called (sync or async) with each step's `StepRecord` once the step is done.
        use_planner: make a plan before the first step and revise it as the run goes.
        planning_interval: revise the plan after every this many steps (default 3; also on trouble).
            Setting it turns the planner on.
        observer: a configured `Observer` (e.g. with a `model_name` for advice); rules-only by default.

    Attributes set after construction:
        retry_base_delay: seconds before the first retry of a model call (doubling after each).
        prompt_cache: mark the system prompt for prompt caching; None (default) does so for
            Anthropic models, which cache only marked prefixes.
    """

    HISTORY_TRUNCATE_CHARS: ClassVar[int] = 1000
    MAX_FILES: ClassVar[int] = 20
    response_format_class: ClassVar[type[ChatMessage]] = ChatMessage
    channel_name: ClassVar[str] = "agent"

    def __init__(
        self,
        model_name: str,
        *,
        name: str | None = None,
        description: str | None = None,
        tools: Sequence[Callable[..., Any] | Tool] | None = None,
        litellm_params: dict[str, Any] | None = None,
        persona: str | None = None,
        system_prompt: str | None = None,
        max_iterations: int = 20,
        filter_tools_for_task: bool = False,
        max_retries: int = 3,
        work_dir: str | None = None,
        tracing_type: TracingType | None = None,
        allowed_tools: Sequence[str] | None = None,
        on_step: OnStep | None = None,
        use_planner: bool = False,
        planning_interval: int | None = None,
        observer: Observer | None = None,
    ) -> None:
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
        self.name = name
        self.description = description
        self.tools: list[Tool] = [as_tool(t) for t in (tools or [])]
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(f"two tools share the name(s) {duplicates}; tool names must be unique")
        check_litellm_params(litellm_params)
        self.litellm_params: dict[str, Any] = dict(litellm_params or {})
        self.persona = persona
        self.system_prompt = system_prompt
        self.max_iterations = max_iterations
        self.filter_tools_for_task = filter_tools_for_task
        self.max_retries = max_retries
        self.work_dir = work_dir
        self.tracing_type = tracing_type
        self.allowed_tools: list[str] | None = list(allowed_tools) if allowed_tools is not None else None
        self.on_step = on_step
        self.retry_base_delay = 1.0
        self.prompt_cache: bool | None = None

        self.tracer_manager: AbstractTracerManager = make_tracer_manager(tracing_type)
        self.current_trace: AbstractObservation | None = None
        self.usage_tracker = UsageTracker()
        self.observer = observer if observer is not None else Observer()
        self.planner: Planner | None = (
            Planner(model_name, litellm_params=self.litellm_params, usage_tracker=self.usage_tracker,
                    max_retries=max_retries, update_every=planning_interval or 3)
            if use_planner or planning_interval is not None else None
        )  # fmt: skip
        self._is_visual: bool | None = None
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

    def as_tool(self, name: str | None = None) -> Tool:
        """This agent as a tool another agent can call: ``task`` in, the final answer out.

        The tool's description is the agent's `purpose`, so the calling model knows what it can ask.
        Each call runs on a fresh `clone()` of this agent, so parallel calls (a manager's concurrent
        tool calls) never share a conversation; when the call ends, its model usage is added to the
        calling agent's usage under ``"<tool name>.<component>"``. A run that ends without an answer
        raises, which the caller sees as a failed tool call.
        """
        agent = self
        tool_name = name or self.name or f"{type(self).__name__.lower()}_helper"

        async def delegate(task: str) -> Any:
            worker = agent.clone()
            caller = CALLER_USAGE.get()
            final = None
            try:
                async for response in worker.run(task):
                    if response.type == "final":
                        final = response
            finally:
                if caller is not None and caller is not worker.usage_tracker:
                    caller.add_from(worker.usage_tracker, tool_name)
            if final is None or not final.metadata.get("final_answer_found", False):
                raise RuntimeError(f"the {tool_name} agent did not finish: {final.value if final else ''}")
            value = final.value
            return value.model_dump(mode="json") if isinstance(value, BaseModel) else value

        delegate.__name__ = tool_name
        return Tool(
            delegate,
            name=tool_name,
            description=self.purpose.replace("\n", " "),
            parameters={
                "type": "object",
                "properties": {"task": {"type": "string", "description": "what the agent should do"}},
                "required": ["task"],
            },
        )

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

    @staticmethod
    def normalize_content(content: Any) -> str:
        """Message content (text, a list of parts, a dict) as readable text."""
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                elif isinstance(part, dict):
                    parts.append(f"[{part.get('type', 'part')}]")
                else:
                    parts.append(str(part))
            return "\n".join(parts)
        if isinstance(content, dict | BaseModel):
            data = content.model_dump(mode="json") if isinstance(content, BaseModel) else content
            return json.dumps(data, ensure_ascii=False, default=str)
        return str(content)

    def get_history(self) -> str:
        """The conversation without the system prompt, each message cut to `HISTORY_TRUNCATE_CHARS`."""
        lines = []
        for message in self.chat_history:
            if message.get("role") == "system":
                continue
            text = self.normalize_content(message.get("content"))
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                text += f"\n[tool call] {function.get('name')}({function.get('arguments')})"
            lines.append(f"[{message.get('role')}] {truncate(text.strip(), self.HISTORY_TRUNCATE_CHARS)}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ files and plan

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

    # ------------------------------------------------------------------ usage

    def get_usage_metrics(self) -> dict[str, Any]:
        """Tokens and cost of the current (or last) run, in total and per component."""
        return self.usage_tracker.metrics()

    def get_usage_report(self, include_breakdown: bool = True) -> str:
        return self.usage_tracker.report(include_breakdown)

    # ------------------------------------------------------------------ responses

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
        """Mark the system prompt as a cache breakpoint for providers that need explicit markers.

        OpenAI and Gemini cache a repeated prefix on their own; Anthropic models cache only what is
        marked. The history itself is left unchanged: the marker is added to the request only.
        """
        if not messages or not self._prompt_cache_wanted():
            return messages
        first = messages[0]
        if first.get("role") != "system" or not isinstance(first.get("content"), str):
            return messages
        part = {"type": "text", "text": first["content"], "cache_control": {"type": "ephemeral"}}
        return [{**first, "content": [part]}, *messages[1:]]

    async def salvage_response(self) -> str:
        """When the steps run out: ask the model to sum up what was found and what is missing."""
        task = self.task.description if self.task else ""
        reply = await self._call_model(
            [
                {
                    "role": "user",
                    "content": prompts.SALVAGE_PROMPT.format(task=task, history=self.get_history()),
                }
            ],
            component="salvage",
        )
        return (reply.content or "").strip()

    async def _filter_tools(self, task: str) -> None:
        """Let the model choose the tools relevant to `task` (when `filter_tools_for_task` is set)."""
        if not self._run_tools:
            return
        reply = await self._call_model(
            [{"role": "user", "content": prompts.TOOL_FILTER_PROMPT.format(
                task=task, tools=self.get_tools_description())}],
            component="tool_filter",
        )  # fmt: skip
        text = reply.content or ""
        try:
            start, end = text.index("["), text.rindex("]") + 1
            names = json.loads(text[start:end])
        except ValueError:
            return  # the model did not answer with a list: keep every tool rather than guess
        if isinstance(names, list):
            chosen = {n for n in names if isinstance(n, str)}
            self._run_tools = {k: v for k, v in self._run_tools.items() if k in chosen}

    # ------------------------------------------------------------------ hooks

    async def pre_run(self) -> AsyncIterator[AgentResponse]:
        """Before the loop: nothing by default. Subclasses set up task resources here."""
        return
        yield  # pragma: no cover - makes this an async generator

    async def post_run(self) -> AsyncIterator[AgentResponse]:
        """After the loop (always, also on failure): nothing by default. Subclasses clean up here."""
        return
        yield  # pragma: no cover

    async def _notify_plan(self, plan: str, index: int) -> None:
        """Let `on_step` see a plan (or a revised plan) as a record of kind ``"plan"`` (not in `steps`)."""
        if self.on_step is not None:
            result = self.on_step(StepRecord(index=index, kind="plan", thought=plan))
            if hasattr(result, "__await__"):
                await result

    async def arun(self, task: str, **options: Any) -> AgentResponse:
        """Run `task` to the end and return the final response, for callers who do not iterate.

        ``(await agent.arun(task)).value`` is the answer; its ``metadata`` holds ``task_successful``,
        ``steps`` and ``usage``. `options` are those of `run()`.
        """
        final: AgentResponse | None = None
        async for response in self.run(task, **options):
            if response.type == "final":
                final = response
        assert final is not None  # run() always ends with a final response
        return final

    def run_sync(self, task: str, **options: Any) -> AgentResponse:
        """The blocking twin of `arun()`, for scripts and notebooks without an event loop."""
        import anyio
        import sniffio

        try:
            sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            return anyio.run(lambda: self.arun(task, **options))
        raise ConfigurationError("run_sync() cannot be called from async code; use `await agent.arun(task)`")

    async def _notify_step(self, record: StepRecord) -> None:
        self.steps.append(record)
        if self.on_step is not None:
            result = self.on_step(record)
            if hasattr(result, "__await__"):
                await result

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
        if not isinstance(task, str) or not task.strip():
            raise ValueError("task must be a non-empty string")
        if files is not None and len(files) > self.MAX_FILES:
            raise ValueError(f"too many files: {len(files)} given, at most {self.MAX_FILES} per task")
        if max_iterations is not None and max_iterations < 1:
            raise ValueError(f"max_iterations must be at least 1, got {max_iterations}")
        if recurrent_mode and chat_history is not None:
            raise ValueError("recurrent_mode and chat_history cannot be used together; choose one")
        if history is not None and (chat_history is not None or recurrent_mode):
            raise ValueError("history cannot be combined with chat_history or recurrent_mode")
        if chat_history is not None:
            validate_openai_history(chat_history)
        if history is not None:
            for i, message in enumerate(validate_openai_history(history, what="history")):
                if message["role"] == "system":
                    raise ValueError(f"history[{i}] is a system message; history holds earlier turns only")
        if inputs is not None:
            if not isinstance(inputs, dict):
                raise ValueError("inputs must be a dict of name -> JSON-compatible value")
            for key, value in inputs.items():
                if (
                    not isinstance(key, str)
                    or not key.isidentifier()
                    or key.startswith("_")
                    or keyword.iskeyword(key)
                ):
                    raise ValueError(f"inputs key {key!r} must be a Python identifier not starting with '_'")
                try:
                    json.dumps(value)
                except (TypeError, ValueError):
                    raise ValueError(f"inputs[{key!r}] is not JSON-compatible") from None
        if response_model is not None and not (
            isinstance(response_model, type) and issubclass(response_model, BaseModel)
        ):
            raise ValueError("response_model must be a pydantic BaseModel subclass")

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
        return ""

    def _continuation_note(self) -> str:
        """Said with the task when the run continues an earlier conversation (none by default)."""
        return ""

    def _file_labels(self) -> list[str]:
        return list(self.task.files) if self.task else []

    def _task_message(self, text: str) -> dict[str, Any]:
        """The task as a user message; with a vision model, local images are attached."""
        images = [
            f for f in (self.task.files if self.task else [])
            if os.path.isfile(f) and os.path.splitext(f)[1].lower() in _IMAGE_SUFFIXES
        ]  # fmt: skip
        if not images or not self.is_visual_model:
            return {"role": "user", "content": text}
        parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
        for path in images:
            mime = mimetypes.guess_type(path)[0] or "image/png"
            with open(path, "rb") as fh:
                data = base64.b64encode(fh.read()).decode()
            parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
        return {"role": "user", "content": parts}

    # ------------------------------------------------------------------ final answers

    def _accept_final(self, answer: Any) -> tuple[Any, str | None]:
        """Validate a final answer into `response_model` when one is set: (value, error or None)."""
        model = self._response_model
        if model is None:
            return answer, None
        data = answer
        if isinstance(answer, str):
            found = extract_json_object(answer)
            data = found if found is not None else answer
        try:
            return model.model_validate(data), None
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc', ())) or 'value'}: {e.get('msg')}"
                for e in exc.errors()
            )
            return answer, problems

    @abstractmethod
    def parse_text_response(self, text: str) -> ChatMessage:
        """Parse a model reply given as free text into this agent's structured reply."""

    @abstractmethod
    def run(
        self,
        task: str,
        files: list[str] | None = None,
        task_id: str | None = None,
        max_iterations: int | None = None,
        recurrent_mode: bool = False,
        summarize_progress_on_failure: bool = True,
        chat_history: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[AgentResponse]:
        """Solve `task`, yielding `AgentResponse`s; the last one is the final answer."""


ToolCallingMode = Literal["auto", "native", "json", "text"]
