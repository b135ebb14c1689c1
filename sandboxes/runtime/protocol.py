"""The messages of the sandbox channel and of the Ray node agent, typed once for both sides.

The parent (`sandboxes.session`) and the runner (`runner.py`, which runs inside every sandbox) speak
JSON, one object per line; the Ray backend's driver and its node agents (`backends/ray/executor.py`,
`backends/ray/node.py`) exchange plain dicts through Ray. Every such message is declared here as a
`TypedDict`, so that a type checker holds both sides to one shape. Standard library only, and only
types: the runner imports this module for type checking alone and pays nothing for it at run time.

The platform's own error kinds (`ErrorKind`) are listed here too; an `ExecutionError.type` is either
one of them or the name of an exception the code raised.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

ErrorKind = Literal[
    "PolicyViolation",  # the static check or the runtime guard refused the code
    "SyntaxError",  # the code does not parse
    "InvalidCode",  # not text, NUL bytes, too large, nested too deeply
    "Timeout",  # the run passed its wall-clock timeout and the sandbox was killed
    "WorkerCrashed",  # the sandbox process ended or the channel broke during the run
    "ToolResultTooLarge",  # a tool returned more than crosses into the sandbox
    "ToolCallRefused",  # a tool call arrived after the run that made it had ended; never executed
    "UncarriableValue",  # a value from the sandbox could not be decoded (not the codec's form, past its bounds)
]
"""The kinds of error the platform itself reports (other `ExecutionError.type`s are the code's)."""

TIMEOUT: ErrorKind = "Timeout"
WORKER_CRASHED: ErrorKind = "WorkerCrashed"
POLICY_VIOLATION: ErrorKind = "PolicyViolation"
SYNTAX_ERROR: ErrorKind = "SyntaxError"
INVALID_CODE: ErrorKind = "InvalidCode"
TOOL_RESULT_TOO_LARGE: ErrorKind = "ToolResultTooLarge"
TOOL_CALL_REFUSED: ErrorKind = "ToolCallRefused"
UNCARRIABLE_VALUE: ErrorKind = "UncarriableValue"


# ---------------------------------------------------------------------- the policy as the runner gets it


class LimitsConfig(TypedDict):
    """`Limits` as JSON; 0 leaves that rlimit alone (Docker leaves memory and processes to its cgroup)."""

    memory_mb: int
    cpu_seconds: int
    max_processes: int
    max_file_mb: int
    max_open_files: int


class PolicyConfig(TypedDict):
    """The part of a `Policy` that the runner enforces (`Policy.runtime_config()`)."""

    allowed_imports: list[str]
    banned_builtins: list[str]
    allowed_dunders: list[str]
    files: str
    network: bool
    subprocess: bool
    limits: LimitsConfig
    python_guards: bool


# ---------------------------------------------------------------------- requests (parent -> runner)


class WarmupRequest(TypedDict):
    """Touch what a session will use, before `init` (pooled workers only); `python_guards` False
    when the session's `init` will turn the guards off (absent: on)."""

    op: Literal["warmup"]
    python_guards: NotRequired[bool]


class InitRequest(TypedDict):
    """The session's configuration; answered with an `InitReply` that carries the channel token."""

    op: Literal["init"]
    policy: PolicyConfig
    env: dict[str, str]
    tools: list[str]
    stateless: bool
    output_limit: int


class StreamOptions(TypedDict):
    """How much of a run's output the runner streams while it runs: a token bucket of `chars` characters
    (the most sent in one burst) refilled at `chars_per_second`. Past it output is dropped and counted
    (the capture for the result is unaffected)."""

    chars: int
    chars_per_second: int


class RunRequest(TypedDict):
    """Run one snippet (already checked by the parent's static policy); with `stream`, the runner sends
    `OutputMessage`s while the code runs, before the reply.

    `run` numbers the run (unique in the parent process); the runner tags each `ToolCall` made while
    the run is in progress with it, so a call that arrives after its run ended is refused, never
    executed in a later run."""

    op: Literal["run"]
    code: str
    run: int
    stream: NotRequired[StreamOptions]
    artifacts: NotRequired[bool]
    """False: the runner does not look at the working directory for this run (the reply's
    ``artifacts`` is None); absent or True: it lists the files the run created or changed."""
    artifacts_from_last: NotRequired[bool]
    """True: nothing but runs went on in the session since the last run's reply (no define, reset,
    file transfer or fork), so the runner may take that run's closing listing of the working
    directory as this run's opening one instead of listing it again; what changed in between (a
    background thread's files) is then this run's."""


class ResetRequest(TypedDict):
    """Forget every variable of the session."""

    op: Literal["reset"]


class DefineRequest(TypedDict):
    """Bind variables in the session (`Executor.send_variables`): each value in the codec's tagged
    form (`values.py`), the whole message at most `bounds.DEFINE_MESSAGE_LIMIT` bytes of JSON.
    Answered with a `DefineReply`; all are bound or none."""

    op: Literal["define"]
    variables: dict[str, Any]


class ErrorDetail(TypedDict):
    """An error by type name and message (a tool's failure)."""

    type: str
    message: str


class ToolResult(TypedDict):
    """The parent's answer to a `ToolCall`: a value in the codec's tagged form (`values.py`), or an
    error the code sees as `ToolError`."""

    op: Literal["tool_result"]
    id: Any
    value: NotRequired[Any]
    error: NotRequired[ErrorDetail]


class ForkRequest(TypedDict):
    """Fork the session's runner (`runtime/sessionfork.py`): the copy lives in `workdir`, and its
    channel comes as `channel` says (``"fd"``: a descriptor the parent passes on asking;
    ``"listen"``: the runner makes `workdir` and listens on a unix socket that a relay connects to)."""

    op: Literal["fork"]
    workdir: str
    channel: Literal["fd", "listen"]


Request = WarmupRequest | InitRequest | RunRequest | ResetRequest | DefineRequest | ForkRequest


# ---------------------------------------------------------------------- replies (runner -> parent)


class RunError(TypedDict):
    """Why a run did not finish normally, as the runner describes it (bounded: `bounds.bound_error`)."""

    type: str
    message: str
    traceback: str | None
    line: int | None


class ArtifactEntry(TypedDict):
    path: str
    size: int


class Reply(TypedDict):
    """The answer to `warmup` and `reset` (and the common part of every reply)."""

    op: Literal["reply"]
    token: NotRequired[str]


class DefineReply(Reply):
    """The answer to `define`: `error` says why nothing was bound (None: everything was)."""

    error: str | None


class InitReply(Reply):
    pid: int
    uid: int


class RunReply(Reply):
    """What one run produced; every part already cut to its bound by the runner (`bounds.py`)."""

    stdout: str
    stderr: str
    stdout_omitted: int
    stderr_omitted: int
    truncated: bool
    error: RunError | None
    oom: bool
    final_answer: Any
    """In the codec's tagged form (`values.py`), or its JSON text cut to the output limit."""
    has_final_answer: bool
    value: Any
    """The value of the code's last expression in the tagged form, bounded (a str cut to the limit),
    or None (no value, or one not carried: then `value_repr` shows it and `value_error` says why)."""
    value_repr: NotRequired[str | None]
    value_error: NotRequired[str | None]
    artifacts: list[ArtifactEntry] | None
    """The files the run created or changed; None when the request asked not to look (`RunRequest`)."""
    artifacts_omitted: int
    exec_seconds: NotRequired[float]
    """Seconds the code itself ran (the cell and its last expression), by the runner's clock: 0 when
    it did not compile. Self-reported (code without the Python-level guards can forge the reply), so
    for breakdowns (`RunnerSession.exec_seconds`), never for limits or accounting."""
    runner_seconds: NotRequired[float]
    """Seconds the runner spent on the run, from the decoded request to the reply (before sending it):
    the code plus the runner's own work (compile, capture, files). Self-reported, as `exec_seconds`."""


class ToolCall(TypedDict):
    """The code called a tool: the parent runs it and answers with a `ToolResult`.

    `run` is the `RunRequest.run` of the run in progress when the call was made; the parent refuses a
    call of any other run (`TOOL_CALL_REFUSED`) without executing it. The runner always sends it; a
    call relayed by a Ray node agent has none (the node's own executor checked it against its run)."""

    op: Literal["tool_call"]
    id: int
    run: NotRequired[int]
    name: str
    args: list[Any]
    """The positional arguments, in the codec's tagged form (`values.py`; a list is itself)."""
    kwargs: dict[str, Any]
    """The keyword arguments as one dict in the tagged form."""
    token: NotRequired[str]


class OutputMessage(TypedDict):
    """Output of a streamed run, as the code wrote it (UTF-8 decoded, never a split character).

    `dropped` counts the characters of this stream left out (budget or buffer) since its previous
    message; a final message with empty `text` reports what was dropped at the end of the run."""

    op: Literal["output"]
    stream: Literal["stdout", "stderr"]
    text: str
    dropped: int
    token: NotRequired[str]


class Fatal(TypedDict):
    """The runner could not start (or got a request it does not know); it exits after this."""

    op: Literal["fatal"]
    message: str
    token: NotRequired[str]


# ---------------------------------------------------------------------- Ray: driver <-> node agent


class NodeOpened(TypedDict):
    """A session was opened (or forked: then `report` is the fork's `ForkReport` as JSON)."""

    kind: Literal["opened"]
    isolation: str
    report: NotRequired[dict[str, Any]]


class NodeToolEvent(TypedDict):
    """The node-side stub of a tool was called: the driver runs the tool and answers by `id`."""

    kind: Literal["tool"]
    id: int
    name: str
    args: list[Any]
    kwargs: dict[str, Any]


class NodeOutput(TypedDict):
    """Output of a streamed run on the node (an `OutputMessage` without its envelope)."""

    kind: Literal["output"]
    stream: Literal["stdout", "stderr"]
    text: str
    dropped: int


class NodeDone(TypedDict):
    """The run ended; `result` is the node's `ExecutionResult` as JSON."""

    kind: Literal["done"]
    result: dict[str, Any]


class NodeValue(TypedDict):
    kind: Literal["value"]
    value: Any


class NodeError(TypedDict):
    """The node-side call raised; `type` names an exception of `ray.node.RAISABLE`."""

    kind: Literal["error"]
    type: str
    message: str


class NodeLost(TypedDict):
    """The node no longer holds the session."""

    kind: Literal["lost"]
    message: str


NodeRunEvent = NodeToolEvent | NodeOutput | NodeDone | NodeError | NodeLost
NodeAnswer = NodeValue | NodeError | NodeLost
