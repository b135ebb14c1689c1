"""One run of an agent: its arguments, checked once (`RunArguments`), and its state (`AgentRun`).

An `Agent` is configuration; everything a run reads and writes — the conversation, the steps, the
answer, the usage, the sandbox it holds open, who owns it — lives on the `AgentRun` it creates. A new
run is a new object, so nothing is reset, and two runs of one agent (its own and those of its
`as_tool()` calls) never share state.
"""

from __future__ import annotations

import asyncio
import json
import keyword
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

from .conversation import render_history, validate_openai_history
from .models import AgentResponse, ChatMessage, StepRecord, Task
from .observer import Observer
from .options import Mode
from .planner import Planner
from .tools import Tool
from .tracing import AbstractObservation
from .usage import UsageTracker

if TYPE_CHECKING:
    from sandboxes import Executor

__all__ = ["AgentRun", "RunArguments"]


class RunArguments(BaseModel):
    """The arguments of one `Agent.run()`, checked together before anything starts (see `run()`).

    Built with `RunArguments.check()`, which takes what the agent adds to the checks (`max_files`, and
    the names `inputs` may not take) and raises a `ValueError` naming the first problem. Histories are
    kept as validated OpenAI-format dicts.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    task: str
    files: list[str] = []
    task_id: str | None = None
    max_iterations: int | None = None
    recurrent_mode: bool = False
    summarize_progress_on_failure: bool = True
    chat_history: list[dict[str, Any]] | None = None
    history: list[dict[str, Any]] | None = None
    inputs: dict[str, Any] = {}
    response_model: type[BaseModel] | None = None
    allowed_tools: list[str] | None = None

    @classmethod
    def check(
        cls, *, max_files: int, reserved_inputs: frozenset[str] = frozenset(), **arguments: Any
    ) -> RunArguments:
        """`arguments` checked, or a `ValueError` saying what is wrong with the first bad one.

        `reserved_inputs` are names an input may not take (CodeAct: its tools and sandbox builtins).
        """
        context = {"max_files": max_files, "reserved_inputs": reserved_inputs}
        try:
            return cls.model_validate(arguments, context=context)
        except ValidationError as exc:
            first = exc.errors()[0]
            ours = first.get("ctx", {}).get("error")
            if isinstance(ours, ValueError):  # one of the checks below: its message as it was written
                raise ValueError(str(ours)) from None
            where = ".".join(str(part) for part in first["loc"]) or "run()"
            raise ValueError(f"{where}: {first['msg']}") from None

    @field_validator("task", mode="before")
    @classmethod
    def _task(cls, task: Any) -> Any:
        if not isinstance(task, str) or not task.strip():
            raise ValueError("task must be a non-empty string")
        return task

    @field_validator("files", mode="before")
    @classmethod
    def _files(cls, files: Any) -> Any:
        return [] if files is None else files

    @field_validator("files")
    @classmethod
    def _not_too_many_files(cls, files: list[str], info: ValidationInfo) -> list[str]:
        limit = (info.context or {}).get("max_files")
        if limit is not None and len(files) > limit:
            raise ValueError(f"too many files: {len(files)} given, at most {limit} per task")
        return files

    @field_validator("max_iterations")
    @classmethod
    def _positive(cls, max_iterations: int | None) -> int | None:
        if max_iterations is not None and max_iterations < 1:
            raise ValueError(f"max_iterations must be at least 1, got {max_iterations}")
        return max_iterations

    @field_validator("chat_history", mode="before")
    @classmethod
    def _chat_history(cls, chat_history: Any) -> Any:
        return None if chat_history is None else validate_openai_history(chat_history)

    @field_validator("history", mode="before")
    @classmethod
    def _history(cls, history: Any) -> Any:
        if history is None:
            return None
        messages = validate_openai_history(history, what="history")
        for i, message in enumerate(messages):
            if message["role"] == "system":
                raise ValueError(f"history[{i}] is a system message; history holds earlier turns only")
        return messages

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, inputs: Any, info: ValidationInfo) -> Any:
        if inputs is None:
            return {}
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
        clashes = sorted(set(inputs) & (info.context or {}).get("reserved_inputs", frozenset()))
        if clashes:
            raise ValueError(
                f"inputs {clashes} would hide a tool or builtin of the same name in the sandbox; rename them"
            )
        return dict(inputs)

    @field_validator("response_model", mode="before")
    @classmethod
    def _response_model(cls, response_model: Any) -> Any:
        if response_model is not None and not (
            isinstance(response_model, type) and issubclass(response_model, BaseModel)
        ):
            raise ValueError("response_model must be a pydantic BaseModel subclass")
        return response_model

    @model_validator(mode="after")
    def _combinations(self) -> RunArguments:
        if self.recurrent_mode and self.chat_history is not None:
            raise ValueError("recurrent_mode and chat_history cannot be used together; choose one")
        if self.history is not None and (self.chat_history is not None or self.recurrent_mode):
            raise ValueError("history cannot be combined with chat_history or recurrent_mode")
        return self


class AgentRun:
    """What belongs to one run: its task and arguments, conversation, steps, answer, usage and sandbox.

    Created by the agent when a run starts; the agent keeps the last one it ran itself (`Agent.last_run`,
    which `agent.task`, `agent.steps`, `agent.usage_tracker`, ... read). Attributes:

        args: the checked `RunArguments`.
        task: the `Task` (its result once the run ends).
        limit: the steps this run may take.
        tools: the tools callable in this run (allowed, and chosen for the task when filtering).
        chat_history: the conversation sent to the model, system prompt first.
        steps: the finished steps (plans are not steps).
        usage: the model usage of this run (its planner's and observer's calls included).
        observer, planner: this run's own (copies of the agent's, with nothing observed or planned).
        executor: the sandbox session a CodeAct run holds open (closed by `release()`).
        final: the final response, once there is one.
    """

    def __init__(
        self,
        args: RunArguments,
        *,
        limit: int,
        tools: dict[str, Tool],
        observer: Observer,
        planner: Planner | None,
        usage: UsageTracker,
        previous: Task | None = None,
        owner: asyncio.Task[Any] | None = None,
    ) -> None:
        self.args = args
        self.task = Task(description=args.task, files=list(args.files))
        if args.task_id:
            self.task.id = args.task_id
        self.limit = limit
        self.tools = tools
        self.observer = observer
        self.planner = planner
        self.usage = usage
        self.previous = previous
        self.owner = owner
        self.chat_history: list[dict[str, Any]] = []
        self.msg_idx_of_new_task = 0
        self.steps: list[StepRecord] = []
        self.output_files: list[str] = []
        self.mode: Mode = "text"
        self.format_used: str | None = None
        self.trouble = False
        self.trace: AbstractObservation | None = None
        self.executor: Executor | None = None
        self.final: AgentResponse | None = None
        self.final_answer_found = False
        self.finished = False
        # Set while a step runs with streaming on: where its token and output responses go, as they come.
        self.emit: Callable[[AgentResponse], Awaitable[None]] | None = None

    @property
    def inputs(self) -> dict[str, Any]:
        return self.args.inputs

    @property
    def response_model(self) -> type[BaseModel] | None:
        return self.args.response_model

    def busy_elsewhere(self, owner: asyncio.Task[Any] | None) -> bool:
        """Still running in another asyncio task than `owner` (a run abandoned in `owner` is not busy)."""
        return (
            not self.finished and self.owner is not None and self.owner is not owner and not self.owner.done()
        )

    def add_to_history(self, message: ChatMessage | dict[str, Any]) -> None:
        """Append a message (a `ChatMessage` or an OpenAI-format dict) to the conversation."""
        self.chat_history.append(message.to_openai() if isinstance(message, ChatMessage) else dict(message))

    def history_text(self, limit: int) -> str:
        """The conversation without the system prompt, each message cut to `limit` characters."""
        return render_history(self.chat_history, limit)

    def add_output_file(self, path: str) -> None:
        """Record a file the run produced (as an absolute path)."""
        absolute = os.path.abspath(path)
        if absolute not in self.output_files:
            self.output_files.append(absolute)
            self.task.output_files.append(absolute)

    def conclude(self, response: AgentResponse) -> AgentResponse:
        """Make `response` the run's final response, and its value the task's result."""
        self.task.result = response.value
        self.task.is_finished = True
        self.final = response
        return response

    async def release(self) -> None:
        """Close what the run holds open (its sandbox). Idempotent; shielded, so a cancelled run still closes."""
        executor, self.executor = self.executor, None
        if executor is not None:
            with anyio.CancelScope(shield=True):
                await executor.close()


def recent_progress(steps: Sequence[StepRecord], last: int = 3) -> str:
    """The last steps in a few lines each: what the planner and the observer's model are shown."""
    lines = []
    for step in steps[-last:]:
        what = step.code or step.action or ", ".join(c.name for c in step.tool_calls) or "(no action)"
        lines.append(f"Step {step.index}: {what[:300]}\n  -> {(step.error or step.observation or '')[:500]}")
    return "\n".join(lines) or "(nothing yet)"
