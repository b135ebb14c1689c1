"""How a run goes: setup, plan, steps, observer notes, and the final answer or giving up.

The third layer of `Agent` (prompting -> replies -> loop -> compat -> agent). `new_run()` makes the
`AgentRun` of one task on an agent's configuration and `drive()` takes it from start to end; both
`Agent.run()` and `Agent.as_tool()` (`delegation.py`) go through them. Everything a run opens (the
sandbox, its trace) is released in a `finally`, whatever way the run ends. A subclass says what
acting on a reply means (`_act`) and may set up and close resources around the loop (`pre_run`,
`post_run`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from abc import abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, ClassVar

import anyio

from . import prompts
from .errors import KodeAgentError, ResponseParseError
from .models import AgentResponse, StepRecord, Task
from .observer import Observer
from .options import OnStep
from .planner import Planner
from .replies import FinalAnswer, Replies, StepReply, raw_reply_text
from .run import AgentRun, RunArguments, recent_progress
from .structured import validate_final
from .tools import select_tools
from .usage import UsageTracker

__all__ = ["RunLoop", "drive", "new_run"]


def new_run(
    agent: RunLoop,
    args: RunArguments,
    *,
    previous: Task | None = None,
    owner: asyncio.Task[Any] | None = None,
) -> AgentRun:
    """A fresh run of `args` on `agent`'s configuration: its own tools, usage, planner and observer."""
    usage = UsageTracker()
    allowed = args.allowed_tools if args.allowed_tools is not None else agent.allowed_tools
    return AgentRun(
        args,
        limit=args.max_iterations or agent.max_iterations,
        tools=select_tools(agent.tools, allowed),
        observer=agent.observer.for_run(),
        planner=agent.planner.for_run(usage, agent.retry_base_delay) if agent.planner is not None else None,
        usage=usage,
        previous=previous,
        owner=owner,
    )


async def drive(agent: RunLoop, run: AgentRun) -> AsyncGenerator[AgentResponse, None]:
    """`run` from start to end: its responses, the usage log, and last the final response."""
    trace = agent.tracer_manager.start_trace(
        name=agent.name or type(agent).__name__, input=run.args.task, metadata={"task_id": run.task.id}
    )
    run.trace = trace
    completed = False
    try:
        async with aclosing(agent._run_task(run)) as responses:
            async for response in responses:
                yield response
        completed = True
    finally:
        run.finished = True
        await run.release()
        trace.end(output=run.final.value if run.final else None, error=None if completed else "run failed")
        agent.tracer_manager.flush()
        if not completed:
            with anyio.CancelScope(shield=True):
                async for _ in agent.post_run(run):
                    pass
    async for response in agent.post_run(run):
        yield response
    final = run.final
    assert final is not None  # `completed` implies a final response
    final.metadata.setdefault("usage", run.usage.metrics()["total"])
    yield final


class RunLoop(Replies):
    """The run loop on an agent's configuration; `_act` is the subclass's step."""

    HISTORY_TRUNCATE_CHARS: ClassVar[int] = 1000

    max_iterations: int
    filter_tools_for_task: bool
    on_step: OnStep | None
    stream: bool
    observer: Observer
    planner: Planner | None

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
