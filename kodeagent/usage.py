"""Token and cost accounting, per component (agent, planner, observer, salvage, tool_filter).

Every model call made on an agent's behalf is recorded here by `llm.call_llm`, so the report adds up
to what the provider will bill, whichever part of the agent asked.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from .models import UsageRecord

CALLER_USAGE: ContextVar[UsageTracker | None] = ContextVar("kodeagent_caller_usage", default=None)
"""The usage tracker of the agent whose tool call is running: an `as_tool()` sub-agent adds its usage
there when it finishes, so a manager's report covers the model calls its helpers made."""


def _money(cost: float | None) -> str:
    return "unknown (no price known for the model)" if cost is None else f"${cost:.6f}"


class UsageTracker:
    """Collects `UsageRecord`s for the current (or last) task of an agent."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def add(self, record: UsageRecord) -> None:
        self.records.append(record)

    def add_from(self, other: UsageTracker, prefix: str) -> None:
        """Add another tracker's records with their component prefixed (``"helper.agent"``)."""
        for record in list(other.records):
            self.add(record.model_copy(update={"component": f"{prefix}.{record.component}"}))

    def reset(self) -> None:
        self.records.clear()

    @staticmethod
    def _sum(records: list[UsageRecord]) -> dict[str, Any]:
        return {
            "calls": len(records),
            "prompt_tokens": sum(r.prompt_tokens for r in records),
            "completion_tokens": sum(r.completion_tokens for r in records),
            "total_tokens": sum(r.total_tokens for r in records),
            "cost": None if any(r.cost is None for r in records) else sum(r.cost or 0.0 for r in records),
        }

    def metrics(self) -> dict[str, Any]:
        """Totals and a per-component breakdown, as plain data."""
        components: dict[str, list[UsageRecord]] = {}
        for record in self.records:
            components.setdefault(record.component, []).append(record)
        return {
            "total": self._sum(self.records),
            "by_component": {name: self._sum(recs) for name, recs in components.items()},
        }

    def report(self, include_breakdown: bool = True) -> str:
        """A short human-readable report."""
        data = self.metrics()
        total = data["total"]
        lines = [
            "LLM usage",
            f"  calls: {total['calls']}  prompt tokens: {total['prompt_tokens']}  "
            f"completion tokens: {total['completion_tokens']}  total tokens: {total['total_tokens']}  "
            f"cost: {_money(total['cost'])}",
        ]
        if include_breakdown and data["by_component"]:
            lines.append("  by component:")
            for name, part in data["by_component"].items():
                lines.append(
                    f"    {name}: calls {part['calls']}, tokens {part['prompt_tokens']} in / "
                    f"{part['completion_tokens']} out, cost {_money(part['cost'])}"
                )
        return "\n".join(lines)
