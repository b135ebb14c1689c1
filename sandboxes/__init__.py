"""sandboxes: run untrusted Python for CodeAct agents, on this machine, in Docker, or in E2B.

One interface (`Executor`), three backends, one runner inside every sandbox. Nothing here knows
about language models.
"""

from typing import TYPE_CHECKING, Any

from .backends import executor_class, open_executor
from .egress.policy import NetworkPolicy, NetworkReport
from .errors import (
    BackendUnavailable,
    EgressUnavailable,
    ExecutorBusy,
    ExecutorClosed,
    FileTooLarge,
    ForkError,
    ProtocolError,
    SandboxError,
    SandboxFileError,
    UnknownBackend,
    WorkerStartError,
)
from .events import (
    Event,
    EventStream,
    OutputEvent,
    ResultEvent,
    StreamBudget,
    ToolCallEvent,
    ToolResultEvent,
)
from .executor import Executor, ExecutorOptions, ExecutorState, Snapshot
from .grading import (
    Graded,
    Grading,
    Program,
    ProgramStatus,
    SandboxFailure,
    Verdict,
    grade,
    grade_all,
    grade_sync,
)
from .models import Artifact, ExecutionError, ExecutionResult, ForkReport, RunUsage
from .policy import DEFAULT_ALLOWED_IMPORTS, Limits, Policy
from .sync import SyncEventStream, SyncExecutor, open_executor_sync

if TYPE_CHECKING:  # type checkers see the real classes; at run time they load on first use
    from .backends.docker import DockerExecutor
    from .backends.e2b import E2BExecutor
    from .backends.host import HostExecutor
    from .backends.ray import RayExecutor

_LAZY_BACKENDS = {
    "HostExecutor": "host",
    "DockerExecutor": "docker",
    "E2BExecutor": "e2b",
    "RayExecutor": "ray",
}


def __getattr__(name: str) -> Any:
    # The backend classes load on first use, so that `import sandboxes` stays cheap and needs neither
    # the Docker, the E2B nor the Ray SDK.
    if name in _LAZY_BACKENDS:
        return executor_class(_LAZY_BACKENDS[name])
    if name == "__version__":
        from .version import version

        return version()
    raise AttributeError(f"module 'sandboxes' has no attribute {name!r}")


__all__ = [
    "DEFAULT_ALLOWED_IMPORTS",
    "Artifact",
    "BackendUnavailable",
    "DockerExecutor",
    "EgressUnavailable",
    "E2BExecutor",
    "ExecutionError",
    "Event",
    "EventStream",
    "ExecutionResult",
    "Executor",
    "ExecutorBusy",
    "ExecutorClosed",
    "ExecutorOptions",
    "ExecutorState",
    "FileTooLarge",
    "ForkError",
    "ForkReport",
    "Graded",
    "Grading",
    "HostExecutor",
    "Limits",
    "NetworkPolicy",
    "NetworkReport",
    "OutputEvent",
    "Policy",
    "Program",
    "ProgramStatus",
    "ProtocolError",
    "RayExecutor",
    "ResultEvent",
    "RunUsage",
    "SandboxError",
    "SandboxFailure",
    "SandboxFileError",
    "Snapshot",
    "StreamBudget",
    "SyncEventStream",
    "SyncExecutor",
    "ToolCallEvent",
    "ToolResultEvent",
    "UnknownBackend",
    "Verdict",
    "WorkerStartError",
    "executor_class",
    "grade",
    "grade_all",
    "grade_sync",
    "open_executor",
    "open_executor_sync",
]
