"""Pydantic models at the boundary: what a run returns."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_serializer

from .egress.policy import NetworkReport
from .runtime import bounds, values

SHOWN_VALUE_CHARS = 4_000
"""Characters of a value's repr a text observation shows at most (head and tail)."""


class ExecutionError(BaseModel):
    """Why a run did not finish normally.

    `type` is the exception class name for errors raised by the code (``ZeroDivisionError``), or one
    of the platform's own kinds: ``PolicyViolation``, ``SyntaxError``, ``Timeout``,
    ``WorkerCrashed``, ``OutputLimit``, ``InvalidCode``.
    """

    type: str
    message: str
    traceback: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


class ForkReport(BaseModel):
    """What `Executor.fork()` copied, and what it could not (see docs/fork.md).

    A fork copies the interpreter's memory (copy-on-write) and the working directory. It cannot copy
    the code's own threads (only the thread that forks survives a fork), its child processes (they
    stay the parent's), or its open sockets (both sessions then hold the same connection).
    """

    threads_not_copied: int = 0
    child_processes_not_copied: int = 0
    shared_sockets: int = 0
    files_copied: int = 0
    bytes_copied: int = 0
    seconds: float = 0.0


class Artifact(BaseModel):
    """A file the run created or changed in the working directory (path relative to it)."""

    path: str
    size: int


class RunUsage(BaseModel):
    """What one run used, measured outside the code's reach (by the parent or the sandbox's supervisor,
    never taken from the runner's reply, which code without the Python-level guards can forge).

    CPU counts the code and every process it started (user and system time). Where the platform
    gives a peak for the run alone, `peak_scope` is ``"run"``; else it is the session's peak so far
    (``"session"``). `exact` says per figure (``cpu``, ``peak_memory``, ``wall``) whether it is the
    kernel's own accounting or an estimate (sampled metrics). `source` names where the figures come
    from: ``"proc"`` (the host's /proc), ``"cgroup"`` (the container's cgroup), ``"docker-stats"``,
    ``"e2b-metrics"``. A figure that could not be measured is None. On the host, a run that follows
    another with nothing between them counts from the end of that run's reading (the code's
    background work in between included): see `UsageProbe.continues`.
    """

    cpu_user_seconds: float | None = None
    cpu_system_seconds: float | None = None
    cpu_seconds: float | None = Field(
        None,
        description="User plus system CPU seconds (the only CPU figure "
        "where the platform does not split them).",
    )
    peak_memory_bytes: int | None = None
    wall_seconds: float = 0.0
    peak_scope: Literal["run", "session"] = "run"
    exact: dict[str, bool] = Field(default_factory=dict)
    source: str = ""


class ExecutionResult(BaseModel):
    """Everything one `run(code)` produced. Built by the shared executor code, the same for every backend.

    Bounded whatever the code does: `stdout`, `stderr` and the final answer's (or `value`'s) JSON
    hold at most `output_limit` characters each (head and tail, with a marker that counts what was
    left out), the error and the artifact list a few KB; see `sandboxes.runtime.bounds` for the
    exact figures.
    """

    stdout: str = ""
    stderr: str = ""
    error: ExecutionError | None = None
    timed_out: bool = False
    oom: bool = False
    state_lost: bool = Field(
        False, description="The worker was replaced before or during this run: earlier variables are gone."
    )
    duration: float = Field(0.0, description="Wall-clock seconds, measured in the parent.")
    artifacts: list[Artifact] | None = Field(
        default_factory=list,
        description="The files the run created or changed in the working directory; None when they were "
        "not looked at (the executor's `track_artifacts=False`, or a run that used up its memory).",
    )
    final_answer: Any = Field(
        None,
        description="The value the code passed to final_answer(), of its own type (see docs/values.md for "
        "the types that cross); one whose tagged JSON is longer than `output_limit` comes as that JSON "
        "text, cut to head and tail.",
    )
    has_final_answer: bool = False
    value: Any = Field(
        None,
        description="The value of the code's last expression, as a notebook cell has one, of its own type "
        "(None when the code does not end with an expression, or raised, or called final_answer, or "
        "when the value could not be carried: then `value_repr` shows it and `value_error` says why).",
    )
    value_repr: str | None = Field(
        None,
        description="The repr() of a last expression's value that was not carried (a type the codec does "
        "not carry, or tagged JSON longer than `output_limit`), cut to head and tail; None otherwise.",
    )
    value_error: str | None = Field(
        None, description="Why the last expression's value was not carried (its path and type), or None."
    )
    truncated: bool = Field(
        False,
        description="Some part was longer than its bound and was cut: head and tail kept, the middle counted.",
    )
    stdout_omitted: int = Field(0, description="Characters cut out of the middle of stdout (0: complete).")
    stderr_omitted: int = Field(0, description="Characters cut out of the middle of stderr (0: complete).")
    artifacts_omitted: int = Field(0, description="Changed files not listed in `artifacts` (past the bound).")
    tools_running: list[str] = Field(
        default_factory=list,
        description="Tools of this executor (by name, each once) that were still running in the parent "
        "when the run ended: a blocking (sync) tool runs in a thread that a timeout cannot stop, so "
        "its effects may land after the run was reported stopped. Async tools are cancelled with "
        "the run. Names come from the executor's own tools, never from the sandbox.",
    )
    backend: str = ""
    network: NetworkReport | None = Field(
        None,
        description="A network-on session's connections through the egress gateway since the previous "
        "run (host, port, the rule that allowed or refused each, bytes), bounded; None without network.",
    )
    usage: RunUsage | None = Field(
        None,
        description="What the run used (CPU, peak memory, wall time), measured outside the sandbox; "
        "None where the backend could not measure it (docs/concepts.md has the table: how each backend measures).",
    )

    @field_serializer("final_answer", "value", when_used="json")
    def _tagged(self, value: Any) -> Any:
        """In JSON, every value takes the codec's one tagged form (docs/values.md)."""
        return values.encode(value)

    @property
    def ok(self) -> bool:
        """True when the code ran to the end (or to `final_answer`) without an error."""
        return self.error is None and not self.timed_out

    def observation(self) -> str:
        """stdout, then stderr and the error, then the last expression's value (`shown_value`), as
        one text: what an agent shows the model, which may see nothing but this text."""
        parts = [self.stdout]
        if self.stderr:
            parts.append(self.stderr)
        if self.error is not None:
            parts.append(self.error.traceback or str(self.error))
        shown = self.shown_value()
        if shown is not None:
            separator = "\n" if "\n" in shown else " "
            parts.append(f"value of the last expression:{separator}{shown}")
        return "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts if p)

    def shown_value(self, limit: int = SHOWN_VALUE_CHARS) -> str | None:
        """The last expression's value as text, for a reader that gets only text (a model through
        MCP, a terminal): its repr(), which shows its type (``4``, ``'4'``, ``(1, 2)``), cut to
        head and tail past `limit` characters; None when the run has no value (as a notebook
        shows nothing for None)."""
        text: Any
        if self.value is not None:
            try:
                text = repr(self.value)
            except Exception:  # a value put here by hand may be anything
                text = f"<unprintable value of type {type(self.value).__name__}>"
        else:  # a value the sandbox could not carry comes as its repr (where the result has one)
            text = self.value_repr
            if not isinstance(text, str):
                return None
        return bounds.clipped(text, limit)
