"""`ReActAgent`: thought, action, observation, until the model says FINISH.

How the model's step arrives depends on what litellm says the model supports:

* ``native``: the provider's function calling; several tool calls in one step run concurrently, and a
  reply without tool calls is the answer.
* ``json``: a JSON response format (schema-constrained where the provider supports it).
* ``text``: no constraint; the reply is parsed from JSON if it contains some, else from
  ``Thought:/Action:/Args:`` prose.

`run()` (shared with CodeAct) is the step loop: setup, plan, steps, observer notes, and the final
answer, with the executor and traces released in a ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any, ClassVar, Literal

import anyio
from pydantic import BaseModel

from . import prompts
from .agent import Agent, OnStep, ToolCallingMode, select_tools, validate_openai_history
from .errors import (
    AgentBusyError,
    ConfigurationError,
    KodeAgentError,
    LLMError,
    ResponseParseError,
    ToolArgumentError,
)
from .llm import knows_model, names_response_format, supports
from .models import AgentResponse, ChatMessage, ReActChatMessage, StepRecord, Task, ToolCallRecord
from .observer import Observer
from .parsing import REACT_FORMAT, parse_react_reply, parse_react_text
from .prompts import render_template
from .text import cap_text, neutralize_control
from .tools import Tool, to_jsonable
from .tracing import TracingType
from .usage import CALLER_USAGE

Mode = Literal["native", "json", "text"]
StructuredOutput = Literal["auto", "json_schema", "json_object", "off"]


def _refuses_format(exc: LLMError) -> bool:
    """The server rejected the request's response_format: 422, or a 400/500 whose message names it
    (llama-cpp-python's server answers an unsupported type with a 500 carrying the validation error)."""
    cause = exc.__cause__
    status = getattr(cause, "status_code", None)
    if status == 422:  # a validation error of the request (FastAPI servers; litellm may drop the body)
        return True
    return status in (400, 500) and names_response_format(cause)


def _current_task() -> Any:
    """The asyncio task running this code (None outside asyncio): who owns a run in progress."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def raw_reply_text(reply: Any) -> str:
    """The model's reply verbatim: its text, and its native tool calls as JSON after it."""
    text = reply.content or ""
    if reply.tool_calls:
        text += ("\n" if text else "") + json.dumps(reply.tool_calls, ensure_ascii=False)
    return text


class _Outcome:
    """Carries the final response out of `_run_task` (kept apart from the responses it yields)."""

    def __init__(self, response: AgentResponse) -> None:
        self.response = response


class ReActAgent(Agent):
    """Reasoning and acting with tools: thought, action, observation, until FINISH.

    Extra args (beyond `Agent`'s):
        tool_calling: ``"auto"`` (ask litellm what the model supports), or force ``"native"``,
            ``"json"`` or ``"text"``.
        structured_output: how replies that are not native tool calls are constrained:
            ``"json_schema"`` (the reply schema as litellm's ``response_format``), ``"json_object"``
            (``{"type": "json_object", "schema": ...}``, which llama.cpp's server enforces), ``"off"``
            (free text, parsed leniently), or ``"auto"``: a schema when litellm knows the model supports
            one or an ``api_base`` server may, each refused format falling back to the next, down to text.
    """

    response_format_class: ClassVar[type[ChatMessage]] = ReActChatMessage
    channel_name: ClassVar[str] = "react"
    TOOL_OUTPUT_LIMIT: ClassVar[int] = 8000

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
        tool_calling: ToolCallingMode = "auto",
        structured_output: StructuredOutput = "auto",
    ) -> None:
        super().__init__(
            model_name,
            name=name,
            description=description,
            tools=tools,
            litellm_params=litellm_params,
            persona=persona,
            system_prompt=system_prompt,
            max_iterations=max_iterations,
            filter_tools_for_task=filter_tools_for_task,
            max_retries=max_retries,
            work_dir=work_dir,
            tracing_type=tracing_type,
            allowed_tools=allowed_tools,
            on_step=on_step,
            use_planner=use_planner,
            planning_interval=planning_interval,
            observer=observer,
        )
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
        self._mode: Mode = "text"
        self._final: AgentResponse | None = None
        self._trouble = False
        self._run_token: object | None = None

    def _reset_state(self) -> None:
        super()._reset_state()
        self._mode = "text"
        self._final = None
        self._trouble = False
        self._run_token = None
        self._owner: Any = None

    # ------------------------------------------------------------------ modes and prompts

    def reply_mode(self) -> Mode:
        """How this run's replies are requested: native tool calls, a JSON format, or free text."""
        if self.tool_calling != "auto":
            mode: Mode = self.tool_calling  # type: ignore[assignment]
        elif supports(self.model_name, "function_calling"):
            mode = "native"
        elif supports(self.model_name, "response_schema"):
            mode = "json"
        else:
            mode = "text"
        return mode

    def _default_template(self) -> str:
        return prompts.REACT_NATIVE_SYSTEM_PROMPT if self._mode == "native" else prompts.REACT_SYSTEM_PROMPT

    def get_system_prompt_content(self) -> str:
        return render_template(
            self.system_prompt or self._default_template(),
            persona=self.persona or "",
            tools=self.get_tools_description(),
        )

    def _json_format(self, kind: str = "json_schema") -> dict[str, Any] | None:
        """The `response_format` of one kind: the reply schema as a JSON schema or a JSON object."""
        schema = self.response_format_class.reply_schema()
        if kind == "json_schema":
            return {
                "type": "json_schema",
                "json_schema": {"name": f"{self.channel_name}_step", "schema": schema},
            }
        if kind == "json_object_schema":  # llama.cpp's server constrains the output to `schema`
            return {"type": "json_object", "schema": schema}
        if kind == "json_object":
            return {"type": "json_object"}
        return None

    def format_candidates(self) -> list[str]:
        """Response formats to try for text steps, best first; ``"off"`` is free text, always last.

        ``auto`` asks for a schema when litellm says the model supports one, and probes an OpenAI-compatible
        server given by ``api_base`` (llama.cpp, vLLM, Ollama), whose support litellm cannot know. A format
        the server refuses is dropped for the rest of this agent's life, and the next one is tried.
        """
        chosen = self.structured_output
        if chosen == "off":
            kinds = ["off"]
        elif chosen == "json_schema":
            kinds = ["json_schema", "off"]
        elif chosen == "json_object":
            kinds = ["json_object_schema", "json_object", "off"]
        elif self._mode == "json" or (
            self.litellm_params.get("api_base") and not knows_model(self.model_name)
        ):
            kinds = ["json_schema", "json_object_schema", "json_object", "off"]
        else:
            kinds = ["off"]
        return [k for k in kinds if k not in self._formats_refused] or ["off"]

    def parse_text_response(self, text: str) -> ChatMessage:
        """The prose fallback: ``Thought:/Action:/Args:`` or ``Thought:/Answer:/Successful:``."""
        return parse_react_text(text)

    def parse_reply(self, text: str) -> ChatMessage:
        """A reply in any accepted form (see `kodeagent.parsing`); the run's tools are checked by name
        and required arguments. Raises `ResponseParseError` naming the problem."""
        return parse_react_reply(text, self._run_tools)

    def expected_format(self) -> str:
        """The reply format shown to the model when its reply could not be used."""
        return REACT_FORMAT

    def format_error_observation(self, problem: str) -> str:
        """What the model is told when its reply could not be used: the problem, and the format to use."""
        return prompts.FORMAT_ERROR.format(error=problem.rstrip("."), expected=self.expected_format())

    # ------------------------------------------------------------------ run

    async def run(  # type: ignore[override]
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

    def _inputs_suffix(self) -> str:
        return "" if self._mode == "native" else "\n" + prompts.REACT_INPUTS_NOTE

    def _resolve_input_args(self, args: Any, input_args: dict[str, str] | None) -> Any:
        """Fill tool arguments named in `input_args` from the run's `inputs` (values passed by reference)."""
        if not input_args:
            return args
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return args  # the tool's validation reports the broken JSON
        if not isinstance(args, dict):
            return args
        merged = dict(args)
        for param, name in input_args.items():
            if name not in self._inputs:
                known = ", ".join(sorted(self._inputs)) or "none"
                raise ToolArgumentError(
                    f"input_args names {name!r}, which is not a context variable (known: {known})"
                )
            merged[param] = self._inputs[name]
        return merged

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

    async def post_run(self) -> AsyncIterator[AgentResponse]:
        """After the loop: report the run's model usage as a log response."""
        yield self.response(
            "log",
            self.get_usage_report(include_breakdown=False),
            channel="usage",
            metadata={"event": "usage", **self.get_usage_metrics()["total"]},
        )

    async def _release_resources(self, token: object | None = None) -> None:
        """Release what the run opened. Called from `finally`; must be idempotent."""

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

    # ------------------------------------------------------------------ one step

    async def _request_step(self) -> Any:
        if self._mode == "native":
            schemas = [t.openai_schema() for t in self._run_tools.values()]
            return await self._call_model(tools=schemas or None)
        refused: list[str] = []
        candidates = self.format_candidates()
        for kind in candidates:
            try:
                reply = await self._call_model(response_format=self._json_format(kind))
            except LLMError as exc:
                if kind != "off" and _refuses_format(exc) and kind != candidates[-1]:
                    refused.append(kind)
                    continue
                raise
            # Only a later success shows that the refused formats, not the request itself, were the problem.
            self._formats_refused |= frozenset(refused)
            self.format_used = kind
            return reply
        raise AssertionError("format_candidates() always ends with 'off'")  # pragma: no cover

    async def _step(self, iteration: int) -> AsyncIterator[AgentResponse]:
        started = time.perf_counter()
        record = StepRecord(index=iteration)
        reply = await self._request_step()
        record.raw_reply = raw_reply_text(reply)
        if self._mode == "native" and reply.tool_calls:
            self.add_to_history(
                {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
            )
            record.thought = reply.content or ""
            calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in reply.tool_calls]
            record.tool_calls = await self.execute_tool_calls(calls)
            texts = []
            for call in record.tool_calls:
                text = self._tool_observation(call)
                texts.append(f"{call.name}: {text}")
                self.add_to_history({"role": "tool", "tool_call_id": call.id, "content": text})
            record.observation = "\n".join(texts)
            record.error = "; ".join(c.error for c in record.tool_calls if c.error) or None
        else:
            text = reply.content or ""
            self.add_to_history({"role": "assistant", "content": text})
            try:
                message = self.parse_reply(text)
            except ResponseParseError as exc:
                if self._mode == "native" and text.strip():
                    message = ReActChatMessage(
                        action="FINISH", final_answer=text.strip(), task_successful=True
                    )
                else:
                    async for item in self._format_error(record, str(exc), started):
                        yield item
                    return
            assert isinstance(message, ReActChatMessage)
            record.thought = message.thought
            if message.is_final:
                async for item in self._finish(
                    record, message.final_answer, message.task_successful, started
                ):
                    yield item
                return
            record.action = message.action
            try:
                arguments = self._resolve_input_args(message.args, message.input_args)
            except ToolArgumentError as exc:
                call = ToolCallRecord(name=message.action or "", error=str(exc))
            else:
                [call] = await self.execute_tool_calls([(None, message.action or "", arguments)])
            record.tool_calls = [call]
            record.observation = self._tool_observation(call)
            record.error = call.error
            self.add_to_history({"role": "user", "content": f"Observation: {record.observation}"})
        record.duration = time.perf_counter() - started
        yield self.response("step", record, metadata=self._step_metadata(iteration))
        await self._notify_step(record)

    def _step_metadata(self, iteration: int, **extra: Any) -> dict[str, Any]:
        metadata = {"step": iteration, "mode": self._mode, **extra}
        if self._mode != "native":
            metadata["response_format"] = self.format_used
        return metadata

    async def _format_error(
        self, record: StepRecord, problem: str, started: float
    ) -> AsyncIterator[AgentResponse]:
        record.error = f"unusable reply: {problem}"
        record.observation = self.format_error_observation(problem)
        self.add_to_history({"role": "user", "content": record.observation})
        record.duration = time.perf_counter() - started
        yield self.response("step", record, metadata=self._step_metadata(record.index, parse_error=True))
        await self._notify_step(record)

    async def _finish(
        self, record: StepRecord, answer: Any, successful: bool, started: float
    ) -> AsyncIterator[AgentResponse]:
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

    # ------------------------------------------------------------------ tools

    async def execute_tool_calls(self, calls: list[tuple[str | None, str, Any]]) -> list[ToolCallRecord]:
        """Run tool calls concurrently; each failure is recorded on its call, never raised."""
        results: list[ToolCallRecord] = [ToolCallRecord(id=c[0], name=c[1] or "") for c in calls]

        async def one(index: int, arguments: Any) -> None:
            record = results[index]
            started = time.perf_counter()
            tool = self._run_tools.get(record.name)
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments) if arguments.strip() else {}
                    record.args = parsed if isinstance(parsed, dict) else {"value": parsed}
                except ValueError:
                    record.args = {"raw": arguments}
            elif isinstance(arguments, dict):
                record.args = arguments
            if tool is None:
                available = ", ".join(sorted(self._run_tools)) or "none"
                record.error = f"there is no tool named {record.name!r}; the tools are: {available}"
            else:
                caller = CALLER_USAGE.set(self.usage_tracker)
                try:
                    record.result = to_jsonable(await tool.ainvoke(arguments))
                except ToolArgumentError as exc:
                    record.error = str(exc)
                except Exception as exc:  # the tool's failure is the model's observation
                    record.error = f"{type(exc).__name__}: {exc}"
                finally:
                    CALLER_USAGE.reset(caller)
            record.duration = time.perf_counter() - started

        async with anyio.create_task_group() as group:
            for i, call in enumerate(calls):
                group.start_soon(one, i, call[2])
        return results

    def _tool_observation(self, call: ToolCallRecord) -> str:
        if call.error:
            text = f"Error calling tool {call.name!r}: {call.error}"
        elif isinstance(call.result, str):
            text = call.result
        else:
            text = json.dumps(call.result, ensure_ascii=False)
        return cap_text(neutralize_control(text), self.TOOL_OUTPUT_LIMIT)
