"""kodeagent: ReAct and CodeAct agents on litellm, whose code runs in `sandboxes`.

    from kodeagent import CodeActAgent, tool, print_response

    @tool
    def get_price(symbol: str) -> float:
        \"\"\"Latest price of a stock. Args: symbol: ticker, e.g. AAPL.\"\"\"

    agent = CodeActAgent(model_name="gemini/gemini-2.5-flash", tools=[get_price])
    async for response in agent.run("Average of AAPL and MSFT prices?"):
        print_response(response, only_final=False)

Importing kodeagent is cheap: litellm is imported on the first model call, the sandbox backend when
a CodeAct run opens it.
"""

from .agent import Agent
from .branching import Branch, BranchError, adopt_branch, best_of, first_success, observer_rank
from .codeact import CodeActAgent
from .conversation import validate_openai_history
from .errors import (
    AgentBusyError,
    ConfigurationError,
    KodeAgentError,
    LLMError,
    MissingDependency,
    NoRunError,
    ResponseParseError,
    RetryError,
    ToolArgumentError,
    ToolDefinitionError,
    ToolError,
    ToolExecutionError,
    TracingUnavailable,
)
from .llm import call_llm, llm_vision_support
from .models import (
    AgentResponse,
    ChatMessage,
    CodeActChatMessage,
    ReActChatMessage,
    StepRecord,
    Task,
    ToolCallRecord,
    UsageRecord,
)
from .observation import format_observation
from .observer import Observer
from .options import AgentOptions
from .planner import Planner
from .printing import print_response
from .react import ReActAgent
from .run import AgentRun, RunArguments
from .text import neutralize_control
from .tools import Tool, as_tool, mcp_stdio_tools, select_tools, tool
from .usage import UsageTracker


def __getattr__(name: str) -> str:
    # The version is looked up on first use: importing kodeagent stays cheap.
    if name == "__version__":
        from sandboxes.version import version

        return version()
    raise AttributeError(f"module 'kodeagent' has no attribute {name!r}")


__all__ = [
    "Agent",
    "AgentBusyError",
    "AgentOptions",
    "AgentResponse",
    "AgentRun",
    "Branch",
    "BranchError",
    "ChatMessage",
    "CodeActAgent",
    "CodeActChatMessage",
    "ConfigurationError",
    "KodeAgentError",
    "LLMError",
    "MissingDependency",
    "NoRunError",
    "Observer",
    "Planner",
    "ReActAgent",
    "ReActChatMessage",
    "ResponseParseError",
    "RetryError",
    "RunArguments",
    "StepRecord",
    "Task",
    "Tool",
    "ToolArgumentError",
    "ToolCallRecord",
    "ToolDefinitionError",
    "ToolError",
    "ToolExecutionError",
    "TracingUnavailable",
    "UsageRecord",
    "UsageTracker",
    "adopt_branch",
    "as_tool",
    "best_of",
    "call_llm",
    "first_success",
    "format_observation",
    "llm_vision_support",
    "mcp_stdio_tools",
    "neutralize_control",
    "observer_rank",
    "print_response",
    "select_tools",
    "tool",
    "validate_openai_history",
]
