"""`CodeActAgent`: thought and code, or a final answer. The code runs in a `sandboxes` executor.

One executor is opened per run (in `pre_run`, held by its `AgentRun`) and closed when the run ends; its
session keeps state between steps. Tools are handed to the executor as functions that run here, in
the agent's process, with their arguments validated. The observation the model gets is built from
the `ExecutionResult` (see `observation.py`). Nothing the code prints is ever parsed as the model's
reply: only `final_answer()` called by the code (which the sandbox reports out of band) or the model's
own JSON can end the run.

A sibling of `ReActAgent` under `Agent`: it never calls tools natively (its tools are functions inside
the code), so it has none of ReAct's tool-call machinery.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

from . import prompts
from .agent import Agent
from .errors import ResponseParseError
from .models import AgentResponse, ChatMessage, CodeActChatMessage, StepRecord
from .observation import cut_stream, format_observation
from .parsing import CODEACT_FORMAT, parse_codeact_reply
from .prompts import render_template
from .replies import FinalAnswer, StepReply
from .run import AgentRun
from .tools import Tool, as_tool
from .usage import CALLER_USAGE

if TYPE_CHECKING:
    from sandboxes import ExecutionResult, Executor
    from sandboxes.backends import BackendName as RunEnv  # where CodeAct code runs: a backend, by name

    from .codeact_options import CodeActOptions

__all__ = ["CodeActAgent", "CodeActOptions", "RunEnv", "cut_stream", "format_observation"]


def __getattr__(name: str) -> Any:
    # `RunEnv` is sandboxes' one list of backends (`BackendName`), and `CodeActOptions` reads it:
    # both are loaded on first use so that `import kodeagent` does not import sandboxes.
    if name == "RunEnv":
        from sandboxes.backends import BackendName

        return BackendName
    if name == "CodeActOptions":
        from . import codeact_options

        return codeact_options.CodeActOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CodeActAgent(Agent):
    """Thought, code, observation: the model writes Python that runs in a sandbox with the tools.

    Takes the `CodeActOptions`: the common `AgentOptions`, and where and how the code runs, in
    `sandboxes`' words: `backend` (``"host"``, ``"docker"``, ``"e2b"`` or ``"ray"``), `allowed_imports`,
    `pip_packages` (E2B only), `timeout` (seconds per code run), `env` (the code's whole environment)
    and `executor_options` (further options for `sandboxes.open_executor`, e.g. ``policy``). The API
    reference's ``run_env`` and ``env_vars_to_set`` are aliases of `backend` and `env`.
    """

    response_format_class: ClassVar[type[ChatMessage]] = CodeActChatMessage
    channel_name: ClassVar[str] = "codeact"
    OUTPUT_LIMIT: ClassVar[int] = 8000

    def __init__(self, model_name: str, **options: Unpack[CodeActOptions]) -> None:
        from .codeact_options import check_codeact_options

        o = check_codeact_options(type(self).__name__, options)
        self._configure(model_name, o)
        self.backend: RunEnv = o["backend"]
        self.allowed_imports: list[str] | None = o["allowed_imports"]
        self.pip_packages: list[str] | None = o["pip_packages"]
        self.timeout: float = o["timeout"]
        self.env: dict[str, str] = o["env"]
        self.executor_options: dict[str, Any] = o["executor_options"]

    @property
    def run_env(self) -> RunEnv:
        """The API reference's name of `backend`."""
        return self.backend

    @property
    def env_vars_to_set(self) -> dict[str, str]:
        """The API reference's name of `env`."""
        return self.env

    # ------------------------------------------------------------------ prompts and parsing

    def _imports(self) -> list[str]:
        if self.allowed_imports is not None:
            return self.allowed_imports
        from sandboxes import DEFAULT_ALLOWED_IMPORTS

        return list(DEFAULT_ALLOWED_IMPORTS)

    def get_tools_description(self, tools: list[Any] | None = None) -> str:
        """Tools as the Python functions the code calls: signature, purpose, arguments."""
        chosen = [as_tool(t) for t in tools] if tools is not None else list(self._current_tools.values())
        return "\n".join(t.describe(style="python") for t in chosen) if chosen else prompts.NO_TOOLS

    def get_system_prompt_content(self, run: AgentRun) -> str:
        """The system prompt of `run`: CodeAct's (or `system_prompt`), with the tools as functions and
        the imports the code may use."""
        imports = ", ".join(self._imports()) or "(none)"
        return render_template(
            self.system_prompt or prompts.CODEACT_SYSTEM_PROMPT,
            persona=self.persona or "",
            tools=self.get_tools_description(list(run.tools.values())),
            authorized_imports=imports,
        )

    def parse_text_response(self, text: str) -> ChatMessage:
        """Parse a free-text CodeAct reply: fenced code, ``Code:`` or ``Final Answer:`` sections."""
        return parse_codeact_reply(text)

    def parse_reply(self, text: str, run: AgentRun | None = None) -> CodeActChatMessage:
        """A reply in any accepted form (see `kodeagent.parsing`), or `ResponseParseError` saying why not."""
        return parse_codeact_reply(text)

    def expected_format(self) -> str:
        return CODEACT_FORMAT

    @property
    def reserved_input_names(self) -> frozenset[str]:
        """Inputs become variables of the sandbox's session: they may not hide a tool or a builtin there."""
        return frozenset({t.name for t in self.tools} | {"final_answer", "print"})

    def _inputs_suffix(self, run: AgentRun) -> str:
        return "\n" + prompts.CODEACT_INPUTS_NOTE

    def _continuation_note(self) -> str:
        """The sandbox is opened per run: an earlier conversation's variables do not exist in it."""
        return prompts.CODEACT_FRESH_SESSION_NOTE

    def _local_files(self, run: AgentRun) -> list[str]:
        return [f for f in run.task.files if os.path.isfile(f)]

    def _file_labels(self, run: AgentRun) -> list[str]:
        local = set(self._local_files(run))
        return [
            f"{os.path.basename(f)} (copied into the working directory of your code)" if f in local else f
            for f in run.task.files
        ]

    # ------------------------------------------------------------------ executor lifecycle

    def _make_executor(self, run: AgentRun) -> Executor:
        from sandboxes import Policy, open_executor

        options: dict[str, Any] = {
            "timeout": self.timeout,
            "env": self.env,
            "tools": {name: self._sandbox_tool(run, tool) for name, tool in run.tools.items()},
        }
        if "policy" not in self.executor_options:
            options["policy"] = Policy(allowed_imports=tuple(self._imports()))
        if self.pip_packages:
            options["pip_packages"] = self.pip_packages
        options.update(self.executor_options)
        return open_executor(self.backend, **options)

    def _sandbox_tool(self, run: AgentRun, tool: Tool) -> Callable[..., Any]:
        """What the sandbox's code calls: the tool, with `run` as the caller whose usage it adds to."""

        async def call(*args: Any, **kwargs: Any) -> Any:
            caller = CALLER_USAGE.set(run.usage)
            try:
                return await tool.call_from_sandbox(*args, **kwargs)
            finally:
                CALLER_USAGE.reset(caller)

        call.__name__ = tool.name
        return call

    async def pre_run(self, run: AgentRun) -> AsyncIterator[AgentResponse]:
        """Open the run's sandbox session, copy the task's files in, and define `inputs` as variables."""
        executor = self._make_executor(run)
        run.executor = executor  # held by the run from here, so its release closes it however the run ends
        await executor.open()
        yield self._response(
            "log",
            f"sandbox ready ({self.backend}, isolation: {executor.isolation})",
            channel="sandbox",
            metadata={"event": "sandbox_open", "backend": self.backend, "run_env": self.backend},
        )
        for path in self._local_files(run):
            with open(path, "rb") as fh:
                await executor.upload(os.path.basename(path), fh.read())
        if run.inputs:
            from sandboxes.errors import SandboxError

            try:  # each keeps its type in the sandbox (the values codec)
                await executor.send_variables(run.inputs)
            except (TypeError, ValueError, SandboxError) as exc:
                yield self._response(
                    "log",
                    f"could not define inputs in the sandbox: {exc}",
                    channel="sandbox",
                    metadata={"event": "inputs_failed"},
                )

    # ------------------------------------------------------------------ one step

    async def _act(self, run: AgentRun, record: StepRecord, message: StepReply) -> FinalAnswer | None:
        """Run the reply's code in the run's sandbox; a `final_answer()` it called ends the run."""
        assert isinstance(message, CodeActChatMessage)
        code = message.code or ""
        if not code.strip():
            raise ResponseParseError("it has neither `code` nor `final_answer`")
        record.code = code
        assert run.executor is not None  # opened in pre_run, closed only after the loop
        result = await self._run_code(run, run.executor, code)
        record.cpu_seconds = result.usage.cpu_seconds if result.usage is not None else None
        await self._collect_artifacts(run, result)
        record.observation = format_observation(result, limit=self.OUTPUT_LIMIT, timeout=self.timeout)
        if not result.ok:
            record.error = str(result.error) if result.error else "the code did not finish"
        run.add_to_history({"role": "user", "content": f"Observation:\n{record.observation}"})
        if result.has_final_answer and result.ok:
            return FinalAnswer(result.final_answer)
        return None

    async def _run_code(self, run: AgentRun, executor: Executor, code: str) -> ExecutionResult:
        """Run the step's code; with streaming on, through `executor.stream()`, each chunk it prints
        emitted as an ``"output"`` response while it runs. The result is the same either way."""
        emit = run.emit
        if emit is None:
            return await executor.run(code)
        from sandboxes import OutputEvent, ResultEvent

        step = run.task.steps_taken
        result: ExecutionResult | None = None
        async with executor.stream(code) as events:
            async for event in events:
                if isinstance(event, OutputEvent):
                    metadata = {"stream": event.stream, "step": step, "dropped": event.dropped}
                    await emit(self._response("output", event.text, channel="sandbox", metadata=metadata))
                elif isinstance(event, ResultEvent):
                    result = event.result
        assert result is not None  # a stream always ends with its ResultEvent
        return result

    async def _collect_artifacts(self, run: AgentRun, result: ExecutionResult) -> None:
        """Copy files the code wrote out of the sandbox into `work_dir` (when one is set)."""
        if not self.work_dir or not result.artifacts or run.executor is None:
            return
        root = os.path.abspath(self.work_dir)
        for artifact in result.artifacts:
            target = os.path.abspath(os.path.join(root, artifact.path))
            if not target.startswith(root + os.sep):
                continue
            try:
                data = await run.executor.download(artifact.path)
            except Exception:  # a file that vanished again is not worth failing the step for
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as fh:
                fh.write(data)
            run.add_output_file(target)
