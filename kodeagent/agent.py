"""`Agent`: what every kodeagent agent is configured with, and how a caller runs it.

`ReActAgent` and `CodeActAgent` are siblings under `Agent`: each says only how it prompts, how its
replies read (`parse_reply`) and what acting on a reply means (`_act`). `Agent` is built in layers,
one module each, every layer using only those below it:

* `prompting.py`: who the agent is, its tools, the system prompt and the task message;
* `replies.py`: the model call, the response format a step is asked in, the parse of the reply;
* `loop.py`: a run from setup to the final answer (`new_run`, `drive`), and the hooks around it;
* `compat.py`: the API reference's names: the last run as the agent shows it, and its history methods;
* here: the configuration (`AgentOptions`, checked in `options.py`) and the caller's API (`run`,
  `arun`, `run_sync`, `clone`, `as_tool`).

The agent holds its configuration only; what one run reads and writes lives on that run's `AgentRun`
(run.py). Design choices that hold for all:

* The system prompt is rendered once per run and stays the first message, unchanged, for the whole
  run; everything that changes (task, plan, observations, observer notes) is appended after it.
* Observations enter the conversation as `user` (or `tool`) messages and are never parsed as the
  model's words; only the model's own replies go through the reply parsers.
* Everything a run opens (the sandbox, traces) is released in a `finally`, whatever way the run ends.
* An agent runs one task at a time, and shows the last one (`agent.task`, `agent.steps`, ...): a second
  concurrent run raises `AgentBusyError`; `clone()` for more. Each `as_tool()` call is a run of its own.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from typing import Any, ClassVar, Self, Unpack

import anyio
from pydantic import BaseModel

from .compat import SeedNames
from .delegation import agent_tool
from .errors import AgentBusyError, ConfigurationError
from .loop import drive, new_run
from .models import AgentResponse
from .observer import Observer
from .options import AgentOptions, check_options
from .planner import Planner
from .run import AgentRun, RunArguments
from .tools import Tool
from .tracing import make_tracer_manager

__all__ = ["Agent"]


def _current_task() -> asyncio.Task[Any] | None:
    """The asyncio task running this code (None outside asyncio): who owns a run in progress."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


