"""The names of the kodeagent API reference, at the path it documents them (`kodeagent.kodeagent`).

Everything here is also importable from `kodeagent` directly; this module exists so that code written
against the reference's module path keeps working.
"""

from .agent import Agent
from .codeact import CodeActAgent
from .llm import llm_vision_support
from .models import AgentResponse, ChatMessage, CodeActChatMessage, ReActChatMessage, Task
from .observer import Observer
from .planner import Planner
from .printing import print_response
from .react import ReActAgent
from .tracing import AbstractObservation, AbstractTracerManager
from .usage import UsageTracker

__all__ = [
    "AbstractObservation",
    "AbstractTracerManager",
    "Agent",
    "AgentResponse",
    "ChatMessage",
    "CodeActAgent",
    "CodeActChatMessage",
    "Observer",
    "Planner",
    "ReActAgent",
    "ReActChatMessage",
    "Task",
    "UsageTracker",
    "llm_vision_support",
    "print_response",
]
