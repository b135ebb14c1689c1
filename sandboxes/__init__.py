"""sandboxes: run untrusted Python for CodeAct agents, on this machine, in Docker, or in E2B.

One interface (`Executor`), three backends, one runner inside every sandbox. Nothing here knows
about language models.
"""

from .backends import executor_class, open_executor
from .errors import (
    BackendUnavailable,
    ExecutorClosed,
    ProtocolError,
    SandboxError,
    SandboxFileError,
    UnknownBackend,
    WorkerStartError,
)
from .executor import Executor
from .models import Artifact, ExecutionError, ExecutionResult
from .policy import DEFAULT_ALLOWED_IMPORTS, Limits, Policy
from .sync import SyncExecutor, open_executor_sync


def __getattr__(name: str) -> object:
    # The backend classes are imported lazily so that `import sandboxes` stays cheap.
    if name in {"HostExecutor", "DockerExecutor", "E2BExecutor", "RayExecutor"}:
        return executor_class(name[: -len("Executor")].lower())
    raise AttributeError(f"module 'sandboxes' has no attribute {name!r}")


__all__ = [
    "DEFAULT_ALLOWED_IMPORTS",
    "Artifact",
    "BackendUnavailable",
    "DockerExecutor",
    "E2BExecutor",
    "ExecutionError",
    "ExecutionResult",
    "Executor",
    "ExecutorClosed",
    "HostExecutor",
    "Limits",
    "Policy",
    "ProtocolError",
    "RayExecutor",
    "SandboxError",
    "SandboxFileError",
    "SyncExecutor",
    "UnknownBackend",
    "WorkerStartError",
    "executor_class",
    "open_executor",
    "open_executor_sync",
]
