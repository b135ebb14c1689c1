"""What an agent tells its model: who it is, its tools, and the conversation each run starts with.

The lowest layer of `Agent` (prompting -> replies -> loop -> compat -> agent). The system prompt is
rendered once per run and stays the first message; the task message follows any earlier
conversation. Subclasses add their own placeholders and notes through the hooks here.
"""

from __future__ import annotations

import json
from abc import ABC
from typing import TYPE_CHECKING, Any, ClassVar

from . import prompts
from .conversation import image_files, normalize_content, user_message
from .llm import supports
from .models import AgentResponse, ChatMessage, ResponseType
from .text import truncate
from .tools import Tool, as_tool, select_tools

if TYPE_CHECKING:
    from .run import AgentRun

__all__ = ["Prompting"]


class Prompting(ABC):
    """The prompts of an agent, from its configuration (set by `Agent.__init__`)."""

    response_format_class: ClassVar[type[ChatMessage]] = ChatMessage
    channel_name: ClassVar[str] = "agent"

    model_name: str
    name: str | None
    description: str | None
    persona: str | None
    system_prompt: str | None
    tools: list[Tool]
    allowed_tools: list[str] | None
    _is_visual: bool | None
    _last_run: AgentRun | None

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

    # ------------------------------------------------------------------ tools

    @property
    def _current_tools(self) -> dict[str, Tool]:
        """The tools of the current (or last) run; before the first, the allowed tools."""
        if self._last_run is not None:
            return dict(self._last_run.tools)
        return select_tools(self.tools, self.allowed_tools)

    def get_tools_description(self, tools: list[Any] | None = None) -> str:
        """Describe `tools` (default: those of the current run) for the model, required arguments marked."""
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

    # ------------------------------------------------------------------ the conversation a run starts with

    def get_system_prompt_content(self, run: AgentRun) -> str:
        """The system prompt of `run`, rendered. Subclasses add their own placeholders."""
        template = self.system_prompt or "{persona}\n\nTools:\n{tools}"
        return prompts.render_template(
            template, persona=self.persona or "", tools=self.get_tools_description(list(run.tools.values()))
        )

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
