"""Tools: Python functions (and MCP server tools) that an agent's model may call.

A tool carries its JSON schema (from type hints and the docstring) and a pydantic model of its
arguments, so that every call is validated *before* the function runs and the model is told exactly
which argument was wrong. Sync tools run in a worker thread: a slow tool must not block the event
loop, or the sandbox's wall-clock timeout could not fire while CodeAct code waits on it.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, get_type_hints

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from .errors import MissingDependency, ToolArgumentError, ToolDefinitionError, ToolExecutionError

_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*",
    re.IGNORECASE | re.MULTILINE,
)
_ARG_SECTIONS = {"args", "arguments", "parameters", "params"}


def parse_docstring(doc: str | None, param_names: Sequence[str]) -> tuple[str, dict[str, str]]:
    """Split a docstring into its summary and per-parameter descriptions.

    Understands Google style (``Args:`` then ``name (type): text``, also all on one line), and Sphinx
    style (``:param name: text``). Parameter names are known in advance, which is what makes the
    one-line form (``Args: symbol: ticker, e.g. AAPL.``) unambiguous.
    """
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    descriptions: dict[str, str] = {}
    for match in re.finditer(r":param\s+(?:[\w\[\], ]+\s+)?(\w+)\s*:\s*(.*?)(?=\n\s*:|\Z)", doc, re.S):
        descriptions[match.group(1)] = " ".join(match.group(2).split())
    doc_wo_sphinx = re.split(r"\n\s*:(?:param|type|returns?|rtype|raises)\b", doc)[0]
    # Sections may start mid-line in one-line docstrings: normalise them to start on their own line.
    normalised = re.sub(
        r"(?<=\S)\s+(Args|Arguments|Parameters|Returns|Raises)\s*:\s*", r"\n\1: ", doc_wo_sphinx
    )
    sections = _SECTION.split(normalised)
    summary = " ".join(sections[0].split())
    for i in range(1, len(sections) - 1, 2):
        if sections[i].lower() not in _ARG_SECTIONS:
            continue
        body = sections[i + 1]
        names = "|".join(re.escape(n) for n in param_names)
        if not names:
            continue
        marker = re.compile(rf"(?:^|(?<=\s))\*{{0,2}}({names})\s*(?:\([^)]*\))?\s*:\s*")
        hits = list(marker.finditer(body))
        for j, hit in enumerate(hits):
            end = hits[j + 1].start() if j + 1 < len(hits) else len(body)
            descriptions.setdefault(hit.group(1), " ".join(body[hit.end() : end].split()))
    return summary, descriptions


def _strip_titles(schema: Any) -> Any:
    """Remove pydantic's auto-generated `title` keys: noise for the model."""
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title" or not isinstance(v, str)}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def to_jsonable(value: Any) -> Any:
    """Turn a tool's result into JSON-compatible data (the sandbox channel carries JSON only)."""
    try:
        data = to_jsonable_python(value)
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return str(value)


