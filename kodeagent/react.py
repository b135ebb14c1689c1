"""`ReActAgent`: thought, action, observation, until the model says FINISH.

How the model's step arrives depends on what litellm says the model supports:

* ``native``: the provider's function calling; several tool calls in one step run concurrently, and a
  reply without tool calls is the answer.
* ``json``: a JSON response format (schema-constrained where the provider supports it).
* ``text``: no constraint; the reply is parsed from JSON if it contains some, else from
  ``Thought:/Action:/Args:`` prose.

The run itself (setup, plan, steps, observer notes, the answer) is `Agent`'s; this module is what a
ReAct step is: a tool call, its observation, and the references (`input_args`) to the run's inputs.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar

import anyio

from . import prompts
from .agent import Agent
from .errors import ResponseParseError, ToolArgumentError
from .llm import LLMReply, supports
from .models import ChatMessage, ReActChatMessage, StepRecord, ToolCallRecord
from .options import Mode
from .parsing import REACT_FORMAT, parse_react_reply, parse_react_text
from .prompts import render_template
from .replies import FinalAnswer, StepReply
from .run import AgentRun
from .text import cap_text, neutralize_control
from .tools import to_jsonable
from .usage import CALLER_USAGE


class ReActAgent(Agent):
    """Reasoning and acting with tools: thought, action, observation, until FINISH.

    Takes the `AgentOptions` (`tool_calling` and `structured_output` choose how its steps are asked
    for); it adds no options of its own.
    """

    response_format_class: ClassVar[type[ChatMessage]] = ReActChatMessage
    channel_name: ClassVar[str] = "react"
    TOOL_OUTPUT_LIMIT: ClassVar[int] = 8000

    # ------------------------------------------------------------------ modes and prompts

    def reply_mode(self) -> Mode:
        """How a run's replies are requested: native tool calls, a JSON format, or free text."""
        if self.tool_calling == "native" or (
            self.tool_calling == "auto" and supports(self.model_name, "function_calling")
        ):
            return "native"
        return super().reply_mode()

    def get_system_prompt_content(self, run: AgentRun) -> str:
        """The system prompt of `run`: ReAct's (its native-calls variant in native mode), or `system_prompt`."""
        template = prompts.REACT_NATIVE_SYSTEM_PROMPT if run.mode == "native" else prompts.REACT_SYSTEM_PROMPT
        return render_template(
            self.system_prompt or template,
            persona=self.persona or "",
            tools=self.get_tools_description(list(run.tools.values())),
        )

    def parse_text_response(self, text: str) -> ChatMessage:
        """The prose fallback: ``Thought:/Action:/Args:`` or ``Thought:/Answer:/Successful:``."""
        return parse_react_text(text)

    def parse_reply(self, text: str, run: AgentRun | None = None) -> ReActChatMessage:
        """A reply in any accepted form (see `kodeagent.parsing`); the tools (of `run`, or those of
        `tool_name_to_func`) are checked by name and required arguments. Raises `ResponseParseError`
        naming the problem."""
        return parse_react_reply(text, run.tools if run is not None else self._current_tools)

    def expected_format(self) -> str:
        """The reply format shown to the model when its reply could not be used."""
        return REACT_FORMAT

    def _inputs_suffix(self, run: AgentRun) -> str:
        return "" if run.mode == "native" else "\n" + prompts.REACT_INPUTS_NOTE

    def _resolve_input_args(self, run: AgentRun, args: Any, input_args: dict[str, str] | None) -> Any:
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
            if name not in run.inputs:
                known = ", ".join(sorted(run.inputs)) or "none"
                raise ToolArgumentError(
                    f"input_args names {name!r}, which is not a context variable (known: {known})"
                )
            merged[param] = run.inputs[name]
        return merged

    # ------------------------------------------------------------------ one step

    async def _request_step(self, run: AgentRun) -> LLMReply:
        if run.mode == "native":
            schemas = [t.openai_schema() for t in run.tools.values()]
            return await self._call_model(run, tools=schemas or None)
        return await super()._request_step(run)

    def _read_reply(self, run: AgentRun, reply: LLMReply) -> StepReply:
        """Native tool calls are the reply as they came; in native mode, text that is no step is the answer."""
        if run.mode == "native" and reply.tool_calls:
            run.add_to_history(
                {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
            )
            return ReActChatMessage(
                content=reply.content, tool_calls=reply.tool_calls, thought=reply.content or ""
            )
        try:
            return super()._read_reply(run, reply)
        except ResponseParseError:
            text = (reply.content or "").strip()
            if run.mode == "native" and text:
                return ReActChatMessage(action="FINISH", final_answer=text, task_successful=True)
            raise

    async def _act(self, run: AgentRun, record: StepRecord, message: StepReply) -> FinalAnswer | None:
        """Call the tool the reply names (or, natively, every tool it calls, concurrently)."""
        assert isinstance(message, ReActChatMessage)
        if run.mode == "native" and message.tool_calls:
            calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.tool_calls]
            record.tool_calls = await self.execute_tool_calls(run, calls)
            texts = []
            for call in record.tool_calls:
                text = self._tool_observation(call)
                texts.append(f"{call.name}: {text}")
                run.add_to_history({"role": "tool", "tool_call_id": call.id, "content": text})
            record.observation = "\n".join(texts)
            record.error = "; ".join(c.error for c in record.tool_calls if c.error) or None
            return None
        record.action = message.action
        try:
            arguments = self._resolve_input_args(run, message.args, message.input_args)
        except ToolArgumentError as exc:
            call = ToolCallRecord(name=message.action or "", error=str(exc))
        else:
            [call] = await self.execute_tool_calls(run, [(None, message.action or "", arguments)])
        record.tool_calls = [call]
        record.observation = self._tool_observation(call)
        record.error = call.error
        run.add_to_history({"role": "user", "content": f"Observation: {record.observation}"})
        return None

    # ------------------------------------------------------------------ tools

    async def execute_tool_calls(
        self, run: AgentRun, calls: list[tuple[str | None, str, Any]]
    ) -> list[ToolCallRecord]:
        """Run tool calls of `run` concurrently; each failure is recorded on its call, never raised."""
        results: list[ToolCallRecord] = [ToolCallRecord(id=c[0], name=c[1] or "") for c in calls]

        async def one(index: int, arguments: Any) -> None:
            record = results[index]
            started = time.perf_counter()
            tool = run.tools.get(record.name)
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments) if arguments.strip() else {}
                    record.args = parsed if isinstance(parsed, dict) else {"value": parsed}
                except ValueError:
                    record.args = {"raw": arguments}
            elif isinstance(arguments, dict):
                record.args = arguments
            if tool is None:
                available = ", ".join(sorted(run.tools)) or "none"
                record.error = f"there is no tool named {record.name!r}; the tools are: {available}"
            else:
                caller = CALLER_USAGE.set(run.usage)
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
