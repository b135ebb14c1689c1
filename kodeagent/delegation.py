"""An agent as a tool another agent can call: the task in, the final answer out.

Each call is a run of its own (an `AgentRun` the agent does not keep as its `last_run`), so a
manager's parallel calls never share a conversation, and the sub-agent's model usage is added to the
caller's when the call ends. A call goes through the loop's entry points (`new_run`, `drive`), as
`Agent.run()` does.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

from pydantic import BaseModel

from .loop import RunLoop, drive, new_run
from .run import RunArguments
from .tools import Tool
from .usage import CALLER_USAGE

__all__ = ["agent_tool"]


def agent_tool(agent: RunLoop, name: str, description: str) -> Tool:
    """`agent` as the `Tool` `name` (see `Agent.as_tool`), described to the caller's model by `description`."""

    async def delegate(task: str) -> Any:
        args = RunArguments.check(max_files=0, task=task)  # the tool takes a task, never files
        run = new_run(agent, args)
        caller = CALLER_USAGE.get()
        final = None
        try:
            async with aclosing(drive(agent, run)) as responses:
                async for response in responses:
                    if response.type == "final":
                        final = response
        finally:
            if caller is not None and caller is not run.usage:
                caller.add_from(run.usage, name)
        if final is None or not final.metadata.get("final_answer_found", False):
            raise RuntimeError(f"the {name} agent did not finish: {final.value if final else ''}")
        value = final.value
        return value.model_dump(mode="json") if isinstance(value, BaseModel) else value

    delegate.__name__ = name
    return Tool(
        delegate,
        name=name,
        description=description.replace("\n", " "),
        parameters={
            "type": "object",
            "properties": {"task": {"type": "string", "description": "what the agent should do"}},
            "required": ["task"],
        },
    )
