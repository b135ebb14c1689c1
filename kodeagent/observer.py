"""The Observer watches the steps of a run and speaks up when the agent is going nowhere.

Its rules are free (no model call): it notices the same action repeated with the same result (a
loop), the same action failing again and again, a run of steps that all fail, and steps that produce
nothing new (a stall); and it reminds the model when few steps are left. The note is added to the
conversation as a message, so the model can change course.

Optionally (`model_name` set), when a rule fires, a model reviews the recent steps and turns the note
into concrete advice. That call is made only on trouble, so it stays cheap, and its usage is recorded
under the component ``"observer"``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from . import prompts
from .models import StepRecord
from .usage import UsageTracker


def _digest(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:16]


class Observer:
    """Rule-based progress monitor. `observe()` returns a note for the model, or None.

    Args:
        repeat_threshold: identical actions in a row that count as a loop.
        failure_threshold: failing steps in a row that count as stuck.
        stall_threshold: steps in a row with an observation already seen before.
        warn_remaining: remind the model to conclude when this many steps remain.
        model_name: a model that turns a rule's note into concrete advice (None: rules only).
    """

    def __init__(
        self,
        repeat_threshold: int = 3,
        failure_threshold: int = 3,
        stall_threshold: int = 4,
        warn_remaining: int = 2,
        model_name: str | None = None,
    ) -> None:
        self.model_name = model_name
        self.repeat_threshold = repeat_threshold
        self.failure_threshold = failure_threshold
        self.stall_threshold = stall_threshold
        self.warn_remaining = warn_remaining
        self.reset()

    def for_run(self) -> Observer:
        """An observer with this one's settings and nothing observed yet: each run watches with its own."""
        observer = copy.copy(self)
        observer.reset()
        return observer

    def reset(self) -> None:
        self._actions: list[str] = []
        self._failures: list[bool] = []
        self._seen_observations: set[str] = set()
        self._stale: list[bool] = []
        self._last_note: str | None = None
        self._warned = False
        self.notes: list[str] = []

    @staticmethod
    def action_signature(step: StepRecord) -> str:
        if step.code is not None:
            return "code:" + _digest(step.code)
        calls: list[Any] = [(c.name, c.args) for c in step.tool_calls]
        return "tools:" + _digest(calls or [step.action or "", step.error or ""])

    def observe(self, step: StepRecord, steps_left: int) -> str | None:
        """Record a finished step; return a note when something looks wrong (never the same twice in a row)."""
        if step.is_final:
            return None
        self._actions.append(self.action_signature(step))
        self._failures.append(bool(step.error))
        observation = _digest(step.observation or "")
        self._stale.append(observation in self._seen_observations)
        self._seen_observations.add(observation)

        problem = self._diagnose()
        repeated = problem is not None and problem == self._last_note
        self._last_note = problem
        parts = [] if problem is None or repeated else [problem]
        # The reminder is separate from the problem notes: a loop note that is not repeated (to avoid
        # nagging) must not also silence the one warning that the steps are running out.
        if 0 < steps_left <= self.warn_remaining and not self._warned:
            self._warned = True
            parts.append(
                f"only {steps_left} step(s) remain. Give the final answer with what you have, or a "
                "clear statement of what is missing."
            )
        if not parts:
            return None
        note = " Also, ".join(parts)
        self.notes.append(note)
        return note

    def _tail_all(self, values: list[bool], n: int) -> bool:
        return len(values) >= n and all(values[-n:])

    def _diagnose(self) -> str | None:
        n = self.repeat_threshold
        if len(self._actions) >= n and len(set(self._actions[-n:])) == 1:
            if self._failures[-1]:
                return (
                    f"the same action has now failed {n} times in a row. It will not work as it is: "
                    "read the error, then try a different approach or different arguments."
                )
            return (
                f"you have repeated the same action {n} times with the same outcome. Use the result "
                "you already have, or try something different."
            )
        if self._tail_all(self._failures, self.failure_threshold):
            return (
                f"the last {self.failure_threshold} steps all failed. Step back: re-read the task and "
                "the errors, and change your approach rather than patching the same idea."
            )
        if self._tail_all(self._stale, self.stall_threshold):
            return (
                f"the last {self.stall_threshold} steps produced nothing new. If you have enough to "
                "answer, give the final answer; otherwise try a different way to make progress."
            )
        return None

    async def review(
        self,
        note: str,
        task: str,
        recent_steps: str,
        *,
        litellm_params: dict[str, Any] | None = None,
        usage_tracker: UsageTracker | None = None,
        max_retries: int = 3,
        retry_base_delay: float = 1.0,
    ) -> str:
        """Ask `model_name` for advice on the problem `note` describes; the note itself if no model is set."""
        if not self.model_name:
            return note
        from .llm import call_llm

        reply = await call_llm(
            self.model_name,
            [
                {
                    "role": "user",
                    "content": prompts.OBSERVER_REVIEW.format(task=task, steps=recent_steps, note=note),
                }
            ],
            component="observer",
            usage_tracker=usage_tracker,
            litellm_params=litellm_params,
            max_retries=max_retries,
            retry_base_delay=retry_base_delay,
        )
        advice = (reply.content or "").strip()
        return f"{note} {advice}" if advice else note
