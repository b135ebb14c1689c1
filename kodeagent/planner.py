"""The Planner writes a short plan before the first step and revises it as observations arrive.

It is a separate, small model conversation (its own system prompt and usage component
``"planner"``), so the agent's system prompt stays unchanged and cacheable: the plan reaches the
agent as an ordinary message in the conversation.
"""

from __future__ import annotations

import copy
from typing import Any

from . import prompts
from .llm import call_llm
from .usage import UsageTracker


class Planner:
    """Creates and revises the plan of a task.

    Args:
        model_name: the model that plans (often the agent's own, or a cheaper one).
        litellm_params: extra litellm arguments (api_base, api_key, ...).
        usage_tracker: where the planner's token usage is recorded.
        update_every: revise the plan after this many steps (also on demand, e.g. when the observer
            reports trouble).
    """

    def __init__(
        self,
        model_name: str,
        *,
        litellm_params: dict[str, Any] | None = None,
        usage_tracker: UsageTracker | None = None,
        max_retries: int = 3,
        update_every: int = 3,
    ) -> None:
        self.model_name = model_name
        self.litellm_params = dict(litellm_params or {})
        self.usage_tracker = usage_tracker
        self.max_retries = max_retries
        self.update_every = max(1, update_every)
        self.plan: str | None = None
        self.retry_base_delay = 1.0

    def for_run(self, usage_tracker: UsageTracker, retry_base_delay: float) -> Planner:
        """A planner with this one's settings and no plan yet, recording into `usage_tracker`.

        Each run plans with its own, so the runs of one agent never share (or overwrite) a plan.
        """
        planner = copy.copy(self)
        planner.plan = None
        planner.usage_tracker = usage_tracker
        planner.retry_base_delay = retry_base_delay
        return planner

    async def _ask(self, text: str) -> str:
        reply = await call_llm(
            self.model_name,
            [{"role": "system", "content": prompts.PLANNER_SYSTEM_PROMPT}, {"role": "user", "content": text}],
            component="planner",
            usage_tracker=self.usage_tracker,
            litellm_params=self.litellm_params,
            max_retries=self.max_retries,
            retry_base_delay=self.retry_base_delay,
        )
        return (reply.content or "").strip()

    async def create_plan(self, task: str, tools_description: str) -> str:
        self.plan = await self._ask(prompts.PLAN_CREATE.format(task=task, tools=tools_description)) or None
        return self.plan or ""

    async def update_plan(self, task: str, progress: str) -> str:
        if self.plan is None:
            return await self.create_plan(task, "")
        revised = await self._ask(prompts.PLAN_UPDATE.format(task=task, plan=self.plan, progress=progress))
        if revised:
            self.plan = revised
        return self.plan

    def should_update(self, steps_done: int, trouble: bool) -> bool:
        return trouble or (steps_done > 0 and steps_done % self.update_every == 0)
