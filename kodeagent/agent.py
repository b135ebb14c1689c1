"""`Agent`: the loop every kodeagent agent runs.

`ReActAgent` and `CodeActAgent` are siblings under `Agent`: each says only what one of its steps is
(`_step`), how its replies read (`parse_reply`) and how it prompts; the run — setup, plan, steps,
observer notes, the final answer or giving up, usage — is here, once, on top of `AgentBase` (options,
tools, conversation, model calls). Design choices that hold for all:

* The system prompt is rendered once per run and stays the first message, unchanged, for the whole
  run; everything that changes (task, plan, observations, observer notes) is appended after it.
* Observations enter the conversation as `user` (or `tool`) messages and are never parsed as the
  model's words; only the model's own replies go through the reply parsers.
* Everything a run opens (the sandbox, traces) is released in a `finally`, whatever way the run ends.
* An agent holds one conversation: a second concurrent run raises `AgentBusyError`; `clone()` for more.
* Replies are asked for in the best response format the server accepts (`structured.py`), down to text.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import anyio
from pydantic import BaseModel

from . import prompts
from .agent_base import AgentBase, select_tools
from .conversation import validate_openai_history
from .delegation import agent_tool
from .errors import AgentBusyError, ConfigurationError, KodeAgentError, LLMError
from .llm import LLMReply, knows_model, supports
from .models import AgentResponse, ChatMessage, StepRecord, Task
from .options import Mode
from .structured import FormatKind, format_kinds, refuses_format, response_format, validate_final
from .tools import Tool

__all__ = ["Agent", "raw_reply_text", "select_tools"]


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


class _Outcome:
    """Carries the final response out of `_run_task` (kept apart from the responses it yields)."""

    def __init__(self, response: AgentResponse) -> None:
        self.response = response


class Agent(AgentBase, ABC):
    """Base of every agent: the run loop, on `AgentBase`'s configuration, tools, conversation and usage.

    Args:
        model_name: any litellm model string, e.g. ``"gemini/gemini-2.5-flash"``.
        **options: the `AgentOptions` every agent takes (tools, litellm_params, max_iterations,
            planner and observer, structured output, ...), documented there with their defaults.

    Attributes set after construction:
        retry_base_delay: seconds before the first retry of a model call (doubling after each).
        prompt_cache: mark the system prompt for prompt caching; None (default) does so for
            Anthropic models, which cache only marked prefixes.
    """

    def as_tool(self, name: str | None = None) -> Tool:
        """This agent as a tool another agent can call: ``task`` in, the final answer out.

        The tool's description is the agent's `purpose`, so the calling model knows what it can ask.
        Each call runs on a fresh `clone()` of this agent, so parallel calls (a manager's concurrent
        tool calls) never share a conversation; when the call ends, its model usage is added to the
        calling agent's usage under ``"<tool name>.<component>"``. A run that ends without an answer
        raises, which the caller sees as a failed tool call.
        """
        return agent_tool(self, name)

    # ------------------------------------------------------------------ replies: how they are asked for and read

    def reply_mode(self) -> Mode:
        """How this run's replies are requested: a JSON format, or free text.

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

    def format_candidates(self) -> list[FormatKind]:
        """Response formats to try for text steps, best first; ``"off"`` is free text, always last.

        ``auto`` asks for a schema when litellm says the model supports one, and probes an OpenAI-compatible
        server given by ``api_base`` (llama.cpp, vLLM, Ollama), whose support litellm cannot know. A format
        the server refuses is dropped for the rest of this agent's life, and the next one is tried.
        """
        probe = self.structured_output == "auto" and self._mode != "json"
        probe = probe and bool(self.litellm_params.get("api_base")) and not knows_model(self.model_name)
        return format_kinds(
            self.structured_output, self._mode, probe_server=probe, refused=self._formats_refused
        )

    async def _request_step(self) -> LLMReply:
        """Ask the model for the next step, in the best response format the server accepts."""
        refused: list[str] = []
        candidates = self.format_candidates()
        for kind in candidates:
            try:
                reply = await self._call_model(response_format=self._json_format(kind))
            except LLMError as exc:
                if kind != "off" and refuses_format(exc) and kind != candidates[-1]:
                    refused.append(kind)
                    continue
                raise
            # Only a later success shows that the refused formats, not the request itself, were the problem.
            self._formats_refused |= frozenset(refused)
            self.format_used = kind
            return reply
        raise AssertionError("format_candidates() always ends with 'off'")  # pragma: no cover

    @abstractmethod
    def parse_text_response(self, text: str) -> ChatMessage:
        """Parse a model reply given as free text into this agent's structured reply."""

    @abstractmethod
    def parse_reply(self, text: str) -> ChatMessage:
        """A reply in any accepted form (see `kodeagent.parsing`), or `ResponseParseError` saying why not."""

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
            RetryError: a model call kept failing after `max_retries` retries.
        """
        self._check_run_arguments(
            task, files, max_iterations, recurrent_mode, chat_history, history, inputs, response_model
        )
        # An agent holds one conversation at a time. A run started while another asyncio task is still
        # running one is refused (it would share history, steps and sandbox); a new run in the same task
        # supersedes one that was abandoned unfinished, and the token lets each run release only what it
        # opened itself.
        owner = _current_task()
        if self._owner is not None and self._owner is not owner and not self._owner.done():
            raise AgentBusyError(
                f"this {type(self).__name__} is already running a task in another asyncio task; an agent "
                "runs one task at a time. Run parallel tasks on agent.clone() (or separate agents)."
            )
        self._owner = owner
        token = object()
        self._run_token = token
        previous = self.task
        limit = max_iterations or self.max_iterations
        self._start_task(task, files, task_id, inputs, response_model, allowed_tools)
        self._start_task_trace(task)
        completed = False
        final: AgentResponse | None = None
        try:
            steps = self._run_task(
                task, previous, recurrent_mode, chat_history, history, limit, summarize_progress_on_failure
            )
            async with aclosing(steps):
                async for item in steps:
                    if isinstance(item, _Outcome):
                        final = item.response
                    else:
                        yield item
            completed = True
        finally:
            if self._run_token is token:
                self._owner = None
            await self._release_resources(token)
            if self.current_trace is not None:
                self.current_trace.end(
                    output=final.value if final else None, error=None if completed else "run failed"
                )
            self.tracer_manager.flush()
            if not completed:
                with anyio.CancelScope(shield=True):
                    async for _ in self.post_run():
                        pass
        async for item in self.post_run():
            yield item
        assert final is not None  # `completed` implies a final response
        final.metadata.setdefault("usage", self.get_usage_metrics()["total"])
        yield final

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

    def _start_task(
        self,
        task: str,
        files: list[str] | None,
        task_id: str | None,
        inputs: dict[str, Any] | None,
        response_model: type[BaseModel] | None,
        allowed_tools: Sequence[str] | None,
    ) -> None:
        self.task = Task(description=task, files=list(files or []))
        if task_id:
            self.task.id = task_id
        self.usage_tracker.reset()
        self.observer.reset()
        if self.planner is not None:
            self.planner.plan = None
            self.planner.retry_base_delay = self.retry_base_delay
        self.steps = []
        self.task_output_files = []
        self.final_answer_found = False
        self._final = None
        self._trouble = False
        self._inputs = dict(inputs or {})
        self._response_model = response_model
        allowed = list(allowed_tools) if allowed_tools is not None else self.allowed_tools
        self._run_tools = select_tools(self.tools, allowed)

    def _start_task_trace(self, task: str) -> None:
        self.current_trace = self.tracer_manager.start_trace(
            name=self.name or type(self).__name__,
            input=task,
            metadata={"task_id": self.task.id if self.task else None},
        )

    async def _run_task(
        self,
        task: str,
        previous: Task | None,
        recurrent_mode: bool,
        chat_history: list[dict[str, Any]] | None,
        history: Sequence[Any] | None,
        limit: int,
        summarize_progress_on_failure: bool,
    ) -> AsyncGenerator[AgentResponse | _Outcome, None]:
        """Setup, plan and steps; yields responses, and last an `_Outcome` holding the final response."""
        if self.filter_tools_for_task:
            await self._filter_tools(task)
        self._mode = self.reply_mode()
        self._build_conversation(task, previous, recurrent_mode, chat_history, history)
        async for item in self.pre_run():
            yield item
        if self.planner is not None:
            plan = await self.planner.create_plan(task, self.get_tools_description())
            if plan:
                self.add_to_history({"role": "user", "content": prompts.PLAN_MESSAGE.format(plan=plan)})
                yield self.response("log", plan, channel="planner", metadata={"event": "plan"})
                await self._notify_plan(plan, 0)
        async for item in self._loop(limit):
            yield item
        if self._final is not None:
            yield _Outcome(self._final)
        else:
            yield _Outcome(await self._give_up(limit, summarize_progress_on_failure))

    def _build_conversation(
        self,
        task: str,
        previous: Task | None,
        recurrent_mode: bool,
        chat_history: list[dict[str, Any]] | None,
        history: Sequence[Any] | None,
    ) -> None:
        self.init_history()
        if chat_history is not None:
            messages = validate_openai_history(chat_history)
            if messages and messages[0]["role"] == "system":
                messages = messages[1:]
            self.chat_history.extend(messages)
        if history is not None:
            self.chat_history.extend(validate_openai_history(history, what="history"))
        self.msg_idx_of_new_task = len(self.chat_history)
        self.add_to_history(self._task_message(self._task_text(task, previous, recurrent_mode)))

    async def _loop(self, limit: int) -> AsyncIterator[AgentResponse]:
        assert self.task is not None
        for iteration in range(1, limit + 1):
            self.task.steps_taken = iteration
            if (
                self.planner is not None
                and iteration > 1
                and self.planner.should_update(iteration - 1, self._trouble)
            ):
                plan = await self.planner.update_plan(self.task.description, self._recent_progress())
                self._trouble = False
                if plan:
                    self.add_to_history({"role": "user", "content": prompts.PLAN_MESSAGE.format(plan=plan)})
                    yield self.response("log", plan, channel="planner", metadata={"event": "plan_update"})
                    await self._notify_plan(plan, iteration)
            async for item in self._step(iteration):
                yield item
            if self.final_answer_found:
                return
            if self.steps:
                note = self.observer.observe(self.steps[-1], limit - iteration)
                if note:
                    self._trouble = True
                    note = await self.observer.review(
                        note,
                        self.task.description,
                        self._recent_progress(),
                        litellm_params=self.litellm_params,
                        usage_tracker=self.usage_tracker,
                        max_retries=self.max_retries,
                        retry_base_delay=self.retry_base_delay,
                    )
                    self.add_to_history({"role": "user", "content": prompts.OBSERVER_NOTE.format(note=note)})
                    yield self.response("log", note, channel="observer", metadata={"event": "observer_note"})

    def _recent_progress(self, last: int = 3) -> str:
        lines = []
        for step in self.steps[-last:]:
            what = step.code or step.action or ", ".join(c.name for c in step.tool_calls) or "(no action)"
            lines.append(
                f"Step {step.index}: {what[:300]}\n  -> {(step.error or step.observation or '')[:500]}"
            )
        return "\n".join(lines) or "(nothing yet)"

    async def _give_up(self, limit: int, summarize: bool) -> AgentResponse:
        summary = ""
        if summarize:
            try:
                summary = await self.salvage_response()
            except KodeAgentError as exc:
                summary = f"(no summary: {exc})"
        text = f"The task was not finished within {limit} step{'s' if limit != 1 else ''}."
        if summary:
            text += f" What was found so far:\n{summary}"
        return self.response(
            "final", text, metadata={"task_successful": False, "final_answer_found": False, "steps": limit}
        )

    # ------------------------------------------------------------------ hooks

    async def pre_run(self) -> AsyncIterator[AgentResponse]:
        """Before the loop: nothing by default. Subclasses set up task resources here."""
        return
        yield  # pragma: no cover - makes this an async generator

    async def post_run(self) -> AsyncIterator[AgentResponse]:
        """After the loop (always, also on failure): report the run's model usage as a log response."""
        yield self.response(
            "log",
            self.get_usage_report(include_breakdown=False),
            channel="usage",
            metadata={"event": "usage", **self.get_usage_metrics()["total"]},
        )

    async def _release_resources(self, token: object | None = None) -> None:
        """Release what the run opened (nothing by default). Called from `finally`; must be idempotent."""
        return

    async def _notify_plan(self, plan: str, index: int) -> None:
        """Let `on_step` see a plan (or a revised plan) as a record of kind ``"plan"`` (not in `steps`)."""
        if self.on_step is not None:
            result = self.on_step(StepRecord(index=index, kind="plan", thought=plan))
            if hasattr(result, "__await__"):
                await result

    async def _notify_step(self, record: StepRecord) -> None:
        self.steps.append(record)
        if self.on_step is not None:
            result = self.on_step(record)
            if hasattr(result, "__await__"):
                await result

    # ------------------------------------------------------------------ steps

    @abstractmethod
    def _step(self, iteration: int) -> AsyncIterator[AgentResponse]:
        """One step: ask the model, act on its reply, and yield the step's response (an async generator).

        A step ends the run by calling `_finish`; it records itself with `_notify_step`.
        """

    def _step_metadata(self, iteration: int, **extra: Any) -> dict[str, Any]:
        metadata = {"step": iteration, "mode": self._mode, **extra}
        if self._mode != "native":
            metadata["response_format"] = self.format_used
        return metadata

    async def _format_error(
        self, record: StepRecord, problem: str, started: float
    ) -> AsyncIterator[AgentResponse]:
        """The reply could not be used: tell the model why and in which format, and count the step."""
        record.error = f"unusable reply: {problem}"
        record.observation = self.format_error_observation(problem)
        self.add_to_history({"role": "user", "content": record.observation})
        record.duration = time.perf_counter() - started
        yield self.response("step", record, metadata=self._step_metadata(record.index, parse_error=True))
        await self._notify_step(record)

    async def _finish(
        self, record: StepRecord, answer: Any, successful: bool, started: float
    ) -> AsyncIterator[AgentResponse]:
        """The model gave its final answer: accept it (validated into `response_model`) or say why not."""
        value, problem = self._accept_final(answer)
        if problem is not None:
            record.error = f"final answer rejected: {problem}"
            record.observation = prompts.RESPONSE_MODEL_ERROR.format(error=problem)
            self.add_to_history({"role": "user", "content": record.observation})
            record.duration = time.perf_counter() - started
            yield self.response("step", record, metadata={"step": record.index, "response_model_error": True})
            await self._notify_step(record)
            return
        record.is_final = True
        record.output = value
        record.duration = time.perf_counter() - started
        self.final_answer_found = True
        yield self.response("step", record, metadata=self._step_metadata(record.index))
        await self._notify_step(record)
        self._final = self.response(
            "final",
            value,
            metadata={"task_successful": bool(successful), "final_answer_found": True, "steps": record.index},
        )

    def _accept_final(self, answer: Any) -> tuple[Any, str | None]:
        """Validate a final answer into `response_model` when one is set: (value, error or None)."""
        return validate_final(answer, self._response_model)
