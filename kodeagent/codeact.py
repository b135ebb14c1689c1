"""`CodeActAgent`: thought and code, or a final answer. The code runs in a `sandboxes` executor.

One executor is opened per run (in `pre_run`) and closed when the run ends, however it ends; its
session keeps state between steps. Tools are handed to the executor as functions that run here, in
the agent's process, with their arguments validated. The observation the model gets is built from
the `ExecutionResult` (see `observation.py`). Nothing the code prints is ever parsed as the model's
reply: only `final_answer()` called by the code (which the sandbox reports out of band) or the model's
own JSON can end the run.

A sibling of `ReActAgent` under `Agent`: it never calls tools natively (its tools are functions inside
the code), so it has none of ReAct's tool-call machinery.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Unpack

import anyio

from . import prompts
from .agent import Agent, raw_reply_text
from .errors import ConfigurationError, ResponseParseError
from .models import AgentResponse, ChatMessage, CodeActChatMessage, StepRecord
from .observation import cut_stream, format_observation
from .options import AgentOptions
from .parsing import CODEACT_FORMAT, parse_codeact_reply
from .prompts import render_template
from .tools import Tool, as_tool
from .usage import CALLER_USAGE

if TYPE_CHECKING:
    from sandboxes import ExecutionResult, Executor

__all__ = ["CodeActAgent", "RunEnv", "cut_stream", "format_observation", "split_packages"]

RunEnv = Literal["host", "docker", "e2b", "ray"]


class CodeActAgent(Agent):
    """Thought, code, observation: the model writes Python that runs in a sandbox with the tools.

    Args (besides the common `AgentOptions`):
        run_env: where the code runs: ``"host"``, ``"docker"``, ``"e2b"`` or ``"ray"`` (a Ray cluster's node).
        allowed_imports: modules the code may import (``"pkg.*"`` for a package and its submodules);
            None means the sandbox's default pure-computation set.
        pip_packages: extra packages installed in the sandbox (E2B only), space- or comma-separated.
        timeout: wall-clock seconds each code run may take.
        env_vars_to_set: the environment the code sees (nothing else of the host's leaks in).
        executor_options: further options for `sandboxes.open_executor` (e.g. ``policy``).
    """

    response_format_class: ClassVar[type[ChatMessage]] = CodeActChatMessage
    channel_name: ClassVar[str] = "codeact"
    OUTPUT_LIMIT: ClassVar[int] = 8000

    def __init__(
        self,
        model_name: str,
        *,
        run_env: RunEnv = "host",
        allowed_imports: list[str] | None = None,
        pip_packages: str | None = None,
        timeout: int = 30,
        env_vars_to_set: dict[str, str] | None = None,
        executor_options: dict[str, Any] | None = None,
        **options: Unpack[AgentOptions],
    ) -> None:
        super().__init__(model_name, **options)
        if run_env not in ("host", "docker", "e2b", "ray"):
            raise ConfigurationError(f"run_env must be 'host', 'docker', 'e2b' or 'ray', got {run_env!r}")
        if not timeout or timeout <= 0:
            raise ConfigurationError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if pip_packages and run_env != "e2b":
            raise ConfigurationError(
                "pip_packages can only be installed in an E2B sandbox (run_env='e2b'); for host and docker, "
                "install packages in the environment or image and list them in allowed_imports"
            )
        self.run_env: RunEnv = run_env
        self.allowed_imports = list(allowed_imports) if allowed_imports is not None else None
        self.pip_packages = pip_packages
        self.timeout = timeout
        self.env_vars_to_set = dict(env_vars_to_set) if env_vars_to_set else None
        self.executor_options = dict(executor_options or {})
        self._executor: Executor | None = None
        self._executor_token: object | None = None

    def _reset_state(self) -> None:
        super()._reset_state()
        self._executor = None
        self._executor_token = None

    # ------------------------------------------------------------------ prompts and parsing

    def _imports(self) -> list[str]:
        if self.allowed_imports is not None:
            return self.allowed_imports
        from sandboxes import DEFAULT_ALLOWED_IMPORTS

        return list(DEFAULT_ALLOWED_IMPORTS)

    def get_tools_description(self, tools: list[Any] | None = None) -> str:
        """Tools as the Python functions the code calls: signature, purpose, arguments."""
        chosen = [as_tool(t) for t in tools] if tools is not None else list(self._run_tools.values())
        return "\n".join(t.describe(style="python") for t in chosen) if chosen else prompts.NO_TOOLS

    def get_system_prompt_content(self) -> str:
        imports = ", ".join(self._imports()) or "(none)"
        return render_template(
            self.system_prompt or prompts.CODEACT_SYSTEM_PROMPT,
            persona=self.persona or "",
            tools=self.get_tools_description(),
            authorized_imports=imports,
        )

    def parse_text_response(self, text: str) -> ChatMessage:
        """Parse a free-text CodeAct reply: fenced code, ``Code:`` or ``Final Answer:`` sections."""
        return parse_codeact_reply(text)

    def parse_reply(self, text: str) -> ChatMessage:
        """A reply in any accepted form (see `kodeagent.parsing`), or `ResponseParseError` saying why not."""
        return parse_codeact_reply(text)

    def expected_format(self) -> str:
        return CODEACT_FORMAT

    def _check_inputs(self, inputs: dict[str, Any]) -> None:
        taken = {t.name for t in self.tools} | {"final_answer", "print"}
        clashes = sorted(set(inputs) & taken)
        if clashes:
            raise ValueError(
                f"inputs {clashes} would hide a tool or builtin of the same name in the sandbox; rename them"
            )

    def _inputs_suffix(self) -> str:
        return "\n" + prompts.CODEACT_INPUTS_NOTE

    def _continuation_note(self) -> str:
        """The sandbox is opened per run: an earlier conversation's variables do not exist in it."""
        return prompts.CODEACT_FRESH_SESSION_NOTE

    def _local_files(self) -> list[str]:
        return [f for f in (self.task.files if self.task else []) if os.path.isfile(f)]

    def _file_labels(self) -> list[str]:
        local = set(self._local_files())
        return [
            f"{os.path.basename(f)} (copied into the working directory of your code)" if f in local else f
            for f in (self.task.files if self.task else [])
        ]

    # ------------------------------------------------------------------ executor lifecycle

    def _make_executor(self) -> Executor:
        from sandboxes import Policy, open_executor

        options: dict[str, Any] = {
            "timeout": self.timeout,
            "env": self.env_vars_to_set or {},
            "tools": {name: self._sandbox_tool(tool) for name, tool in self._run_tools.items()},
        }
        if "policy" not in self.executor_options:
            options["policy"] = Policy(allowed_imports=tuple(self._imports()))
        if self.pip_packages:
            options["pip_packages"] = split_packages(self.pip_packages)
        options.update(self.executor_options)
        return open_executor(self.run_env, **options)

    def _sandbox_tool(self, tool: Tool) -> Callable[..., Any]:
        """What the sandbox's code calls: the tool, with this agent as the caller whose usage it adds to."""

        async def call(*args: Any, **kwargs: Any) -> Any:
            caller = CALLER_USAGE.set(self.usage_tracker)
            try:
                return await tool.call_from_sandbox(*args, **kwargs)
            finally:
                CALLER_USAGE.reset(caller)

        call.__name__ = tool.name
        return call

    async def pre_run(self) -> AsyncIterator[AgentResponse]:
        """Open the sandbox session, copy the task's files in, and define `inputs` as variables."""
        await self._release_resources()  # the sandbox of an earlier run that was abandoned unfinished
        executor = self._make_executor()
        self._executor = executor
        self._executor_token = self._run_token
        await executor.open()
        yield self.response(
            "log", f"sandbox ready ({self.run_env}, isolation: {executor.isolation})",
            channel="sandbox", metadata={"event": "sandbox_open", "run_env": self.run_env},
        )  # fmt: skip
        for path in self._local_files():
            with open(path, "rb") as fh:
                await executor.upload(os.path.basename(path), fh.read())
        if self._inputs:
            code = "\n".join(f"{name} = {_jsonable_repr(value)}" for name, value in self._inputs.items())
            result = await executor.run(code)
            if not result.ok:
                yield self.response(
                    "log", f"could not define inputs in the sandbox: {result.error}", channel="sandbox",
                    metadata={"event": "inputs_failed"},
                )  # fmt: skip

    async def _release_resources(self, token: object | None = None) -> None:
        """Close the sandbox; with a `token`, only if it belongs to that run (not to a newer one).

        The run's own ``finally`` calls this with its token: that is what guarantees the close. A run
        abandoned unfinished is finalised later, perhaps while a newer run is using its own sandbox;
        the token keeps the old run's cleanup from touching the new sandbox.
        """
        if token is not None and token is not self._executor_token:
            return
        executor, self._executor = self._executor, None
        if executor is not None:
            with anyio.CancelScope(shield=True):
                await executor.close()

    # ------------------------------------------------------------------ one step

    async def _step(self, iteration: int) -> AsyncIterator[AgentResponse]:
        started = time.perf_counter()
        record = StepRecord(index=iteration)
        reply = await self._request_step()
        record.raw_reply = raw_reply_text(reply)
        text = reply.content or ""
        self.add_to_history({"role": "assistant", "content": text})
        try:
            message = self.parse_reply(text)
        except ResponseParseError as exc:
            async for item in self._format_error(record, str(exc), started):
                yield item
            return
        assert isinstance(message, CodeActChatMessage)
        record.thought = message.thought
        if message.is_final:
            async for item in self._finish(record, message.final_answer, message.task_successful, started):
                yield item
            return
        code = message.code or ""
        if not code.strip():
            async for item in self._format_error(record, "it has neither `code` nor `final_answer`", started):
                yield item
            return
        record.code = code
        assert self._executor is not None  # opened in pre_run, closed only after the loop
        result = await self._executor.run(code)
        record.cpu_seconds = result.usage.cpu_seconds if result.usage is not None else None
        await self._collect_artifacts(result)
        record.observation = format_observation(result, limit=self.OUTPUT_LIMIT, timeout=self.timeout)
        if not result.ok:
            record.error = str(result.error) if result.error else "the code did not finish"
        self.add_to_history({"role": "user", "content": f"Observation:\n{record.observation}"})
        if result.has_final_answer and result.ok:
            async for item in self._finish(record, result.final_answer, True, started):
                yield item
            return
        record.duration = time.perf_counter() - started
        yield self.response("step", record, metadata=self._step_metadata(iteration))
        await self._notify_step(record)

    async def _collect_artifacts(self, result: ExecutionResult) -> None:
        """Copy files the code wrote out of the sandbox into `work_dir` (when one is set)."""
        if not self.work_dir or not result.artifacts or self._executor is None:
            return
        root = os.path.abspath(self.work_dir)
        for artifact in result.artifacts:
            target = os.path.abspath(os.path.join(root, artifact.path))
            if not target.startswith(root + os.sep):
                continue
            try:
                data = await self._executor.download(artifact.path)
            except Exception:  # a file that vanished again is not worth failing the step for
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as fh:
                fh.write(data)
            self.add_output_file(target)


def split_packages(spec: str) -> list[str]:
    """``"pandas>=2, numpy matplotlib"`` -> ``["pandas>=2", "numpy", "matplotlib"]`` (the E2B option's form)."""
    return [part for part in re.split(r"[\s,]+", spec) if part]


def _jsonable_repr(value: Any) -> str:  # kept small and separate: inputs are JSON, their repr is a literal
    return repr(json.loads(json.dumps(value)))