class Agent(SeedNames):
    """Base of every agent: its configuration, and the run loop on it.

    Args:
        model_name: any litellm model string, e.g. ``"gemini/gemini-2.5-flash"``.
        **options: the `AgentOptions` every agent takes (tools, litellm_params, max_iterations,
            planner and observer, structured output, ...), documented there with their defaults and
            checks; an unknown option is a `TypeError`, a value that cannot work a `ConfigurationError`.

    Attributes set after construction:
        retry_base_delay: seconds before the first retry of a model call (doubling after each).
        prompt_cache: mark the system prompt for prompt caching; None (default) does so for
            Anthropic models, which cache only marked prefixes.

    What a run did is on its `AgentRun`; the agent shows its last one (`last_run`, and `task`, `steps`,
    `chat_history`, `usage_tracker`, `artifacts`, `current_plan`, ... read from it).
    """

    MAX_FILES: ClassVar[int] = 20

    def __init__(self, model_name: str, **options: Unpack[AgentOptions]) -> None:
        self._configure(model_name, check_options(type(self).__name__, options))

    def _configure(self, model_name: str, o: Mapping[str, Any]) -> None:
        """Take checked options (`check_options`; a subclass checks its own declaration, then calls this)."""
        if not model_name or not isinstance(model_name, str):
            raise ConfigurationError("model_name must be a non-empty litellm model string")
        self.id: uuid.UUID = uuid.uuid4()
        self.model_name = model_name
        self.name = o["name"]
        self.description = o["description"]
        self.tools = list(o["tools"])
        self.litellm_params = o["litellm_params"]
        self.persona = o["persona"]
        self.system_prompt = o["system_prompt"]
        self.max_iterations = o["max_iterations"]
        self.filter_tools_for_task = o["filter_tools_for_task"]
        self.max_retries = o["max_retries"]
        self.work_dir: str | None = o["work_dir"]
        self.tracing_type = o["tracing_type"]
        self.allowed_tools = o["allowed_tools"]
        self.on_step = o["on_step"]
        self.retry_base_delay = 1.0
        self.prompt_cache = None
        self.tracer_manager = make_tracer_manager(self.tracing_type)
        observer = o["observer"]
        self.observer = observer if observer is not None else Observer()
        # The planner and observer here are templates: each run plans and watches with its own copy.
        planning_interval = o["planning_interval"]
        self.planner = (
            Planner(
                model_name,
                litellm_params=self.litellm_params,
                max_retries=self.max_retries,
                update_every=planning_interval or 3,
            )
            if o["use_planner"] or planning_interval is not None
            else None
        )
        self.tool_calling = o["tool_calling"]
        self.structured_output = o["structured_output"]
        self.stream = o["stream"]
        # Learned for the agent's life (not per run): response formats the server refused, and vision.
        self._formats_refused = frozenset()
        self._is_visual = None
        self._last_run = None

    def clone(self) -> Self:
        """A new agent with this one's configuration, to run another task in parallel.

        An agent runs one task at a time (a second concurrent `run()` raises `AgentBusyError`). Its
        runs' state lives on their `AgentRun`s, so a clone is the configuration alone: model, options
        and tools shared (tools are stateless), its own copies of what a caller may change (tool list,
        litellm params, planner and observer settings), and no run yet.
        """
        twin = copy.copy(self)
        twin.id = uuid.uuid4()
        twin.tools = list(self.tools)
        twin.litellm_params = dict(self.litellm_params)
        twin.observer = self.observer.for_run()
        twin.planner = copy.copy(self.planner)
        twin._last_run = None
        return twin

    def as_tool(self, name: str | None = None) -> Tool:
        """This agent as a tool another agent can call: ``task`` in, the final answer out.

        The tool's description is the agent's `purpose`, so the calling model knows what it can ask.
        Each call is a run of its own (not the agent's `last_run`), so parallel calls (a manager's
        concurrent tool calls) never share a conversation; when the call ends, its model usage is added
        to the calling agent's usage under ``"<tool name>.<component>"``. A run that ends without an
        answer raises, which the caller sees as a failed tool call.
        """
        return agent_tool(self, name or self.name or f"{type(self).__name__.lower()}_helper", self.purpose)

    @property
    def last_run(self) -> AgentRun | None:
        """The run in progress, or the last one this agent ran (None before its first)."""
        return self._last_run

    @property
    def reserved_input_names(self) -> frozenset[str]:
        """Names `inputs` may not take (none here; CodeAct: its tools and the sandbox's builtins)."""
        return frozenset()

    # ------------------------------------------------------------------ run

    async def run(
        self,
        task: str,
        files: list[str] | None = None,
        task_id: str | None = None,
        max_iterations: int | None = None,
        recurrent_mode: bool = False,
        summarize_progress_on_failure: bool = True,
        chat_history: list[dict[str, Any]] | None = None,
        *,
        history: Sequence[Any] | None = None,
        inputs: dict[str, Any] | None = None,
        response_model: type[BaseModel] | None = None,
        allowed_tools: Sequence[str] | None = None,
    ) -> AsyncIterator[AgentResponse]:
        """Solve `task` step by step, yielding each step, logs, and finally the answer.

        Args:
            task: what to do.
            files: paths (or URLs) belonging to the task; CodeAct copies local files into the sandbox.
            task_id: an id for the task (a UUID if not given).
            max_iterations: steps for this run (default: the agent's `max_iterations`).
            recurrent_mode: prefix the task with the previous task and its result.
            summarize_progress_on_failure: when steps run out, ask the model to sum up what it found.
            chat_history: an OpenAI-format conversation to continue (its system message, if any, is
                replaced by this agent's).
            history: earlier turns (`ChatMessage`s or dicts, no system message) sent with every step.
            inputs: context variables shown to the model (and, in CodeAct, defined in the session).
            response_model: a pydantic model the final answer must validate into; a mismatch is told
                to the model, which then tries again.
            allowed_tools: names or patterns of tools allowed in this run (overrides the agent's).

        Raises:
            ValueError: empty task, too many files, recurrent_mode together with chat_history (or
                history), or a history that is not valid OpenAI chat format.
            AgentBusyError: this agent is running a task in another asyncio task.
            RetryError: a model call kept failing after `max_retries` retries.
        """
        args = RunArguments.check(
            max_files=self.MAX_FILES,
            reserved_inputs=self.reserved_input_names,
            task=task,
            files=files,
            task_id=task_id,
            max_iterations=max_iterations,
            recurrent_mode=recurrent_mode,
            summarize_progress_on_failure=summarize_progress_on_failure,
            chat_history=chat_history,
            history=history,
            inputs=inputs,
            response_model=response_model,
            allowed_tools=allowed_tools,
        )
        # An agent runs one task at a time, the one its `task`, `steps`, ... show. A run started while
        # another asyncio task is still running one is refused; a new run in the same task supersedes one
        # that was abandoned unfinished, and closes what that one holds open.
        owner = _current_task()
        previous = self._last_run
        if previous is not None and previous.busy_elsewhere(owner):
            raise AgentBusyError(
                f"this {type(self).__name__} is already running a task in another asyncio task; an agent "
                "runs one task at a time. Run parallel tasks on agent.clone() (or separate agents)."
            )
        if previous is not None and not previous.finished:
            await previous.release()
        run = new_run(self, args, previous=previous.task if previous else None, owner=owner)
        self._last_run = run
        async with aclosing(drive(self, run)) as responses:
            async for response in responses:
                yield response

    async def arun(self, task: str, **options: Any) -> AgentResponse:
        """Run `task` to the end and return the final response, for callers who do not iterate.

        ``(await agent.arun(task)).value`` is the answer; its ``metadata`` holds ``task_successful``,
        ``steps`` and ``usage``. `options` are those of `run()`.
        """
        final: AgentResponse | None = None
        async for response in self.run(task, **options):
            if response.type == "final":
                final = response
        assert final is not None  # run() always ends with a final response
        return final

    def run_sync(self, task: str, **options: Any) -> AgentResponse:
        """The blocking twin of `arun()`, for scripts and notebooks without an event loop."""
        import sniffio

        try:
            sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            return anyio.run(lambda: self.arun(task, **options))
        raise ConfigurationError("run_sync() cannot be called from async code; use `await agent.arun(task)`")
