"""A code-interpreter cell, run *inside* a session (standard library only; its source is sent and run in
a fresh namespace, never imported there): the cell's code in its context's own namespace, then what a
notebook displays for its last expression (text, JSON, PNG, HTML, ...), or its error.

Each context's namespace lives in the session's interpreter (a private entry of `sys.modules`), so it
goes when the session does: finding a context the server knows without its namespace is how a lost
state is told. The cell's output is the session's stdout/stderr, which the server streams.

`main(request)` answers ``{"fresh", "count", "display", "error", "spill"}``; the parent trusts none of
it (the cell may have replaced this code) and validates what it uses.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import linecache
import os
import sys
import traceback
import types
import uuid
from typing import Any

_REGISTRY = "__kodeagent_contexts__"
_FORMATS = (
    ("_repr_html_", "html"),
    ("_repr_markdown_", "markdown"),
    ("_repr_svg_", "svg"),
    ("_repr_png_", "png"),
    ("_repr_jpeg_", "jpeg"),
    ("_repr_latex_", "latex"),
    ("_repr_json_", "json"),
    ("_repr_javascript_", "javascript"),
)


def _registry() -> dict[str, Any]:
    module = sys.modules.get(_REGISTRY)
    if module is None:
        module = types.ModuleType(_REGISTRY)
        module.contexts = {}  # type: ignore[attr-defined]
        sys.modules[_REGISTRY] = module
    return module.contexts


def _namespace(context: str) -> tuple[dict[str, Any], bool]:
    contexts = _registry()
    fresh = context not in contexts
    if fresh:
        contexts[context] = {"namespace": {"__name__": "__main__", "__builtins__": __builtins__}, "count": 0}
    return contexts[context], fresh


def _display(value: Any, budget: int) -> tuple[dict[str, Any], str | None]:
    """What a notebook shows for `value`, and the path of a spilled PNG when it did not fit `budget`."""
    shown: dict[str, Any] = {}
    try:
        shown["text"] = repr(value)[:budget]
    except Exception as exc:  # a broken __repr__ is the cell's, shown as a notebook shows it
        shown["text"] = f"<repr failed: {type(exc).__name__}>"
    for method, key in _FORMATS:
        render = getattr(type(value), method, None)
        if render is None:
            continue
        try:
            data = render(value)
        except Exception:
            continue
        if isinstance(data, bytes):
            data = base64.b64encode(data).decode()
        if data is not None:
            shown[key] = data
    if isinstance(value, (dict, list)) and "json" not in shown:
        try:
            json.dumps(value)
            shown["json"] = value
        except (TypeError, ValueError):
            pass
    if "png" not in shown and type(value).__module__.startswith("matplotlib") and hasattr(value, "savefig"):
        buffer = io.BytesIO()
        try:
            value.savefig(buffer, format="png")
            shown["png"] = base64.b64encode(buffer.getvalue()).decode()
        except Exception:
            pass
    spill = None
    if len(json.dumps(shown, default=str)) > budget and "png" in shown:
        os.makedirs(".kodeagent-display", exist_ok=True)
        spill = os.path.join(".kodeagent-display", uuid.uuid4().hex + ".png")
        with open(spill, "wb") as file:
            file.write(base64.b64decode(shown.pop("png")))
    for key in [k for k in shown if k != "text"]:
        if len(json.dumps(shown, default=str)) <= budget:
            break
        shown.pop(key)
    return shown, spill


def _error(exc: BaseException) -> dict[str, str]:
    frames = traceback.extract_tb(exc.__traceback__)
    kept = [frame for frame in frames if frame.filename == "<cell>"]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(kept)]
    lines += traceback.format_exception_only(type(exc), exc)
    return {"name": type(exc).__name__, "value": str(exc), "traceback": "".join(lines)}


def _run(code: str, namespace: dict[str, Any]) -> Any:
    linecache.cache["<cell>"] = (len(code), None, code.splitlines(True), "<cell>")  # tracebacks show lines
    tree = ast.parse(code, "<cell>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)
    if not isinstance(last, ast.Expr):
        return None
    return eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)


def main(request: dict[str, Any]) -> dict[str, Any]:
    context, fresh = _namespace(request["context"])
    if request.get("op") == "forget":
        _registry().pop(request["context"], None)
        return {"fresh": fresh}
    if request.get("op") == "touch":
        return {"fresh": fresh}
    context["count"] += 1
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    answer: dict[str, Any] = {
        "fresh": fresh,
        "count": context["count"],
        "display": None,
        "error": None,
        "spill": None,
    }
    try:
        os.environ.update(request["envs"])
        os.chdir(os.path.realpath(os.path.join(saved_cwd, request["cwd"])))
        value = _run(request["code"], context["namespace"])
        if value is not None:
            context["namespace"]["_"] = value
            answer["display"], answer["spill"] = _display(value, int(request["budget"]))
    except BaseException as exc:  # the cell's error, reported as a notebook reports it
        answer["error"] = _error(exc)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return answer
