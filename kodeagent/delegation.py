"""An agent as a tool another agent can call: the task in, the final answer out.

Each call is a run of its own (an `AgentRun` the agent does not keep as its `last_run`), so a
manager's parallel calls never share a conversation, and the sub-agent's model usage is added to the
caller's when the call ends.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .run import RunArguments
from .tools import Tool
from .usage import CALLER_USAGE

if TYPE_CHECKING:
    from .agent import Agent


def agent_tool(agent: Agent, name: str | None = None) -> Tool:
    """`agent` as a `Tool` (see `Agent.as_tool`)."""
    tool_name = name or agent.name or f"{type(agent).__name__.lower()}_helper"

    async def delegate(task: str) -> Any:
        args = RunArguments.check(max_files=agent.MAX_FILES, task=task)
        run = agent._new_run(args)
        caller = CALLER_USAGE.get()
        final = None
        try:
            async with aclosing(agent._drive(run)) as responses:
                async for response in responses:
                    if response.type == "final":
                        final = response
        finally:
            if caller is not None and caller is not run.usage:
                caller.add_from(run.usage, tool_name)
        if final is None or not final.metadata.get("final_answer_found", False):
            raise RuntimeError(f"the {tool_name} agent did not finish: {final.value if final else ''}")
        value = final.value
        return value.model_dump(mode="json") if isinstance(value, BaseModel) else value

    delegate.__name__ = tool_name
    return Tool(
        delegate,
        name=tool_name,
        description=agent.purpose.replace("\n", " "),
        parameters={
            "type": "object",
            "properties": {"task": {"type": "string", "description": "what the agent should do"}},
            "required": ["task"],
        },
    )
