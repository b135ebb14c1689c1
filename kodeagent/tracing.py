"""Optional tracing of runs to Langfuse or LangSmith.

With `tracing_type=None` (the default) a no-op tracer is used and nothing is imported. When a type is
set, its package is imported at agent construction, and its absence is an immediate, explicit
`TracingUnavailable` rather than a silent loss of traces.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

from .errors import TracingUnavailable

TracingType = Literal["langfuse", "langsmith"]
_PACKAGES = {"langfuse": "langfuse", "langsmith": "langsmith"}


class AbstractObservation:
    """A trace or span that can be ended with an output."""

    def end(self, output: Any = None, error: str | None = None) -> None:  # pragma: no cover - interface
        pass


class AbstractTracerManager:
    """Starts traces (one per run) and spans (one per step or model call)."""

    def start_trace(
        self, name: str, input: Any = None, metadata: dict[str, Any] | None = None
    ) -> AbstractObservation:
        return AbstractObservation()

    def start_span(
        self, parent: AbstractObservation | None, name: str, input: Any = None
    ) -> AbstractObservation:
        return AbstractObservation()

    def flush(self) -> None:
        pass


class NoOpTracerManager(AbstractTracerManager):
    """Used when tracing is off: every call is free."""


class _LangfuseObservation(AbstractObservation):
    def __init__(self, span: Any) -> None:
        self._span = span

    def end(self, output: Any = None, error: str | None = None) -> None:
        try:
            self._span.update(output=output, level="ERROR" if error else None, status_message=error)
            self._span.end()
        except Exception:  # tracing must never break a run
            pass


def _langfuse_start(owner: Any, name: str, input: Any, metadata: dict[str, Any] | None, kind: str) -> Any:
    """Start a Langfuse observation on a client or a span: `start_observation` (v3.3+), else `start_span`."""
    if hasattr(owner, "start_observation"):
        return owner.start_observation(name=name, as_type=kind, input=input, metadata=metadata)
    return owner.start_span(name=name, input=input, metadata=metadata)


class LangfuseTracerManager(AbstractTracerManager):
    """Sends traces to Langfuse (configured by its usual LANGFUSE_* environment variables)."""

    def __init__(self, module: Any) -> None:
        self._client = module.get_client() if hasattr(module, "get_client") else module.Langfuse()

    def start_trace(
        self, name: str, input: Any = None, metadata: dict[str, Any] | None = None
    ) -> AbstractObservation:
        try:
            return _LangfuseObservation(_langfuse_start(self._client, name, input, metadata, "agent"))
        except Exception:  # tracing must never break a run
            return AbstractObservation()

    def start_span(
        self, parent: AbstractObservation | None, name: str, input: Any = None
    ) -> AbstractObservation:
        owner = parent._span if isinstance(parent, _LangfuseObservation) else self._client
        try:
            return _LangfuseObservation(_langfuse_start(owner, name, input, None, "span"))
        except Exception:
            return AbstractObservation()

    def flush(self) -> None:
        try:
            self._client.flush()
        except Exception:
            pass


class _LangSmithObservation(AbstractObservation):
    def __init__(self, run: Any) -> None:
        self._run = run

    def end(self, output: Any = None, error: str | None = None) -> None:
        try:
            self._run.end(outputs={"output": output}, error=error)
            self._run.post()
        except Exception:
            pass


class LangSmithTracerManager(AbstractTracerManager):
    """Sends traces to LangSmith (configured by its usual LANGSMITH_* environment variables)."""

    def __init__(self, module: Any) -> None:
        self._run_tree = importlib.import_module("langsmith.run_trees").RunTree

    def start_trace(
        self, name: str, input: Any = None, metadata: dict[str, Any] | None = None
    ) -> AbstractObservation:
        try:
            run = self._run_tree(
                name=name, run_type="chain", inputs={"input": input}, extra={"metadata": metadata}
            )
            return _LangSmithObservation(run)
        except Exception:
            return AbstractObservation()

    def start_span(
        self, parent: AbstractObservation | None, name: str, input: Any = None
    ) -> AbstractObservation:
        try:
            if isinstance(parent, _LangSmithObservation):
                return _LangSmithObservation(
                    parent._run.create_child(name=name, run_type="llm", inputs={"input": input})
                )
        except Exception:
            pass
        return AbstractObservation()


def make_tracer_manager(tracing_type: TracingType | None) -> AbstractTracerManager:
    """The tracer for `tracing_type`; raises `TracingUnavailable` if its package is not installed."""
    if tracing_type is None:
        return NoOpTracerManager()
    if tracing_type not in _PACKAGES:
        raise TracingUnavailable(
            f"unknown tracing_type {tracing_type!r}; use 'langfuse', 'langsmith' or None"
        )
    package = _PACKAGES[tracing_type]
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        raise TracingUnavailable(
            f"tracing_type={tracing_type!r} needs the {package} package, which is not installed: "
            f"pip install {package}  (or set tracing_type=None)"
        ) from exc
    if tracing_type == "langfuse":
        return LangfuseTracerManager(module)
    return LangSmithTracerManager(module)
