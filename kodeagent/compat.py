"""The kodeagent API reference's names on `Agent`: the last run as the agent shows it, and its history.

The fourth layer of `Agent` (prompting -> replies -> loop -> compat -> agent). The reference documents
an agent that holds one task's state itself; here each run's state is its `AgentRun`, and these names
read and write the run the agent shows (`last_run`): the run in progress, or the last one once it
ended. They keep code written against the reference working.

The history methods (`add_to_history`, `init_history`, `clear_history`, `add_output_file`):

* During a run (from a tool, an `on_step` callback, or between the responses of `run()`) they change
  that run: a message added is sent with the next step.
* After a run they change its record (what `chat_history`, `artifacts`, ... show). A run builds its
  own conversation when it starts, so none of them reaches a later run; to carry a conversation on,
  pass ``chat_history=agent.chat_history`` to `run()`.
* Before the first run there is no conversation: `add_to_history` and `add_output_file` raise
  `NoRunError` (what they add would be lost), `init_history` and `clear_history` do nothing.
"""

from __future__ import annotations

from typing import Any

from .conversation import normalize_content
from .errors import AgentBusyError, NoRunError
from .loop import RunLoop
from .models import AgentResponse, ChatMessage, ResponseType, StepRecord, Task
from .run import AgentRun
from .tools import Tool
from .tracing import AbstractObservation
from .usage import UsageTracker

__all__ = ["SeedNames"]


class SeedNames(RunLoop):
    """Views of the last run, and the reference's history methods on it."""

    # ------------------------------------------------------------------ the last run, as the agent shows it

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
    def task_output_files(self) -> list[str]:
        """Files produced by the current (or last) run (the same as `artifacts`)."""
        return self.artifacts

    @property
    def current_plan(self) -> str | None:
        """The plan of the current (or last) run (None without a planner)."""
        run = self._last_run
        return run.planner.plan if run is not None and run.planner is not None else None

    @property
    def current_trace(self) -> AbstractObservation | None:
        """The trace of the current (or last) run (None before the first)."""
        return self._last_run.trace if self._last_run else None

    @property
    def tool_name_to_func(self) -> dict[str, Tool]:
        """The tools callable in the current (or last) run (all allowed tools before the first)."""
        return self._current_tools

    @property
    def tool_names(self) -> set[str]:
        """The names of `tool_name_to_func`."""
        return set(self._current_tools)

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

    normalize_content = staticmethod(normalize_content)

    # ------------------------------------------------------------------ the history methods

    def _shown_run(self, method: str) -> AgentRun:
        if self._last_run is None:
            raise NoRunError(
                f"{method}() changes the current run, and this agent has not run yet: call it during "
                "agent.run() (from a tool or on_step), or pass history=[...] to run()"
            )
        return self._last_run

    def add_to_history(self, message: ChatMessage | dict[str, Any]) -> None:
        """Add a message (a `ChatMessage` or an OpenAI-format dict) to the current run's conversation.

        During a run the model is sent it with the next step; after the run it is added to its record.
        Raises `NoRunError` before the first run.
        """
        self._shown_run("add_to_history").add_to_history(message)

    def add_output_file(self, path: str) -> None:
        """Record a file the current run produced (kept as an absolute path, once) in `artifacts` and the
        task's `output_files`. Raises `NoRunError` before the first run."""
        self._shown_run("add_output_file").add_output_file(path)

    def init_history(self) -> None:
        """Start the current run's conversation over: its system prompt alone, and a fresh observer.

        During a run the next step is sent only the system prompt and what is added after it (the
        task too is gone: add it again with `add_to_history` if the run is to go on). Does nothing
        before the first run, whose conversation is built when it starts.
        """
        run = self._last_run
        if run is None:
            return
        run.chat_history = [{"role": "system", "content": self.get_system_prompt_content(run)}]
        run.msg_idx_of_new_task = len(run.chat_history)
        run.observer = self.observer.for_run()

    def clear_history(self) -> None:
        """Empty the last run's conversation, system prompt included (`chat_history` becomes []).

        Refused with `AgentBusyError` while that run is in progress: its next step would send the model
        nothing; `init_history()` keeps the system prompt. Does nothing before the first run.
        """
        run = self._last_run
        if run is None:
            return
        if not run.finished:
            raise AgentBusyError(
                "clear_history() would leave the run in progress nothing to send the model; use "
                "init_history() to start its conversation over from the system prompt"
            )
        run.chat_history = []
        run.msg_idx_of_new_task = 0
