"""Every model call goes through here: litellm, retries with backoff, and usage/cost accounting.

litellm is imported on first use, never at `import kodeagent`: its import takes seconds (and reaches
for the network unless ``LITELLM_LOCAL_MODEL_COST_MAP=True``), which a program that only builds tools
or prints responses should not pay.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from functools import cache
from types import ModuleType
from typing import Any

import anyio
from pydantic import BaseModel, Field

from .errors import ConfigurationError, LLMError, MissingDependency, RetryError
from .models import UsageRecord
from .usage import UsageTracker


@cache
def litellm_module() -> ModuleType:
    """Import litellm once, on demand."""
    # Without this, importing litellm fetches its price list from the network: slow, and it fails
    # offline. The bundled list is used instead unless the caller has chosen otherwise.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependency("model calls need litellm: pip install 'kodeagent[agents]'") from exc
    litellm.suppress_debug_info = True
    return litellm


class LLMReply(BaseModel):
    """What a model call returned, reduced to what the agents use."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: UsageRecord


_AUTH_WORDS = re.compile(
    r"missing credentials|api[_ ]?key|unauthori[sz]ed|invalid (?:x-)?api|authentication|permission denied",
    re.I,
)


def is_auth_problem(exc: BaseException) -> bool:
    """A missing or rejected credential (401/403, or a client that has no key): retrying cannot help.

    litellm reports a missing key for some providers as an InternalServerError, so the status alone
    does not tell; the message does.
    """
    litellm = litellm_module()
    if isinstance(exc, litellm.AuthenticationError | litellm.PermissionDeniedError):
        return True
    if getattr(exc, "status_code", None) in (401, 403):
        return True
    return bool(_AUTH_WORDS.search(str(exc)))


def names_response_format(exc: BaseException | None) -> bool:
    """The error is the server refusing the request's response_format (a validation error naming it)."""
    if exc is None:
        return False
    response = getattr(exc, "response", None)
    text = f"{exc} {getattr(response, 'text', '')}".lower()
    return "response_format" in text and (
        "validation" in text
        or "input should be" in text
        or "unsupported" in text
        or "not supported" in text
        or "invalid" in text
    )


def _is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: timeouts, connection problems, rate limits, 5xx from the provider."""
    litellm = litellm_module()
    if is_auth_problem(exc) or names_response_format(exc):
        return False
    permanent = (
        litellm.AuthenticationError,
        litellm.BadRequestError,
        litellm.NotFoundError,
        litellm.PermissionDeniedError,
        litellm.ContextWindowExceededError,
    )
    if isinstance(exc, permanent):
        return False
    transient = (
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.RateLimitError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
        litellm.BadGatewayError,
    )
    if isinstance(exc, transient):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status >= 500 or status in (408, 409, 429))


def _tool_calls(message: Any) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(getattr(message, "tool_calls", None) or []):
        function = getattr(call, "function", None)
        calls.append(
            {
                "id": getattr(call, "id", None) or f"call_{i}",
                "type": "function",
                "function": {
                    "name": getattr(function, "name", "") or "",
                    "arguments": getattr(function, "arguments", "") or "",
                },
            }
        )
    return calls


def _cost(litellm: ModuleType, response: Any) -> float | None:
    """The call's cost in dollars, or None when litellm has no price for the model (unknown, not $0)."""
    try:
        return float(litellm.completion_cost(completion_response=response) or 0.0)
    except Exception:  # unknown model or provider without pricing: count tokens, not money
        return None


OnDelta = Callable[[str], Awaitable[None]]
"""Called with each piece of a streamed reply's text, as it arrives."""
OnRetry = Callable[[int, BaseException], Awaitable[None]]
"""Called when a streamed attempt that already gave text failed and is retried: (next attempt, error)."""


async def _streamed(
    litellm: ModuleType, model: str, messages: list[dict[str, Any]], params: dict[str, Any], on_delta: OnDelta
) -> tuple[Any, bool]:
    """One streamed attempt: each text delta to `on_delta`, then the chunks built into one response.

    `stream_chunk_builder` assembles content and native tool-call deltas, and takes the usage from the
    stream's usage chunk, or counts the tokens when the server sent none. Returns (response, whether any
    text was delivered); an error raised mid-stream carries `streamed_text` for the retry notice.
    """
    chunks: list[Any] = []
    delivered = False
    try:
        stream = await litellm.acompletion(
            model=model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **params,
        )
        async for chunk in stream:
            chunks.append(chunk)
            choices = getattr(chunk, "choices", None) or []
            text = getattr(getattr(choices[0], "delta", None), "content", None) if choices else None
            if text:
                delivered = True
                await on_delta(text)
    except Exception as exc:
        exc.streamed_text = delivered  # type: ignore[attr-defined]
        raise
    response = litellm.stream_chunk_builder(chunks, messages=messages)
    if response is None:
        raise LLMError(f"model call to {model!r} streamed no reply (no chunks)")
    message = response.choices[0].message
    if message.content == "" and getattr(message, "tool_calls", None):
        message.content = None  # a reply of tool calls alone reads as it does unstreamed: no text
    return response, delivered


