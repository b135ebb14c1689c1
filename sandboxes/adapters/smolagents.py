"""A smolagents `PythonExecutor` that runs every code step of a `CodeAgent` in our sandbox.

::

    from smolagents import CodeAgent, LiteLLMModel
    from sandboxes.adapters.smolagents import KodeagentExecutor

    imports = ["numpy"]
    agent = CodeAgent(
        tools=[...], model=LiteLLMModel("openai/gpt-4o-mini"), additional_authorized_imports=imports,
        executor=KodeagentExecutor(imports, backend="docker"),
    )
    with agent:  # cleanup() closes the sandbox session
        agent.run("...")

Why it is built this way:
- smolagents' own remote executors install the agent's tools *inside* the sandbox, so tool code and
  its secrets enter it. Here the sandbox holds only a stub per tool (and per managed agent) that
  calls back over the runner's channel; the tool itself runs in this process (`Executor(tools=)`).
- The session keeps its state between steps, as smolagents' executors do. Its tool stubs are fixed
  when it opens, so `send_tools` with other tool names opens a new session (the agent's variables
  are sent again; what earlier steps defined is gone, as after a timeout).
- `final_answer(...)` runs the agent's `FinalAnswerTool` here, through the same bridge, with the
  arguments of the call (several inputs too, as smolagents' executors allow), and ends the step;
  its result stays here as the step's output, whatever its type (it never crosses back).
- Variables and tool values cross as JSON, never pickle.
- The policy allows exactly the imports CodeAgent tells the model it may use: smolagents' base
  modules and the `additional_authorized_imports` given to both. One that is not installed is
  refused as smolagents' own executor refuses it: at construction on the host backend (the sandbox
  runs this interpreter), when the session opens on the others (the sandbox's Python is elsewhere).
- A timeout raises smolagents' `ExecutionTimeoutError` (and a `CodeExecutionError`).
- `network` means what `Policy.network` means (the public internet only through the egress gateway,
  or a `NetworkPolicy`'s rules); a connection the gateway refused is named, with its rule, in the
  step's logs, which the model reads (its own error often says only "Forbidden").

Needs the `smolagents` extra (``pip install 'kodeagent[smolagents]'``); `import sandboxes` never
imports this module.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self

try:
    from smolagents.local_python_executor import (
        CodeOutput,
        ExecutionTimeoutError,
        InterpreterError,
        PythonExecutor,
    )
    from smolagents.utils import BASE_BUILTIN_MODULES, AgentError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sandboxes.adapters.smolagents needs smolagents>=1.23: pip install 'kodeagent[smolagents]'"
    ) from exc

from ..egress.policy import NetworkPolicy
from ..models import ExecutionResult
from ..policy import Policy
from ..runtime import values
from ..runtime.guard import RUNNER_NAMES
from ..runtime.protocol import POLICY_VIOLATION
from ..sync import SyncExecutor, open_executor_sync
from ..variables import encode_variables

__all__ = ["CodeExecutionError", "CodeTimeoutError", "KodeagentExecutor"]

RESERVED_NAMES = RUNNER_NAMES
"""Names the runner binds in every run: a tool or variable of that name would be replaced."""


class CodeExecutionError(InterpreterError, AgentError):
    """A code step failed in the sandbox (an exception, a refused import, a timeout, a crash).

    An `InterpreterError`, as smolagents' local executor raises, and an `AgentError`, as its remote
    executors raise: CodeAgent shows the message to the model and goes on with the next step.
    `result` is the whole `ExecutionResult`."""

    def __init__(self, message: str, result: ExecutionResult) -> None:
        InterpreterError.__init__(self, message)  # not AgentError's: it logs, and needs a logger
        self.message = message
        self.result = result


class CodeTimeoutError(CodeExecutionError, ExecutionTimeoutError):
    """A code step ran past the executor's timeout and was stopped: smolagents'
    `ExecutionTimeoutError`, as its local executor raises, and a `CodeExecutionError`. The session
    was restarted: what earlier steps defined is gone (the agent's variables are sent again)."""


class KodeagentExecutor(PythonExecutor):  # smolagents has no type information: PythonExecutor is Any
    """Runs a `CodeAgent`'s code in a kodeagent sandbox session, on any backend.

    Args:
        additional_authorized_imports: the same list given to `CodeAgent`; the policy then allows
            smolagents' base modules and these (``"pkg"``, ``"pkg.*"``, ``"*"``), exactly what the
            agent announces to the model (`authorized_imports`).
        backend: ``"host"``, ``"docker"``, ``"e2b"`` or ``"ray"``.
        policy: everything else the code may do (files, network, limits, guards). Its
            `allowed_imports` come from `additional_authorized_imports` and must not be set.
        network: `Policy.network` (the same meaning there and here), for a policy given without it:
            True is the public internet only; a `NetworkPolicy` (or its fields as a dict, e.g.
            ``{"allow": ["pypi.org", "*.pythonhosted.org"]}``) allows and denies by rule.
        timeout: wall-clock seconds a step may take, tool and managed-agent calls included.
        **options: the backend's other options (`env`, `workdir`, `output_limit`, `image`, ...).

    Every method blocks (a private event loop runs the session). Give each agent its own executor:
    a managed agent's steps run while its manager's step waits for them.
    """

    def __init__(
        self,
        additional_authorized_imports: Iterable[str] = (),
        *,
        backend: str = "host",
        policy: Policy | None = None,
        network: bool | NetworkPolicy | Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        **options: Any,
    ) -> None:
        if isinstance(additional_authorized_imports, str):
            raise TypeError("additional_authorized_imports is a list of module names, not one string")
        if "tools" in options:
            raise TypeError("KodeagentExecutor takes no 'tools': they are the agent's (CodeAgent(tools=...))")
        if "stateless" in options:
            raise TypeError("KodeagentExecutor takes no 'stateless': an agent's steps share their variables")
        policy = policy if policy is not None else Policy()
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a sandboxes.Policy, not {type(policy).__name__}")
        if "allowed_imports" in policy.model_fields_set:
            raise ValueError(
                "give the imports as additional_authorized_imports (the list CodeAgent gets too), not as "
                "Policy.allowed_imports: the sandbox allows exactly what the agent tells the model"
            )
        self.authorized_imports: list[str] = sorted(
            set(BASE_BUILTIN_MODULES) | set(additional_authorized_imports)
        )
        """What the code may import: the list CodeAgent announces to the model."""
        settings: dict[str, Any] = {**policy.model_dump(), "allowed_imports": self.authorized_imports}
        if network is not None:
            if "network" in policy.model_fields_set:
                raise ValueError("give the network once: as network= or as Policy.network, not both")
            settings["network"] = network
        self.policy = Policy.model_validate(settings)
        self.backend = backend
        self.timeout = timeout
        self.options = dict(options)
        self._imports_checked = False
        if backend == "host":  # the sandbox runs this interpreter: what it lacks, the sandbox lacks
            _refuse_missing(_missing_here(self.authorized_imports), "")
            self._imports_checked = True
        self._tools: dict[str, Callable[..., Any]] = {}
        self._final_answer_tool: Callable[..., Any] | None = None
        self._final_output: list[Any] = []
        """The current step's final answer, as the agent's `FinalAnswerTool` returned it (here)."""
        self._variables: dict[str, Any] = {}
        self._variables_sent = True  # the session holds every variable in `_variables`
        self._session: SyncExecutor | None = None
        self._session_tools: frozenset[str] = frozenset()
        self._busy = threading.Lock()

    # ------------------------------------------------------------------ PythonExecutor

    def send_tools(self, tools: Mapping[str, Any]) -> None:
        """Take the agent's tools and managed agents (CodeAgent sends them at the start of every run).

        They run here when the code calls them; the sandbox gets a stub of each name. Another set
        of names than the open session's opens a new session (earlier steps' variables are lost)."""
        tools = dict(tools)
        final_answer = tools.pop("final_answer", None)
        for name, tool in tools.items():
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"tool name {name!r} must be a Python identifier not starting with '_'")
            if keyword.iskeyword(name) or name in RESERVED_NAMES:
                raise ValueError(f"a tool cannot be named {name!r}: the sandbox reserves that name")
            if not callable(tool):
                raise TypeError(f"tool {name!r} is not callable")
        if final_answer is not None and not callable(final_answer):
            raise TypeError("the final_answer tool is not callable")
        clash = sorted(set(tools) & set(self._variables))
        if clash:  # the runner rebinds its tool stubs in every run: the variable would vanish
            raise ValueError(f"tools and variables share the names {', '.join(clash)}; rename one of them")
        with self._exclusive("send_tools"):
            self._tools, self._final_answer_tool = tools, final_answer
            if self._session is not None and frozenset(tools) != self._session_tools:
                self._close_session()
            self._ensure_session()

    def send_variables(self, variables: Mapping[str, Any]) -> None:
        """Define variables in the session (CodeAgent sends its `additional_args` this way).

        Each keeps its type: every type of the values codec crosses (tuples, sets, bytes, dates,
        dicts with any keys, numpy arrays, DataFrames, images: docs/values.md). A value it cannot
        carry is refused with a `TypeError` naming the variable's part and its type; a name that is
        not an identifier, starts with '_' or is a tool's or the sandbox's, with a `ValueError`."""
        encoded = encode_variables(variables, self._tools)
        # Kept as the codec's copy of each value: what is sent again after a restart is what was sent.
        checked = {name: values.decode(value) for name, value in encoded.items()}
        if not checked:
            return
        with self._exclusive("send_variables"):
            self._variables.update(checked)
            if self._session is None:
                self._variables_sent = False  # sent when the session opens
            else:
                self._define(checked)

    def __call__(self, code_action: str) -> CodeOutput:
        """Run one code step: its printed output as `logs`, its last expression's value (or the final
        answer) as `output`. Raises `CodeExecutionError` when the code failed."""
        with self._exclusive("run code"):
            session = self._ensure_session()
            self._final_output.clear()
            result = session.run(code_action)
            final_output = list(self._final_output)
        logs = result.stdout + result.stderr + _refusals(result)
        if result.state_lost:
            self._variables_sent = False  # the variables went with the state: send them again
            if result.error is None:
                logs += (
                    "\n[The sandbox was restarted before this code ran: variables from earlier steps are "
                    "lost; the agent's own inputs are defined again from the next step on.]\n"
                )
        if result.timed_out:
            raise CodeTimeoutError(_timeout_text(self.timeout, logs), result)
        if result.error is not None:
            raise CodeExecutionError(_error_text(result, logs), result)
        if result.has_final_answer:
            # With the agent's FinalAnswerTool its output is here; without one, the runner's value.
            answer = final_output[-1] if final_output else result.final_answer
            return CodeOutput(output=answer, logs=logs, is_final_answer=True)
        # a value the codec does not carry is shown by its repr, as smolagents' executors show it
        output = result.value if result.value_repr is None else result.value_repr
        return CodeOutput(output=output, logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        """Close the session: its worker (container, microVM) and everything it started. A later
        step opens a new one. CodeAgent calls this from `agent.cleanup()` and `with agent:`."""
        with self._exclusive("cleanup"):
            self._close_session()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    @property
    def isolation(self) -> str:
        """The open session's isolation level ("not started" before the first step)."""
        return self._session.isolation if self._session is not None else "not started"

    # ------------------------------------------------------------------ the session

    @contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        # A managed agent's steps run in the tool bridge while its manager's step waits: with one
        # executor shared by both, the second would wait for the first for ever.
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                f"cannot {what}: this KodeagentExecutor is running a step. Give each agent (each managed "
                "agent too) its own executor"
            )
        try:
            yield
        finally:
            self._busy.release()

    def _ensure_session(self) -> SyncExecutor:
        if self._session is None:
            names = frozenset(self._tools)
            bridged = {name: self._dispatcher(name) for name in names}
            if self._final_answer_tool is not None:
                bridged["final_answer"] = self._run_final_answer
            session = open_executor_sync(
                self.backend, policy=self.policy, timeout=self.timeout, tools=bridged, **self.options
            )
            session.open()
            if not self._imports_checked:
                try:
                    _refuse_missing(
                        _missing_in(session, self.authorized_imports), f" in the {self.backend} sandbox"
                    )
                except BaseException:
                    session.close(wait=True)
                    raise
                self._imports_checked = True
            self._session, self._session_tools = session, names
            self._variables_sent = not self._variables
        if not self._variables_sent:
            self._define(self._variables)
        return self._session

    def _close_session(self) -> None:
        session, self._session = self._session, None
        self._session_tools = frozenset()
        self._variables_sent = not self._variables
        if session is not None:
            session.close(wait=True)  # cleanup() promises the worker gone when it returns

    def _define(self, variables: Mapping[str, Any]) -> None:
        """Bind `variables` in the session, each of its own type (`Executor.send_variables`)."""
        assert self._session is not None
        self._session.send_variables(variables)
        self._variables_sent = True

    def _run_final_answer(self, *args: Any, **kwargs: Any) -> None:
        """The code's `final_answer(...)`: the agent's current `FinalAnswerTool`, run here on the
        call's arguments. Its output stays here (the step's output); the sandbox gets None."""
        tool = self._final_answer_tool
        if tool is None:
            raise NameError("the agent has no final_answer tool any more")
        self._final_output.append(tool(*args, **kwargs))

    def _dispatcher(self, name: str) -> Callable[..., Any]:
        """What the session's tool bridge calls: the agent's current tool of that name (the bridge
        sends its result back as JSON, or its failure as the code's `ToolError`)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            tool = self._tools.get(name)
            if tool is None:
                raise NameError(f"the agent has no tool named {name!r} any more")
            return tool(*args, **kwargs)

        call.__name__ = call.__qualname__ = name
        return call


def _missing_here(imports: Iterable[str]) -> list[str]:
    """The top-level modules of `imports` this interpreter cannot find (``*`` matches anything)."""
    bases = dict.fromkeys(name.split(".")[0] for name in imports if name != "*")
    return [base for base in bases if importlib.util.find_spec(base) is None]


def _missing_in(session: SyncExecutor, imports: Iterable[str]) -> list[str]:
    """The top-level modules of `imports` the sandbox's Python cannot import (the standard library
    is there): each is imported once, in a function, and the namespace is reset after."""
    names = dict.fromkeys(
        name.removesuffix(".*")
        for name in imports
        if name != "*" and name.split(".")[0] not in sys.stdlib_module_names
    )
    if not names:
        return []
    lines = ["def kodeagent_probe():", "    missing = []"]
    for name in names:
        base = name.split(".")[0]
        lines += [
            f"    try:\n        import {name}\n    except ImportError:\n        missing.append({base!r})"
        ]
    lines += ["    return missing", "kodeagent_probe()"]
    result = session.run("\n".join(lines))
    session.reset()
    if result.error is not None:
        raise InterpreterError(f"could not check the authorized imports in the sandbox: {result.error}")
    value = result.value
    return [str(name) for name in dict.fromkeys(value)] if isinstance(value, list) else []


def _refuse_missing(missing: list[str], where: str) -> None:
    if missing:  # smolagents' LocalPythonExecutor says it so
        raise InterpreterError(
            f"Non-installed authorized modules{where}: {', '.join(missing)}. "
            "Please install these modules or remove them from the authorized imports list."
        )


def _timeout_text(timeout: float, logs: str) -> str:
    if logs and not logs.endswith("\n"):
        logs += "\n"
    return (
        f"{logs}Executing code yielded an error:\nExecutionTimeoutError: Code execution exceeded the "
        f"maximum execution time of {timeout:g} seconds and was stopped. The sandbox was restarted: "
        "variables, functions and imports from earlier steps are lost (the agent's own inputs are "
        "defined again). Make the code faster or split the work."
    )


_REFUSED_IMPORT = re.compile(r"import of '([\w.]+)' is not allowed")


def _refusals(result: ExecutionResult) -> str:
    """A line per connection the egress gateway refused in this step, naming its rule."""
    lines = result.network.refusals() if result.network is not None else []
    if not lines:
        return ""
    before = result.stdout + result.stderr
    return ("\n" if before and not before.endswith("\n") else "") + "".join(line + "\n" for line in lines)


def _error_text(result: ExecutionResult, logs: str) -> str:
    """What the model reads for a failed step, laid out as smolagents' remote executors lay it out:
    the output first, then the error with its traceback."""
    error = result.error
    assert error is not None
    detail = error.traceback or str(error)
    refused = _REFUSED_IMPORT.match(error.message) if error.type == POLICY_VIOLATION else None
    if refused is not None:
        # In smolagents' words, which CodeAgent recognises to tell the user to authorise the import.
        said = f"{POLICY_VIOLATION}: {refused.group(0)}"
        detail = detail.replace(said, f"{POLICY_VIOLATION}: Import of {refused.group(1)} is not allowed", 1)
    if logs and not logs.endswith("\n"):
        logs += "\n"
    return f"{logs}Executing code yielded an error:\n{detail}"
