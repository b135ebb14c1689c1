"""`Agent`: what every kodeagent agent is configured with, and the loop each of its runs goes through.

`ReActAgent` and `CodeActAgent` are siblings under `Agent`: each says only how it prompts, how its
replies read (`parse_reply`) and what acting on a reply means (`_act`); the run — setup, plan, steps,
observer notes, the final answer or giving up, usage — is here, once. The agent holds its
configuration only; what one run reads and writes lives on that run's `AgentRun` (run.py), which every
method of the loop is handed. Design choices that hold for all:

* The system prompt is rendered once per run and stays the first message, unchanged, for the whole
  run; everything that changes (task, plan, observations, observer notes) is appended after it.
* Observations enter the conversation as `user` (or `tool`) messages and are never parsed as the
  model's words; only the model's own replies go through the reply parsers.
* Everything a run opens (the sandbox, traces) is released in a `finally`, whatever way the run ends.
* An agent runs one task at a time, and shows the last one (`agent.task`, `agent.steps`, ...): a second
  concurrent run raises `AgentBusyError`; `clone()` for more. Each `as_tool()` call is a run of its own.
* Replies are asked for in the best response format the server accepts (`structured.py`), down to text.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self, Unpack

import anyio
from pydantic import BaseModel

from . import prompts
from .conversation import image_files, mark_system_prompt_for_cache, normalize_content, user_message
from .delegation import agent_tool
from .errors import AgentBusyError, ConfigurationError, KodeAgentError, LLMError, ResponseParseError
from .llm import LLMReply, OnDelta, OnRetry, call_llm, check_litellm_params, knows_model, supports
from .models import AgentResponse, ChatMessage, ResponseType, StepRecord, Task
from .observer import Observer
from .options import AgentOptions, Mode, StructuredOutput, ToolCallingMode, resolve_options
from .planner import Planner
from .run import AgentRun, RunArguments, recent_progress
from .structured import FormatKind, format_kinds, refuses_format, response_format, validate_final
from .text import truncate
from .tools import Tool, as_tool, select_tools
from .tracing import AbstractTracerManager, make_tracer_manager
from .usage import UsageTracker

__all__ = ["Agent", "FinalAnswer", "StepReply", "raw_reply_text", "select_tools"]


def raw_reply_text(reply: LLMReply) -> str:
    """The model's reply verbatim: its text, and its native tool calls as JSON after it."""
    text = reply.content or ""
    if reply.tool_calls:
        text += ("\n" if text else "") + json.dumps(reply.tool_calls, ensure_ascii=False)
    return text


def _current_task() -> asyncio.Task[Any] | None:
    """The asyncio task running this code (None outside asyncio): who owns a run in progress."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


class StepReply(Protocol):
    """What every agent's parsed reply says (`ReActChatMessage`, `CodeActChatMessage`): the shared
    opening of a step reads these; the rest is the agent's own (`_act`)."""

    thought: str
    final_answer: Any
    task_successful: bool
    tool_calls: list[dict[str, Any]] | None

    @property
    def is_final(self) -> bool: ...


@dataclass(frozen=True)
class FinalAnswer:
    """An answer reached by acting rather than by the reply itself (CodeAct code calling `final_answer()`)."""

    value: Any
    successful: bool = True


