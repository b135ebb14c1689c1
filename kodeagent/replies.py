"""How an agent asks its model for a step and reads the reply: the call, its response format, the parse.

The second layer of `Agent` (prompting -> replies -> loop -> compat -> agent). Replies are asked for in
the best response format the server accepts (`structured.py`), down to free text; a format the server
refuses is not asked for again in the agent's life. Only the model's own replies go through the
parsers; observations never do.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from . import prompts
from .conversation import mark_system_prompt_for_cache
from .errors import LLMError
from .llm import LLMReply, OnDelta, OnRetry, call_llm, knows_model, supports
from .models import ChatMessage
from .options import Mode, StructuredOutput, ToolCallingMode
from .prompting import Prompting
from .structured import FormatKind, format_kinds, refuses_format, response_format
from .tracing import AbstractTracerManager

if TYPE_CHECKING:
    from .run import AgentRun

__all__ = ["FinalAnswer", "Replies", "StepReply", "raw_reply_text"]


def raw_reply_text(reply: LLMReply) -> str:
    """The model's reply verbatim: its text, and its native tool calls as JSON after it."""
    text = reply.content or ""
    if reply.tool_calls:
        text += ("\n" if text else "") + json.dumps(reply.tool_calls, ensure_ascii=False)
    return text


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


class Replies(Prompting):
    """Model calls, the response format each step is asked in, and the parsing of replies."""

    litellm_params: dict[str, Any]
    max_retries: int
    retry_base_delay: float
    prompt_cache: bool | None
    tool_calling: ToolCallingMode
    structured_output: StructuredOutput
    tracer_manager: AbstractTracerManager
    _formats_refused: frozenset[str]

    # ------------------------------------------------------------------ which format a step is asked in

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

    # ------------------------------------------------------------------ reading the reply

    def _read_reply(self, run: AgentRun, reply: LLMReply) -> StepReply:
        """The model's reply, added to the conversation and parsed (`ResponseParseError` if unusable)."""
        text = reply.content or ""
        run.add_to_history({"role": "assistant", "content": text})
        return self.parse_reply(text, run)

    @abstractmethod
    def parse_text_response(self, text: str) -> ChatMessage:
        """Parse a model reply given as free text into this agent's structured reply."""

    @abstractmethod
    def parse_reply(self, text: str, run: AgentRun | None = None) -> StepReply:
        """A reply in any accepted form (see `kodeagent.parsing`), or `ResponseParseError` saying why not.

        `run` gives the tools the reply may call (default: those of the current run).
        """

    @abstractmethod
    def expected_format(self) -> str:
        """The reply format shown to the model when its reply could not be used."""

    def format_error_observation(self, problem: str) -> str:
        """What the model is told when its reply could not be used: the problem, and the format to use."""
        return prompts.FORMAT_ERROR.format(error=problem.rstrip("."), expected=self.expected_format())

    # ------------------------------------------------------------------ the call

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
