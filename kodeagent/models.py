"""Pydantic models at kodeagent's boundaries: what the agent yields, what the model replies, what a run used.

`ChatMessage` is one OpenAI-format message. `ReActChatMessage` and `CodeActChatMessage` are the shapes a
model's reply is parsed into; their `reply_schema()` is what we send as a JSON response format, so
the schema and the parser can never drift apart.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ResponseType = Literal["step", "final", "log", "token", "output"]


class AgentResponse(BaseModel):
    """One item yielded by `Agent.run()`.

    `type` is ``"step"`` (a completed thought/action/observation), ``"log"`` (progress worth showing,
    e.g. a plan or a retry) or ``"final"`` (the answer; always the last item of a run). With the
    agent's ``stream=True`` option, also ``"token"`` (a piece of the model's step reply as it arrives,
    the text in `value`) and ``"output"`` (CodeAct: text the step's code printed while it runs,
    ``metadata["stream"]`` is ``"stdout"`` or ``"stderr"``); they show progress only: the step that
    follows is what a run without streaming gives. A ``"log"`` with ``metadata["event"] == "retry"``
    says the reply streamed so far is dropped and asked for again. `channel` names
    the part of the agent that produced it (``"react"``, ``"codeact"``, ``"planner"``, ``"observer"``...).
    """

    type: ResponseType
    value: Any = None
    channel: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def rtype(self) -> ResponseType:
        """Alias of `type`, the name `Agent.response()` uses for it."""
        return self.type


class ChatMessage(BaseModel):
    """A message in OpenAI chat format (the format litellm speaks to every provider)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"] = "assistant"
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def to_openai(self) -> dict[str, Any]:
        """The dict litellm expects: only the standard keys that are set."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        for key in ("name", "tool_call_id", "tool_calls"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def reply_schema(cls) -> dict[str, Any]:
        """JSON schema of the reply fields the model must produce (none for a plain chat message)."""
        return {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}


class ReActChatMessage(ChatMessage):
    """A ReAct reply: a thought and either an action with JSON arguments, or ``FINISH`` with the answer."""

    thought: str = ""
    action: str | None = None
    args: str | dict[str, Any] | None = None
    input_args: dict[str, str] | None = None
    final_answer: Any = None
    task_successful: bool = False

    @property
    def is_final(self) -> bool:
        return (self.action or "").strip().upper() == "FINISH" or (
            self.final_answer is not None and not self.action
        )

    @classmethod
    def reply_schema(cls) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "thought": {"type": "string"},
                "action": {"type": "string"},
                "args": {"type": "string"},
                "input_args": {"type": "object", "additionalProperties": {"type": "string"}},
                "final_answer": {"type": "string"},
                "task_successful": {"type": "boolean"},
            },
            "required": ["thought", "action"],
        }


class CodeActChatMessage(ChatMessage):
    """A CodeAct reply: a thought and either Python code to run, or the final answer."""

    thought: str = ""
    code: str | None = None
    final_answer: Any = None
    task_successful: bool = False

    @property
    def is_final(self) -> bool:
        return self.final_answer is not None and not (self.code or "").strip()

    @classmethod
    def reply_schema(cls) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "thought": {"type": "string"},
                "code": {"type": "string"},
                "final_answer": {"type": "string"},
                "task_successful": {"type": "boolean"},
            },
            "required": ["thought"],
        }


class Task(BaseModel):
    """The task of one run and, once it ends, its outcome."""

    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    description: str
    files: list[str] = Field(default_factory=list)
    result: Any = None
    is_finished: bool = False
    is_error: bool = False
    steps_taken: int = 0
    output_files: list[str] = Field(default_factory=list)


class ToolCallRecord(BaseModel):
    """One tool call made during a step, with its outcome."""

    id: str | None = None
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    error: str | None = None
    duration: float = 0.0


class StepRecord(BaseModel):
    """What one step did: passed to `on_step` and carried in the step response's metadata."""

    index: int
    kind: Literal["step", "plan"] = Field(
        "step", description='"plan" for a plan or revised plan (given to on_step, not kept in steps)'
    )
    raw_reply: str | None = Field(
        None,
        description="What the model said, verbatim (native tool calls included as JSON), so that a "
        "step the agent could not use still shows why.",
    )
    thought: str = ""
    action: str | None = None
    code: str | None = None
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    observation: str | None = None
    output: Any = None
    is_final: bool = False
    error: str | None = None
    duration: float = 0.0
    cpu_seconds: float | None = Field(
        None,
        description="CPU seconds the step's code used in the sandbox (its result's usage); None without "
        "code, or where the backend did not measure it.",
    )


class UsageRecord(BaseModel):
    """Tokens and cost of one model call, attributed to the component that made it."""

    component: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = Field(0.0, description="dollars; None when litellm knows no price for the model")
    duration: float = 0.0
    attempts: int = 1

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
