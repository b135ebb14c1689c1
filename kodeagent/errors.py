"""The exceptions kodeagent raises: one hierarchy, rooted at `KodeAgentError`.

What the *model* gets wrong (bad JSON, an unknown tool, code that fails) is not an exception: it is
told to the model as an observation and the loop goes on. These exceptions are for what the caller
must handle: misconfiguration, a provider that keeps failing, a missing optional package.
"""

from __future__ import annotations


class KodeAgentError(Exception):
    """Base class of every exception raised by kodeagent."""


class ConfigurationError(KodeAgentError, ValueError):
    """An agent or tool was constructed with arguments that cannot work."""


class AgentBusyError(KodeAgentError, RuntimeError):
    """`run()` was called on an agent that is already running a task in another asyncio task.

    An agent runs one task at a time: what it shows (`task`, `steps`, `usage_tracker`, `last_run`) is
    its run in progress, which a second concurrent run would swap under the first run's caller. Run
    parallel tasks on `agent.clone()`s. Also raised by `clear_history()` during a run, which would
    leave the run nothing to send the model.
    """


class NoRunError(KodeAgentError, RuntimeError):
    """A method that changes the agent's current run (`add_to_history`, `add_output_file`) was called
    before the agent ran a task: there is no conversation yet for it to change."""


class ToolError(KodeAgentError):
    """Base class for tool problems."""


class ToolDefinitionError(ToolError, TypeError):
    """A function cannot be turned into a tool (bad name, unsupported signature)."""


class ToolArgumentError(ToolError, ValueError):
    """The arguments given to a tool failed validation; the message lists what is wrong."""


class ToolExecutionError(ToolError):
    """A tool ran and failed (for MCP tools: the server reported an error)."""


class LLMError(KodeAgentError):
    """A model call failed in a way retrying will not fix (bad credentials, bad request, ...)."""


class RetryError(LLMError):
    """A model call kept failing with transient errors after every retry; `last_error` says why."""

    def __init__(self, message: str, last_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.last_error = last_error


class ResponseParseError(KodeAgentError, ValueError):
    """A model reply could not be understood in any of the accepted formats."""


class TracingUnavailable(KodeAgentError, ImportError):
    """`tracing_type` names a tracing backend whose package is not installed."""


class MissingDependency(KodeAgentError, ImportError):
    """An optional package (litellm, mcp, ...) is needed for this feature and is not installed."""
