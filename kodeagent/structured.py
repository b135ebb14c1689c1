"""Structured output: the `response_format`s to ask for, best first; refusals that mean "not this one";
and a final answer validated into the run's `response_model`.

Providers differ in what they constrain: litellm knows some models' support, but not that of an
OpenAI-compatible server behind ``api_base`` (llama.cpp, vLLM, Ollama), which can only be probed. So a
step asks for the best format left and, when the server refuses that format (not the request), tries the
next, down to free text; `Agent` remembers a refusal for the rest of its life once a later format works.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from .errors import LLMError
from .llm import names_response_format
from .options import Mode, StructuredOutput
from .parsing import extract_json_object

FormatKind = Literal["json_schema", "json_object_schema", "json_object", "off"]
"""One `response_format` to try: ``json_object_schema`` is llama.cpp's schema-constrained JSON object."""


def format_kinds(
    chosen: StructuredOutput, mode: Mode, *, probe_server: bool, refused: frozenset[str] = frozenset()
) -> list[FormatKind]:
    """Formats to try for a text step, best first; ``"off"`` (free text) is always last.

    ``auto`` asks for a schema when litellm says the model supports one (`mode` ``"json"``) or when
    `probe_server` (an ``api_base`` server litellm does not know); formats in `refused` are left out.
    """
    kinds: list[FormatKind]
    if chosen == "off":
        kinds = ["off"]
    elif chosen == "json_schema":
        kinds = ["json_schema", "off"]
    elif chosen == "json_object":
        kinds = ["json_object_schema", "json_object", "off"]
    elif mode == "json" or probe_server:
        kinds = ["json_schema", "json_object_schema", "json_object", "off"]
    else:
        kinds = ["off"]
    return [k for k in kinds if k not in refused] or ["off"]


def response_format(kind: str, schema: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The `response_format` of one kind for the reply `schema` (None for free text)."""
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    if kind == "json_object_schema":  # llama.cpp's server constrains the output to `schema`
        return {"type": "json_object", "schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    return None


def refuses_format(exc: LLMError) -> bool:
    """The server rejected the request's response_format: 422, or a 400/500 whose message names it
    (llama-cpp-python's server answers an unsupported type with a 500 carrying the validation error)."""
    cause = exc.__cause__
    status = getattr(cause, "status_code", None)
    if status == 422:  # a validation error of the request (FastAPI servers; litellm may drop the body)
        return True
    return status in (400, 500) and names_response_format(cause)


def validate_final(answer: Any, model: type[BaseModel] | None) -> tuple[Any, str | None]:
    """A final answer validated into `model` (the run's `response_model`): (value, problem or None).

    An answer given as text is read as JSON when it holds an object; the problem, when there is one,
    lists each failing field so the model can fix exactly that.
    """
    if model is None:
        return answer, None
    data = answer
    if isinstance(answer, str):
        found = extract_json_object(answer)
        data = found if found is not None else answer
    try:
        return model.model_validate(data), None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'value'}: {e.get('msg')}" for e in exc.errors()
        )
        return answer, problems