class Agent(ABC):
    """Base of every agent: its configuration, and the run loop on it.

    Args:
        model_name: any litellm model string, e.g. ``"gemini/gemini-2.5-flash"``.
        **options: the `AgentOptions` every agent takes (tools, litellm_params, max_iterations,
            planner and observer, structured output, ...), documented there with their defaults;
            an unknown option is a `TypeError`.

    Attributes set after construction:
        retry_base_delay: seconds before the first retry of a model call (doubling after each).
        prompt_cache: mark the system prompt for prompt caching; None (default) does so for
            Anthropic models, which cache only marked prefixes.

    What a run did is on its `AgentRun`; the agent shows its last one (`last_run`, and `task`, `steps`,
    `chat_history`, `usage_tracker`, `artifacts`, `current_plan`, ... read from it).
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
        observer = o["observer"]
        self.observer = observer if observer is not None else Observer()
        # The planner and observer here are templates: each run plans and watches with its own copy.
        self.planner: Planner | None = (
            Planner(
                model_name,
                litellm_params=self.litellm_params,
                max_retries=max_retries,
                update_every=planning_interval or 3,
            )
            if o["use_planner"] or planning_interval is not None
            else None
        )
        tool_calling, structured_output = o["tool_calling"], o["structured_output"]
        if tool_calling not in ("auto", "native", "json", "text"):
            raise ValueError(f"tool_calling must be auto, native, json or text; got {tool_calling!r}")
        self.tool_calling: ToolCallingMode = tool_calling
        if structured_output not in ("auto", "json_schema", "json_object", "off"):
            raise ConfigurationError(
                f"structured_output must be auto, json_schema, json_object or off; got {structured_output!r}"
            )
        self.structured_output: StructuredOutput = structured_output
        self.stream: bool = bool(o["stream"])
        # Learned for the agent's life (not per run): response formats the server refused, and vision.
        self._formats_refused: frozenset[str] = frozenset()
        self._is_visual: bool | None = None
        self._last_run: AgentRun | None = None

    def clone(self) -> Self:
        """A new agent with this one's configuration, to run another task in parallel.

        An agent runs one task at a time (a second concurrent `run()` raises `AgentBusyError`). Its
        runs' state lives on their `AgentRun`s, so a clone is the configuration alone: model, options
        and tools shared (tools are stateless), its own copies of what a caller may change (tool list,
        litellm params, planner and observer settings), and no run yet.
        """
        twin = copy.copy(self)
        twin.id = uuid.uuid4()
        twin.tools = list(self.tools)
        twin.litellm_params = dict(self.litellm_params)
        twin.observer = self.observer.for_run()
        twin.planner = copy.copy(self.planner)
        twin._last_run = None
        return twin

    def as_tool(self, name: str | None = None) -> Tool:
        """This agent as a tool another agent can call: ``task`` in, the final answer out.

        The tool's description is the agent's `purpose`, so the calling model knows what it can ask.
        Each call is a run of its own (not the agent's `last_run`), so parallel calls (a manager's
        concurrent tool calls) never share a conversation; when the call ends, its model usage is added
        to the calling agent's usage under ``"<tool name>.<component>"``. A run that ends without an
        answer raises, which the caller sees as a failed tool call.
        """
        return agent_tool(self, name)

    # ------------------------------------------------------------------ the last run, as the agent shows it

    @property
    def last_run(self) -> AgentRun | None:
        """The run in progress, or the last one this agent ran (None before its first)."""
        return self._last_run

    @property
    def task(self) -> Task | None:
        """The task of the current (or last) run, with its result once it ended."""
        return self._last_run.task if self._last_run else None

    @property
    def steps(self) -> list[StepRecord]:
        """The steps of the current (or last) run."""
        return self._last_run.steps if self._last_run else []

    @property
    def chat_history(self) -> list[dict[str, Any]]:
        """The conversation of the current (or last) run, system prompt first."""
        return self._last_run.chat_history if self._last_run else []

    @property
    def msg_idx_of_new_task(self) -> int:
        """Where the current (or last) run's task message sits in `chat_history` (after any history)."""
        return self._last_run.msg_idx_of_new_task if self._last_run else 0

    @property
    def final_answer_found(self) -> bool:
        """Whether the current (or last) run ended with the model's final answer."""
        return self._last_run.final_answer_found if self._last_run else False

    @property
    def format_used(self) -> str | None:
        """The response format of the current (or last) run's last model reply (None: none asked yet)."""
        return self._last_run.format_used if self._last_run else None

    @property
    def usage_tracker(self) -> UsageTracker:
        """The model usage of the current (or last) run (empty before the first)."""
        return self._last_run.usage if self._last_run else UsageTracker()

    @property
    def artifacts(self) -> list[str]:
        """Files produced by the current (or last) run."""
        return list(self._last_run.output_files) if self._last_run else []

    @property
    def current_plan(self) -> str | None:
        """The plan of the current (or last) run (None without a planner)."""
        run = self._last_run
        return run.planner.plan if run is not None and run.planner is not None else None

    def get_usage_metrics(self) -> dict[str, Any]:
        """Tokens and cost of the current (or last) run, in total and per component."""
        return self.usage_tracker.metrics()

    def get_usage_report(self, include_breakdown: bool = True) -> str:
        """The usage of the current (or last) run as a short human-readable report."""
        return self.usage_tracker.report(include_breakdown)

    def get_history(self) -> str:
        """The current (or last) run's conversation without the system prompt, each message cut to
        `HISTORY_TRUNCATE_CHARS`."""
        return self._last_run.history_text(self.HISTORY_TRUNCATE_CHARS) if self._last_run else ""

    def response(
        self,
        rtype: ResponseType,
        value: Any,
        channel: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AgentResponse:
        """Build a response of this agent; a final one is also stored as the result of its last task."""
        if rtype == "final" and self._last_run is not None:
            self._last_run.task.result = value
            self._last_run.task.is_finished = True
        return self._response(rtype, value, channel, metadata)

    def _response(
        self,
        rtype: ResponseType,
        value: Any,
        channel: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AgentResponse:
        return AgentResponse(
            type=rtype,
            value=value,
            channel=channel or self.name or self.channel_name,
            metadata=metadata or {},
        )

    normalize_content = staticmethod(normalize_content)

    # ------------------------------------------------------------------ tools and prompts

    @property
    def _current_tools(self) -> dict[str, Tool]:
        """The tools of the current (or last) run; before the first, the allowed tools."""
        if self._last_run is not None:
            return dict(self._last_run.tools)
        return select_tools(self.tools, self.allowed_tools)

    @property
    def tool_name_to_func(self) -> dict[str, Tool]:
        """The tools callable in the current (or last) run (all allowed tools before the first)."""
        return self._current_tools

    @property
    def tool_names(self) -> set[str]:
        return set(self._current_tools)

    def get_tools_description(self, tools: list[Any] | None = None) -> str:
        """Describe `tools` (default: those of `tool_name_to_func`) for the model, required arguments marked."""
        chosen = [as_tool(t) for t in tools] if tools is not None else list(self._current_tools.values())
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

    @property
    def reserved_input_names(self) -> frozenset[str]:
        """Names `inputs` may not take (none here; CodeAct: its tools and the sandbox's builtins)."""
        return frozenset()

    def get_system_prompt_content(self, run: AgentRun) -> str:
        """The system prompt of `run`, rendered. Subclasses add their own placeholders."""
        template = self.system_prompt or "{persona}\n\nTools:\n{tools}"
        return prompts.render_template(
            template, persona=self.persona or "", tools=self.get_tools_description(list(run.tools.values()))
        )

    # ------------------------------------------------------------------ replies: how they are asked for and read

    def reply_mode(self) -> Mode:
        """How a run's replies are requested: a JSON format, or free text.

        An agent without native tool calls asks for JSON when told ``"native"`` or ``"json"``, or, on
        ``"auto"``, when litellm says the model supports a response schema. `ReActAgent` adds native calls.
        """
        if self.tool_calling == "native":
            return "json"
        if self.tool_calling != "auto":
            return self.tool_calling
        return "json" if supports(self.model_name, "response_schema") else "text"

    def _json_format(self, kind: str = "json_schema") -> dict[str, Any] | None:
        """The `response_format` of one kind: the reply schema as a JSON schema or a JSON object."""
        return response_format(kind, self.response_format_class.reply_schema(), f"{self.channel_name}_step")

    def format_candidates(self, mode: Mode) -> list[FormatKind]:
        """Response formats to try for text steps in `mode`, best first; ``"off"`` is free text, always last.

        ``auto`` asks for a schema when litellm says the model supports one, and probes an OpenAI-compatible
        server given by ``api_base`` (llama.cpp, vLLM, Ollama), whose support litellm cannot know. A format
        the server refuses is dropped for the rest of this agent's life, and the next one is tried.
        """
        probe = self.structured_output == "auto" and mode != "json"
        probe = probe and bool(self.litellm_params.get("api_base")) and not knows_model(self.model_name)
        return format_kinds(self.structured_output, mode, probe_server=probe, refused=self._formats_refused)

    async def _request_step(self, run: AgentRun) -> LLMReply:
        """Ask the model for the next step, in the best response format the server accepts."""
        refused: list[str] = []
        candidates = self.format_candidates(run.mode)
        for kind in candidates:
            try:
                reply = await self._call_model(run, response_format=self._json_format(kind))
            except LLMError as exc:
                if kind != "off" and refuses_format(exc) and kind != candidates[-1]:
                    refused.append(kind)
                    continue
                raise
            # Only a later success shows that the refused formats, not the request itself, were the problem.
            self._formats_refused |= frozenset(refused)
            run.format_used = kind
            return reply
        raise AssertionError("format_candidates() always ends with 'off'")  # pragma: no cover

    @abstractmethod
    def parse_text_response(self, text: str) -> ChatMessage:
        """Parse a model reply given as free text into this agent's structured reply."""

    @abstractmethod
    def parse_reply(self, text: str, run: AgentRun | None = None) -> StepReply:
        """A reply in any accepted form (see `kodeagent.parsing`), or `ResponseParseError` saying why not.

        `run` gives the tools the reply may call (default: those of `tool_name_to_func`).
        """

    @abstractmethod
    def expected_format(self) -> str:
        """The reply format shown to the model when its reply could not be used."""

    def format_error_observation(self, problem: str) -> str:
        """What the model is told when its reply could not be used: the problem, and the format to use."""
        return prompts.FORMAT_ERROR.format(error=problem.rstrip("."), expected=self.expected_format())

    # ------------------------------------------------------------------ run

    async def run(
        self,
        task: str,
        files: list[str] | None = None,
        task_id: str | None = None,
        max_iterations: int | None = None,
        recurrent_mode: bool = False,
        summarize_progress_on_failure: bool = True,
        chat_history: list[dict[str, Any]] | None = None,
        *,
        history: Sequence[Any] | None = None,
        inputs: dict[str, Any] | None = None,
        response_model: type[BaseModel] | None = None,
        allowed_tools: Sequence[str] | None = None,
    ) -> AsyncIterator[AgentResponse]:
        """Solve `task` step by step, yielding each step, logs, and finally the answer.

        Args:
            task: what to do.
            files: paths (or URLs) belonging to the task; CodeAct copies local files into the sandbox.
            task_id: an id for the task (a UUID if not given).
            max_iterations: steps for this run (default: the agent's `max_iterations`).
            recurrent_mode: prefix the task with the previous task and its result.
            summarize_progress_on_failure: when steps run out, ask the model to sum up what it found.
            chat_history: an OpenAI-format conversation to continue (its system message, if any, is
                replaced by this agent's).
            history: earlier turns (`ChatMessage`s or dicts, no system message) sent with every step.
            inputs: context variables shown to the model (and, in CodeAct, defined in the session).
            response_model: a pydantic model the final answer must validate into; a mismatch is told
                to the model, which then tries again.
            allowed_tools: names or patterns of tools allowed in this run (overrides the agent's).

        Raises:
            ValueError: empty task, too many files, recurrent_mode together with chat_history (or
                history), or a history that is not valid OpenAI chat format.
            AgentBusyError: this agent is running a task in another asyncio task.
            RetryError: a model call kept failing after `max_retries` retries.
        """
        args = RunArguments.check(
            max_files=self.MAX_FILES,
            reserved_inputs=self.reserved_input_names,
            task=task,
            files=files,
            task_id=task_id,
            max_iterations=max_iterations,
            recurrent_mode=recurrent_mode,
            summarize_progress_on_failure=summarize_progress_on_failure,
            chat_history=chat_history,
            history=history,
            inputs=inputs,
            response_model=response_model,
            allowed_tools=allowed_tools,
        )
        # An agent runs one task at a time, the one its `task`, `steps`, ... show. A run started while
        # another asyncio task is still running one is refused; a new run in the same task supersedes one
        # that was abandoned unfinished, and closes what that one holds open.
        owner = _current_task()
        previous = self._last_run
        if previous is not None and previous.busy_elsewhere(owner):
            raise AgentBusyError(
                f"this {type(self).__name__} is already running a task in another asyncio task; an agent "
                "runs one task at a time. Run parallel tasks on agent.clone() (or separate agents)."
            )
        if previous is not None and not previous.finished:
            await previous.release()
        run = self._new_run(args, previous=previous.task if previous else None, owner=owner)
        self._last_run = run
        async with aclosing(self._drive(run)) as responses:
            async for response in responses:
                yield response

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
        import sniffio

        try:
            sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            return anyio.run(lambda: self.arun(task, **options))
        raise ConfigurationError("run_sync() cannot be called from async code; use `await agent.arun(task)`")

    def _new_run(
        self, args: RunArguments, *, previous: Task | None = None, owner: asyncio.Task[Any] | None = None
    ) -> AgentRun:
        """A fresh run of `args` on this configuration: its own tools, usage, planner and observer."""
        usage = UsageTracker()
        allowed = args.allowed_tools if args.allowed_tools is not None else self.allowed_tools
        return AgentRun(
            args,
            limit=args.max_iterations or self.max_iterations,
            tools=select_tools(self.tools, allowed),
            observer=self.observer.for_run(),
            planner=self.planner.for_run(usage, self.retry_base_delay) if self.planner is not None else None,
            usage=usage,
            previous=previous,
            owner=owner,
        )

    async def _drive(self, run: AgentRun) -> AsyncGenerator[AgentResponse, None]:
        """`run` from start to end: its responses, the usage log, and last the final response."""
        trace = self.tracer_manager.start_trace(
            name=self.name or type(self).__name__, input=run.args.task, metadata={"task_id": run.task.id}
        )
        run.trace = trace
        completed = False
        try:
            async with aclosing(self._run_task(run)) as responses:
                async for response in responses:
                    yield response
            completed = True
        finally:
            run.finished = True
            await run.release()
            trace.end(
                output=run.final.value if run.final else None, error=None if completed else "run failed"
            )
            self.tracer_manager.flush()
            if not completed:
                with anyio.CancelScope(shield=True):
                    async for _ in self.post_run(run):
                        pass
        async for response in self.post_run(run):
            yield response
        final = run.final
        assert final is not None  # `completed` implies a final response
        final.metadata.setdefault("usage", run.usage.metrics()["total"])
        yield final

    async def _run_task(self, run: AgentRun) -> AsyncGenerator[AgentResponse, None]:
        """Setup, plan and steps; the run's `final` is set when this ends."""
        if self.filter_tools_for_task:
            await self._filter_tools(run)
        run.mode = self.reply_mode()
        self._build_conversation(run)
        async for item in self.pre_run(run):
            yield item
        if run.planner is not None:
            plan = await run.planner.create_plan(
                run.args.task, self.get_tools_description(list(run.tools.values()))
            )
            if plan:
                run.add_to_history({"role": "user", "content": prompts.PLAN_MESSAGE.format(plan=plan)})
                yield self._response("log", plan, channel="planner", metadata={"event": "plan"})
                await self._notify_plan(plan, 0)
        # closed here, in this task, when the consumer leaves early: a streaming step holds a task group
        async with aclosing(self._loop(run)) as items:
            async for item in items:
                yield item
        if run.final is None:
            await self._give_up(run)

    def _build_conversation(self, run: AgentRun) -> None:
        run.chat_history = [{"role": "system", "content": self.get_system_prompt_content(run)}]
        if run.args.chat_history is not None:
            messages = run.args.chat_history
            run.chat_history.extend(
                messages[1:] if messages and messages[0]["role"] == "system" else messages
            )
        if run.args.history is not None:
            run.chat_history.extend(run.args.history)
        run.msg_idx_of_new_task = len(run.chat_history)
        run.add_to_history(self._task_message(run, self._task_text(run)))

    async def _loop(self, run: AgentRun) -> AsyncGenerator[AgentResponse, None]:
        for iteration in range(1, run.limit + 1):
            run.task.steps_taken = iteration
            if (
                run.planner is not None
                and iteration > 1
                and run.planner.should_update(iteration - 1, run.trouble)
            ):
                plan = await run.planner.update_plan(run.args.task, recent_progress(run.steps))
                run.trouble = False
                if plan:
                    run.add_to_history({"role": "user", "content": prompts.PLAN_MESSAGE.format(plan=plan)})
                    yield self._response("log", plan, channel="planner", metadata={"event": "plan_update"})
                    await self._notify_plan(plan, iteration)
            async with aclosing(self._step(run, iteration)) as items:
                async for item in items:
                    yield item
            if run.final_answer_found:
                return
            if run.steps:
                note = run.observer.observe(run.steps[-1], run.limit - iteration)
                if note:
                    run.trouble = True
                    note = await run.observer.review(
                        note,
                        run.args.task,
                        recent_progress(run.steps),
                        litellm_params=self.litellm_params,
                        usage_tracker=run.usage,
                        max_retries=self.max_retries,
                        retry_base_delay=self.retry_base_delay,
                    )
                    run.add_to_history({"role": "user", "content": prompts.OBSERVER_NOTE.format(note=note)})
                    yield self._response("log", note, channel="observer", metadata={"event": "observer_note"})

    async def _give_up(self, run: AgentRun) -> None:
        summary = ""
        if run.args.summarize_progress_on_failure:
            try:
                summary = await self.salvage_response(run)
            except KodeAgentError as exc:
                summary = f"(no summary: {exc})"
        limit = run.limit
        text = f"The task was not finished within {limit} step{'s' if limit != 1 else ''}."
        if summary:
            text += f" What was found so far:\n{summary}"
        metadata = {"task_successful": False, "final_answer_found": False, "steps": limit}
        run.conclude(self._response("final", text, metadata=metadata))

    # ------------------------------------------------------------------ hooks

    async def pre_run(self, run: AgentRun) -> AsyncIterator[AgentResponse]:
        """Before the loop: nothing by default. Subclasses set up `run`'s resources here (closed by
        `AgentRun.release()` when the run ends)."""
        return
        yield  # pragma: no cover - makes this an async generator

    async def post_run(self, run: AgentRun) -> AsyncIterator[AgentResponse]:
        """After the loop (always, also on failure): report the run's model usage as a log response."""
        yield self._response(
            "log",
            run.usage.report(include_breakdown=False),
            channel="usage",
            metadata={"event": "usage", **run.usage.metrics()["total"]},
        )

    async def _notify_plan(self, plan: str, index: int) -> None:
        """Let `on_step` see a plan (or a revised plan) as a record of kind ``"plan"`` (not in `steps`)."""
        if self.on_step is not None:
            result = self.on_step(StepRecord(index=index, kind="plan", thought=plan))
            if hasattr(result, "__await__"):
                await result

    async def _notify_step(self, run: AgentRun, record: StepRecord) -> None:
        run.steps.append(record)
        if self.on_step is not None:
            result = self.on_step(record)
            if hasattr(result, "__await__"):
                await result

    # ------------------------------------------------------------------ steps

    async def _step(self, run: AgentRun, iteration: int) -> AsyncGenerator[AgentResponse, None]:
        """One step (`_step_responses`); with `stream` on, its token and output responses are yielded
        as they arrive, between its start and the step response."""
        if not self.stream:
            async for item in self._step_responses(run, iteration):
                yield item
            return
        send, receive = anyio.create_memory_object_stream[AgentResponse](math.inf)
        failure: list[BaseException] = []

        async def produce() -> None:
            async with send:
                run.emit = send.send
                try:
                    async for item in self._step_responses(run, iteration):
                        await send.send(item)
                except Exception as exc:  # re-raised below as itself, not inside an exception group
                    failure.append(exc)
                finally:
                    run.emit = None

        leaving = False
        async with anyio.create_task_group() as tg, receive:
            tg.start_soon(produce)
            try:
                async for item in receive:
                    yield item
            except GeneratorExit:  # the consumer left: stop the step (its code, its model call) here
                leaving = True
                tg.cancel_scope.cancel()
        if leaving:
            raise GeneratorExit
        if failure:
            raise failure[0]

    async def _step_responses(self, run: AgentRun, iteration: int) -> AsyncIterator[AgentResponse]:
        """One step: ask the model and read its reply; then finish, act on it (`_act`), or tell the model
        why its reply could not be used. Every way out yields the step's response and records it."""
        started = time.perf_counter()
        record = StepRecord(index=iteration)
        reply = await self._request_step(run)
        record.raw_reply = raw_reply_text(reply)
        try:
            message = self._read_reply(run, reply)
            record.thought = message.thought
            if message.is_final:
                answer: FinalAnswer | None = FinalAnswer(message.final_answer, message.task_successful)
            else:
                answer = await self._act(run, record, message)
        except ResponseParseError as exc:
            async for item in self._format_error(run, record, str(exc), started):
                yield item
            return
        if answer is not None:
            async for item in self._finish(run, record, answer, started):
                yield item
            return
        record.duration = time.perf_counter() - started
        yield self._response("step", record, metadata=self._step_metadata(run, iteration))
        await self._notify_step(run, record)

    def _read_reply(self, run: AgentRun, reply: LLMReply) -> StepReply:
        """The model's reply, added to the conversation and parsed (`ResponseParseError` if unusable)."""
        text = reply.content or ""
        run.add_to_history({"role": "assistant", "content": text})
        return self.parse_reply(text, run)

    @abstractmethod
    async def _act(self, run: AgentRun, record: StepRecord, message: StepReply) -> FinalAnswer | None:
        """Act on a reply that is not the final answer: fill `record` (action, observation, error) and add
        the observation to the conversation. Returns an answer the action produced, if any; raises
        `ResponseParseError` when the reply turns out to be unusable."""

    def _step_metadata(self, run: AgentRun, iteration: int, **extra: Any) -> dict[str, Any]:
        metadata = {"step": iteration, "mode": run.mode, **extra}
        if run.mode != "native":
            metadata["response_format"] = run.format_used
        return metadata

    async def _format_error(
        self, run: AgentRun, record: StepRecord, problem: str, started: float
    ) -> AsyncIterator[AgentResponse]:
        """The reply could not be used: tell the model why and in which format, and count the step."""
        record.error = f"unusable reply: {problem}"
        record.observation = self.format_error_observation(problem)
        run.add_to_history({"role": "user", "content": record.observation})
        record.duration = time.perf_counter() - started
        yield self._response(
            "step", record, metadata=self._step_metadata(run, record.index, parse_error=True)
        )
        await self._notify_step(run, record)

    async def _finish(
        self, run: AgentRun, record: StepRecord, answer: FinalAnswer, started: float
    ) -> AsyncIterator[AgentResponse]:
        """The model gave its final answer: accept it (validated into `response_model`) or say why not."""
        value, problem = validate_final(answer.value, run.response_model)
        if problem is not None:
            record.error = f"final answer rejected: {problem}"
            record.observation = prompts.RESPONSE_MODEL_ERROR.format(error=problem)
            run.add_to_history({"role": "user", "content": record.observation})
            record.duration = time.perf_counter() - started
            yield self._response(
                "step", record, metadata={"step": record.index, "response_model_error": True}
            )
            await self._notify_step(run, record)
            return
        record.is_final = True
        record.output = value
        record.duration = time.perf_counter() - started
        run.final_answer_found = True
        yield self._response("step", record, metadata=self._step_metadata(run, record.index))
        await self._notify_step(run, record)
        metadata = {
            "task_successful": bool(answer.successful),
            "final_answer_found": True,
            "steps": record.index,
        }
        run.conclude(self._response("final", value, metadata=metadata))

    # ------------------------------------------------------------------ model calls

    async def _call_model(
        self,
        run: AgentRun,
        messages: list[dict[str, Any]] | None = None,
        *,
        component: str = "agent",
        tools: list[dict[str, Any]] | None = None,
        response_format: dict[str, Any] | None = None,
    ) -> LLMReply:
        """One model call for `run` (its conversation unless `messages`), recorded in its usage and trace."""
        span = self.tracer_manager.start_span(run.trace, f"llm:{component}")
        emit = run.emit if component == "agent" else None  # only step replies are streamed
        on_delta: OnDelta | None = None
        on_retry: OnRetry | None = None
        if emit is not None:

            async def on_delta(text: str) -> None:
                await emit(self._response("token", text, metadata={"step": run.task.steps_taken}))

            async def on_retry(attempt: int, error: BaseException) -> None:
                note = f"the model call is being retried (attempt {attempt}): drop the partial reply streamed so far"
                metadata = {
                    "event": "retry",
                    "attempt": attempt,
                    "error": str(error),
                    "discard_partial": True,
                }
                await emit(self._response("log", note, channel="llm", metadata=metadata))

        try:
            reply = await call_llm(
                self.model_name,
                messages if messages is not None else self._mark_for_cache(run.chat_history),
                component=component,
                usage_tracker=run.usage,
                litellm_params=self.litellm_params,
                max_retries=self.max_retries,
                retry_base_delay=self.retry_base_delay,
                tools=tools,
                response_format=response_format,
                on_delta=on_delta,
                on_retry=on_retry,
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

    async def salvage_response(self, run: AgentRun) -> str:
        """When the steps run out: ask the model to sum up what was found and what is missing."""
        history = run.history_text(self.HISTORY_TRUNCATE_CHARS)
        prompt = prompts.SALVAGE_PROMPT.format(task=run.args.task, history=history)
        reply = await self._call_model(run, [{"role": "user", "content": prompt}], component="salvage")
        return (reply.content or "").strip()

    async def _filter_tools(self, run: AgentRun) -> None:
        """Let the model choose the tools relevant to the task (when `filter_tools_for_task` is set)."""
        if not run.tools:
            return
        tools = self.get_tools_description(list(run.tools.values()))
        prompt = prompts.TOOL_FILTER_PROMPT.format(task=run.args.task, tools=tools)
        reply = await self._call_model(run, [{"role": "user", "content": prompt}], component="tool_filter")
        text = reply.content or ""
        try:
            start, end = text.index("["), text.rindex("]") + 1
            names = json.loads(text[start:end])
        except ValueError:
            return  # the model did not answer with a list: keep every tool rather than guess
        if isinstance(names, list):
            chosen = {n for n in names if isinstance(n, str)}
            run.tools = {k: v for k, v in run.tools.items() if k in chosen}

    # ------------------------------------------------------------------ the task message

    def _task_text(self, run: AgentRun) -> str:
        parts = []
        if run.args.recurrent_mode and run.previous is not None:
            parts.append(
                prompts.RECURRENT_NOTE.format(
                    previous_task=run.previous.description,
                    previous_result=normalize_content(run.previous.result),
                )
            )
        parts.append(prompts.TASK_TEMPLATE.format(task=run.args.task.strip()))
        if run.msg_idx_of_new_task > 1 and self._continuation_note():
            parts.append(self._continuation_note())
        if run.inputs:
            rendered = "\n".join(
                f"- {k} = {truncate(json.dumps(v, ensure_ascii=False), 2000)}" for k, v in run.inputs.items()
            )
            parts.append(prompts.INPUTS_NOTE.format(inputs=rendered + self._inputs_suffix(run)))
        if run.task.files:
            parts.append(prompts.FILES_NOTE.format(files="\n".join(f"- {f}" for f in self._file_labels(run))))
        if run.response_model is not None:
            schema = json.dumps(run.response_model.model_json_schema(), ensure_ascii=False)
            parts.append(prompts.RESPONSE_MODEL_NOTE.format(schema=schema))
        return "\n".join(parts)

    def _inputs_suffix(self, run: AgentRun) -> str:
        """Said after the list of `inputs`: how this agent's replies refer to them (nothing by default)."""
        return ""

    def _continuation_note(self) -> str:
        """Said with the task when the run continues an earlier conversation (none by default)."""
        return ""

    def _file_labels(self, run: AgentRun) -> list[str]:
        return list(run.task.files)

    def _task_message(self, run: AgentRun, text: str) -> dict[str, Any]:
        """The task as a user message; with a vision model, local images are attached."""
        images = image_files(run.task.files)
        return user_message(text, images if images and self.is_visual_model else ())