def _format_validation_error(tool_name: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        problems.append(f"{where}: {err.get('msg')}")
    return f"invalid arguments for tool {tool_name!r}: " + "; ".join(problems)


class Tool:
    """A callable the model may use. Calling the `Tool` object calls the original function unchanged.

    Args:
        func: the implementation (sync or async).
        name: the name the model uses; defaults to the function's name. Must be a Python identifier,
            since CodeAct code calls it as a function.
        description: what the tool does; defaults to the docstring's summary.
        parameters: a JSON schema of the arguments (given for MCP tools; derived from the signature
            otherwise).
        args_model: the pydantic model arguments are validated with (derived when not given).
    """

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
        args_model: type[BaseModel] | None = None,
        localns: Mapping[str, Any] | None = None,
    ) -> None:
        self._localns = dict(localns or {})
        if not callable(func):
            raise ToolDefinitionError(f"a tool must be callable, got {type(func).__name__}")
        self.func = func
        self.name: str = name or str(getattr(func, "__name__", ""))
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise ToolDefinitionError(
                f"tool name {self.name!r} must be a Python identifier that does not start with '_'"
            )
        call_method = getattr(type(func), "__call__", None)  # noqa: B004 - async callable objects
        self.is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(call_method)
        if args_model is None or parameters is None:
            derived_model, derived_schema, summary = self._derive(func)
            args_model = args_model or derived_model
            parameters = parameters or derived_schema
            description = description or summary
        self.args_model = args_model
        self.parameters: dict[str, Any] = parameters
        self.description = (description or "").strip() or f"The {self.name} tool."
        functools.update_wrapper(self, func)

    # ------------------------------------------------------------------ schema

    def _derive(self, func: Callable[..., Any]) -> tuple[type[BaseModel], dict[str, Any], str]:
        signature = inspect.signature(func)
        try:
            hints = get_type_hints(func, localns=self._localns or None)
        except Exception:  # unresolvable forward references: fall back to raw annotations
            hints = {}
        params = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
        summary, docs = parse_docstring(inspect.getdoc(func), [p.name for p in params])
        fields: dict[str, Any] = {}
        extra: Literal["forbid", "allow"] = "forbid"
        for p in params:
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                raise ToolDefinitionError(
                    f"tool {self.name!r}: *{p.name} is not supported; models pass arguments by name"
                )
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                extra = "allow"
                continue
            annotation = hints.get(p.name, p.annotation)
            if annotation is inspect.Parameter.empty:
                annotation = Any
            default = ... if p.default is inspect.Parameter.empty else p.default

            fields[p.name] = (annotation, Field(default, description=docs.get(p.name)))
        model = create_model(
            f"{self.name}_arguments",
            __config__=ConfigDict(extra=extra, arbitrary_types_allowed=True, protected_namespaces=()),
            **fields,
        )
        try:
            schema = _strip_titles(model.model_json_schema())
        except Exception as exc:
            raise ToolDefinitionError(f"tool {self.name!r}: cannot describe its arguments: {exc}") from exc
        schema.setdefault("properties", {})
        schema.setdefault("required", [])
        return model, schema, summary

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []))

    def openai_schema(self) -> dict[str, Any]:
        """The tool in OpenAI function-calling format (what litellm passes as `tools`)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def python_signature(self) -> str:
        """How CodeAct code calls the tool, e.g. ``get_price(symbol: str, days: int = 1) -> float``."""
        properties: dict[str, Any] = self.parameters.get("properties", {})
        required = set(self.required)
        defs = self.parameters.get("$defs", {})
        parts = []
        for arg, spec in properties.items():
            text = f"{arg}: {_py_type_name(spec, defs)}"
            if arg not in required:
                text += f" = {spec.get('default')!r}"
            parts.append(text)
        returns = "Any"
        try:
            annotation = get_type_hints(self.func, localns=self._localns or None).get("return")
        except Exception:
            annotation = None
        if annotation is not None:
            returns = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
        return f"{self.name}({', '.join(parts)}) -> {returns}"

    def describe(self, style: Literal["plain", "python"] = "plain") -> str:
        """A plain-text description for prompts, with required arguments marked.

        ``style="python"`` heads it with the Python signature (for CodeAct, where tools are functions).
        """
        head = f"`{self.python_signature()}`" if style == "python" else self.name
        lines = [f"- {head}: {self.description}"]
        properties: dict[str, Any] = self.parameters.get("properties", {})
        required = set(self.required)
        if not properties:
            lines.append("    (no arguments)")
        defs = self.parameters.get("$defs", {})
        for arg, spec in properties.items():
            flag = "required" if arg in required else f"optional, default {spec.get('default')!r}"
            lines.extend(_describe_field(arg, spec, flag, defs, "    "))
        return "\n".join(lines)

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def validate(self, arguments: Mapping[str, Any] | str | None) -> dict[str, Any]:
        """Check arguments against the schema; return those to call with. Raises `ToolArgumentError`."""
        if arguments is None or arguments == "":
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise ToolArgumentError(
                    f"arguments for tool {self.name!r} are not valid JSON ({exc.msg}); "
                    'give a JSON object such as {"name": "value"}'
                ) from None
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(
                f"arguments for tool {self.name!r} must be a JSON object, got {type(arguments).__name__}"
            )
        try:
            validated = self.args_model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise ToolArgumentError(_format_validation_error(self.name, exc)) from None
        values = {name: getattr(validated, name) for name in validated.model_fields_set}
        values.update(validated.model_extra or {})
        return values

    async def ainvoke(self, arguments: Mapping[str, Any] | str | None = None) -> Any:
        """Validate and call; sync functions run in a worker thread."""
        values = self.validate(arguments)
        if self.is_async:
            return await self.func(**values)
        # abandon_on_cancel: a timeout (or any cancellation) must not wait for a blocked thread; the
        # thread finishes on its own and its result is dropped.
        result = await anyio.to_thread.run_sync(
            functools.partial(self.func, **values), abandon_on_cancel=True
        )
        if inspect.isawaitable(result):
            result = await result
        return result

    async def call_from_sandbox(self, *args: Any, **kwargs: Any) -> Any:
        """What sandboxed code reaches: positional arguments are matched to names, then validated."""
        if args:
            names = list(self.parameters.get("properties", {}))
            if len(args) > len(names):
                raise ToolArgumentError(
                    f"tool {self.name!r} takes at most {len(names)} positional arguments, got {len(args)}"
                )
            for name, value in zip(names, args, strict=False):
                if name in kwargs:
                    raise ToolArgumentError(f"tool {self.name!r} got two values for argument {name!r}")
                kwargs[name] = value
        return to_jsonable(await self.ainvoke(kwargs))


def select_tools(tools: Sequence[Tool], allowed: Sequence[str] | None) -> dict[str, Tool]:
    """The tools whose names match `allowed` (names or shell-style patterns); None allows all."""
    if allowed is None:
        return {t.name: t for t in tools}
    return {t.name: t for t in tools if any(fnmatch.fnmatchcase(t.name, p) for p in allowed)}


def tool(
    func: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None
) -> Any:
    """Decorator: make a function a `Tool`. Usable bare (``@tool``) or with options (``@tool(name=...)``)."""

    # Names local to the decorating scope (a pydantic model defined in a function, say) are needed to
    # resolve string annotations under `from __future__ import annotations`.
    caller = inspect.currentframe()
    localns = dict(caller.f_back.f_locals) if caller and caller.f_back else {}

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, localns=localns)

    return wrap(func) if func is not None else wrap


def as_tool(obj: Callable[..., Any] | Tool) -> Tool:
    """Accept a `Tool` or a plain function (which is described from its signature and docstring)."""
    return obj if isinstance(obj, Tool) else Tool(obj)


# ---------------------------------------------------------------------- MCP

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
}


def _python_type(spec: dict[str, Any]) -> Any:
    """A Python annotation for a JSON-schema fragment (the common subset MCP servers use)."""
    if "enum" in spec and spec["enum"]:
        return Literal[tuple(spec["enum"])]
    for key in ("anyOf", "oneOf"):
        if key in spec:
            options = tuple(_python_type(s) for s in spec[key] if isinstance(s, dict))
            return functools.reduce(lambda a, b: a | b, options) if options else Any
    kind = spec.get("type")
    if isinstance(kind, list):
        options = tuple(_python_type({**spec, "type": k}) for k in kind)
        return functools.reduce(lambda a, b: a | b, options) if options else Any
    if kind == "array":
        items = spec.get("items")
        return list[_python_type(items)] if isinstance(items, dict) else list[Any]  # type: ignore[misc]
    if kind == "object":
        return dict[str, Any]
    return _JSON_TYPES.get(kind or "", Any)


def model_from_json_schema(name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A pydantic model that validates arguments described by a JSON schema (object with properties)."""

    required = set(schema.get("required", []))
    fields: dict[str, Any] = {}
    for prop, spec in (schema.get("properties") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        annotation = _python_type(spec)
        if prop in required:
            fields[prop] = (annotation, Field(...))
        else:
            fields[prop] = (annotation | None, Field(spec.get("default")))
    extra: Literal["forbid", "allow"] = "allow" if schema.get("additionalProperties", False) else "forbid"
    return create_model(
        f"{name}_arguments", __config__=ConfigDict(extra=extra, protected_namespaces=()), **fields
    )


def _resolve(spec: dict[str, Any], defs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Follow a local ``$ref`` (pydantic puts model parameters in ``$defs``): (schema, model name)."""
    ref = spec.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.rsplit("/", 1)[-1]
        target = defs.get(name)
        if isinstance(target, dict):
            return {**target, **{k: v for k, v in spec.items() if k != "$ref"}}, name
    return spec, None


def _kind(spec: dict[str, Any], defs: dict[str, Any]) -> str:
    resolved, name = _resolve(spec, defs)
    if name:
        return f"object {name}"
    options = resolved.get("anyOf") or resolved.get("oneOf")
    if options:
        return " | ".join(_kind(s, defs) for s in options if isinstance(s, dict))
    if resolved.get("type") == "array" and isinstance(resolved.get("items"), dict):
        return f"array of {_kind(resolved['items'], defs)}"
    return str(resolved.get("type") or "any")


def _describe_field(
    arg: str, spec: dict[str, Any], flag: str, defs: dict[str, Any], indent: str, depth: int = 0
) -> list[str]:
    """One argument for a prompt, and, for a pydantic-model argument, its fields below it."""
    resolved, _ = _resolve(spec, defs)
    text = f"{indent}* {arg} ({_kind(spec, defs)}, {flag})"
    if spec.get("description") or resolved.get("description"):
        text += f": {spec.get('description') or resolved.get('description')}"
    if resolved.get("enum"):
        text += f" One of: {', '.join(map(repr, resolved['enum']))}."
    lines = [text]
    nested = resolved.get("properties")
    if not nested:
        for option in resolved.get("anyOf") or []:  # Optional[Model]
            if isinstance(option, dict):
                inner, name = _resolve(option, defs)
                if name and inner.get("properties"):
                    resolved, nested = inner, inner["properties"]
                    break
    if nested and depth < 3:
        lines[-1] += " Fields:"
        required = set(resolved.get("required", []))
        for field_name, field_spec in nested.items():
            field_flag = (
                "required" if field_name in required else f"optional, default {field_spec.get('default')!r}"
            )
            lines.extend(
                _describe_field(field_name, field_spec, field_flag, defs, indent + "    ", depth + 1)
            )
    return lines


def _py_type_name(spec: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    """A readable Python type for a JSON-schema fragment, for signatures shown to the model."""
    spec, name = _resolve(spec, defs or {})
    if name:
        return "dict"  # a pydantic model argument is passed as a dict of its fields (listed below)
    if spec.get("enum"):
        return "Literal[" + ", ".join(map(repr, spec["enum"])) + "]"
    options = spec.get("anyOf") or spec.get("oneOf")
    if options:
        return " | ".join(_py_type_name(s, defs) for s in options if isinstance(s, dict))
    kind = spec.get("type")
    if kind == "array":
        items = spec.get("items")
        return f"list[{_py_type_name(items, defs)}]" if isinstance(items, dict) else "list"
    names = {
        "string": "str",
        "integer": "int",
        "number": "float",
        "boolean": "bool",
        "object": "dict",
        "null": "None",
    }
    return names.get(kind or "", "Any")


def _mcp_result_value(result: Any) -> Any:
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    texts = [getattr(c, "text", None) for c in getattr(result, "content", []) or []]
    text = "\n".join(t for t in texts if t is not None)
    if getattr(result, "is_error", None) or getattr(result, "isError", None):
        raise ToolExecutionError(text or "the MCP tool reported an error")
    if isinstance(structured, dict):
        return structured["result"] if set(structured) == {"result"} else structured
    return text


def mcp_tool(session: Any, spec: Any, *, name_prefix: str = "") -> Tool:
    """Wrap one tool listed by an MCP `ClientSession` as a kodeagent `Tool`."""
    remote_name: str = spec.name
    schema = getattr(spec, "input_schema", None) or getattr(spec, "inputSchema", None) or {}
    schema = {"type": "object", "properties": {}, "required": [], **schema}
    local_name = re.sub(r"\W", "_", f"{name_prefix}{remote_name}")

    async def call(**arguments: Any) -> Any:
        return _mcp_result_value(await session.call_tool(remote_name, arguments))

    call.__name__ = local_name
    return Tool(
        call,
        name=local_name,
        description=spec.description or f"The {remote_name} tool of an MCP server.",
        parameters=_strip_titles(schema),
        args_model=model_from_json_schema(local_name, schema),
    )


@asynccontextmanager
async def mcp_stdio_tools(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    name_prefix: str = "",
) -> AsyncIterator[list[Tool]]:
    """Start an MCP server over stdio and yield its tools; the server stops when the block ends.

    Use it around the agent's run, in the same task::

        async with mcp_stdio_tools("python", ["server.py"]) as mcp:
            agent = ReActAgent("openai/gpt-4o-mini", tools=[*mcp])
            async for r in agent.run("..."): ...
    """
    try:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependency("MCP tools need the mcp package: pip install 'kodeagent[mcp]'") from exc
    params = StdioServerParameters(command=command, args=list(args), env=dict(env) if env else None, cwd=cwd)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        yield [mcp_tool(session, spec, name_prefix=name_prefix) for spec in listed.tools]