async def call_llm(
    model: str,
    messages: list[dict[str, Any]],
    *,
    component: str,
    usage_tracker: UsageTracker | None = None,
    litellm_params: dict[str, Any] | None = None,
    max_retries: int = 3,
    retry_base_delay: float = 1.0,
    tools: list[dict[str, Any]] | None = None,
    response_format: dict[str, Any] | None = None,
    on_delta: OnDelta | None = None,
    on_retry: OnRetry | None = None,
) -> LLMReply:
    """Call `model` through litellm and record the usage under `component`.

    Transient failures are retried up to `max_retries` times with exponential backoff and jitter;
    other failures raise `LLMError` at once. When retries run out, `RetryError` carries the last error.
    litellm's and the OpenAI client's own retries are switched off (unless `litellm_params` says
    otherwise) so that the retry policy, and the count of attempts, is this one.

    With `on_delta` the reply is streamed (``stream=True`` with a usage chunk): each text delta goes
    to `on_delta` as it arrives, and the whole reply is returned as a non-streamed one is, usage and
    cost included. A failed attempt that already streamed text is announced to `on_retry` before the
    retry, so the consumer can drop the partial text.
    """
    litellm = litellm_module()
    check_litellm_params(litellm_params)
    params: dict[str, Any] = {"num_retries": 0, "max_retries": 0, **(litellm_params or {})}
    if tools:
        params["tools"] = tools
    if response_format is not None:
        params["response_format"] = response_format
    attempts = max(0, max_retries) + 1
    started = time.perf_counter()
    last_error: BaseException | None = None
    for attempt in range(1, attempts + 1):
        try:
            if on_delta is None:
                response = await litellm.acompletion(model=model, messages=messages, **params)
            else:
                response, _ = await _streamed(litellm, model, messages, params, on_delta)
        except Exception as exc:
            if not _is_transient(exc):
                hint = ""
                if is_auth_problem(exc):
                    hint = (
                        " (authentication: set the provider's key, e.g. OPENAI_API_KEY, or pass api_key in "
                        "litellm_params / --api-key; a local OpenAI-compatible server takes any key)"
                    )
                raise LLMError(f"model call to {model!r} failed: {exc}{hint}") from exc
            last_error = exc
            if attempt < attempts and on_retry is not None and getattr(exc, "streamed_text", False):
                await on_retry(attempt + 1, exc)
            if attempt < attempts:
                delay = retry_base_delay * (2 ** (attempt - 1))
                await anyio.sleep(delay * (0.5 + random.random() / 2))
            continue
        choice = response.choices[0]
        usage = getattr(response, "usage", None)
        record = UsageRecord(
            component=component,
            model=model,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            cost=_cost(litellm, response),
            duration=time.perf_counter() - started,
            attempts=attempt,
        )
        if usage_tracker is not None:
            usage_tracker.add(record)
        content = choice.message.content
        return LLMReply(
            content=content if isinstance(content, str) else (None if content is None else str(content)),
            tool_calls=_tool_calls(choice.message),
            finish_reason=getattr(choice, "finish_reason", None),
            usage=record,
        )
    raise RetryError(
        f"model call to {model!r} failed {attempts} times; last error: {last_error}", last_error=last_error
    )


def check_litellm_params(params: dict[str, Any] | None) -> None:
    """Refuse options the agents cannot honour, with the reason, before any call is made."""
    if params and params.get("stream"):
        raise ConfigurationError(
            "litellm_params={'stream': True} is not supported: an agent needs each whole reply to read "
            "its step. Pass the agent option stream=True instead: the reply's tokens are yielded as "
            "'token' responses and the whole reply is still read as one."
        )


def knows_model(model: str) -> bool:
    """Whether litellm has facts about `model` (its capabilities and price); a local server's is unknown."""
    litellm = litellm_module()
    try:
        litellm.get_model_info(model=model)
    except Exception:
        return False
    return True


def supports(model: str, capability: str) -> bool:
    """Ask litellm whether `model` has a capability ("function_calling", "vision", "response_schema")."""
    litellm = litellm_module()
    check = getattr(litellm, f"supports_{capability}", None)
    if check is None:
        return False
    try:
        return bool(check(model=model))
    except Exception:  # litellm raises for models it has never heard of
        return False


def llm_vision_support(model_names: list[str]) -> list[bool]:
    """Check whether images can be used with each of the given models (as litellm knows them)."""
    return [supports(name, "vision") for name in model_names]
