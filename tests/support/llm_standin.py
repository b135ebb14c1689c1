"""An OpenAI-compatible chat-completions server on loopback that serves scripted replies.

litellm reaches it through `api_base` over real HTTP, exactly as it reaches a provider, so the agents'
requests (messages, tools, response formats, timeouts) and litellm's parsing of replies are the real
ones. Each test gets its own server and queues the replies the "model" will give, in order:

    with StandinLLM() as llm:
        llm.add(reply(content='{"thought": "...", "code": "print(1)"}'), reply(tool_calls=[...]))
        agent = CodeActAgent(llm.model("json"), litellm_params=llm.params())

A request with `"stream": true` is answered with server-sent events, as OpenAI streams: a
`chat.completion.chunk` per delta (content, and tool-call deltas by index), a chunk with the
finish_reason, a usage chunk when `stream_options.include_usage` asks for one, then `data: [DONE]`;
`cut()` drops the connection mid-stream.

The server records every request body (`llm.requests`) so tests can check what the agent sent.
When the script runs out it answers 500 with a message saying so, which fails the test loudly.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Models the stand-in serves, and what litellm is told they support (via litellm.register_model).
STANDIN_MODELS: dict[str, dict[str, Any]] = {
    "native": {"supports_function_calling": True, "supports_response_schema": True, "supports_vision": True},
    "json": {"supports_function_calling": False, "supports_response_schema": True},
    "plain": {"supports_function_calling": False, "supports_response_schema": False},
}
PRICE_IN = 1e-6
PRICE_OUT = 2e-6


def register_standin_models() -> None:
    """Tell litellm about the stand-in's models: their capabilities and a price, so cost is computed."""
    import litellm

    litellm.register_model(
        {
            f"openai/standin-{kind}": {
                "litellm_provider": "openai",
                "mode": "chat",
                "max_tokens": 8192,
                "max_input_tokens": 128000,
                "max_output_tokens": 8192,
                "input_cost_per_token": PRICE_IN,
                "output_cost_per_token": PRICE_OUT,
                "cache_read_input_token_cost": 0.0,
                "cache_creation_input_token_cost": 0.0,
                **caps,
            }
            for kind, caps in STANDIN_MODELS.items()
        }
    )


@dataclass
class Reply:
    """One scripted answer. `status` other than 200 sends an error; `raw` sends that body verbatim."""

    content: str | None = None
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0
    usage: tuple[int, int] | None = None
    raw: str | None = None
    respond: Callable[[dict[str, Any]], Reply] | None = None
    # Streaming (`stream: true` requests): characters of content (and of tool-call arguments) per
    # delta, and, when set, how many chunks are sent before the connection is cut mid-stream.
    chunk_chars: int = 7
    cut_after: int | None = None
    usage_chunk: bool = True  # False: a server that never sends the usage chunk (the client counts)


def reply(
    content: str | None = None,
    *,
    tool_calls: list[tuple[str, Any]] | None = None,
    usage: tuple[int, int] | None = None,
) -> Reply:
    """A normal completion. Tool call arguments may be a dict (sent as JSON) or a string (sent as is)."""
    return Reply(content=content, tool_calls=list(tool_calls or []), usage=usage)


def cut(content: str, after: int = 2, chunk_chars: int = 7) -> Reply:
    """A streamed reply whose connection drops after `after` chunks (no finish, no [DONE])."""
    return Reply(content=content, cut_after=after, chunk_chars=chunk_chars)


def error(status: int = 500, message: str = "internal error") -> Reply:
    return Reply(status=status, content=message)


def dynamic(respond: Callable[[dict[str, Any]], Reply | str]) -> Reply:
    """A reply computed from the request body (e.g. from the task in its messages): for concurrent runs,
    whose requests reach the server in no fixed order."""

    def make(body: dict[str, Any]) -> Reply:
        r = respond(body)
        return reply(r) if isinstance(r, str) else r

    return Reply(respond=make)


def garbled(body: str = '{"choices": [{"message": ') -> Reply:
    """A 200 whose body is not valid JSON (a proxy cutting the response short)."""
    return Reply(raw=body)


def slow(seconds: float, then: Reply | None = None) -> Reply:
    """A reply that arrives only after `seconds` (use with a smaller litellm `timeout`)."""
    base = then or reply("too late")
    return Reply(
        content=base.content, tool_calls=base.tool_calls, usage=base.usage, delay=seconds, status=base.status
    )


def request_problem(body: dict[str, Any]) -> str | None:
    """What a real OpenAI endpoint would reject in this request (400), or None.

    Checked like the provider checks them: message roles and content, and the pairing of assistant
    `tool_calls` with the `tool` messages that answer each of them, in order.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    pending: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("system", "user", "assistant", "tool", "developer"):
            return f"messages[{i}]: invalid role {role!r}"
        if role == "tool":
            if m.get("tool_call_id") not in pending:
                return f"messages[{i}]: a tool message must answer a tool_call_id of the preceding assistant message"
            pending.discard(m["tool_call_id"])
            continue
        if pending:
            return f"messages[{i}]: tool_calls {sorted(pending)} were not answered by tool messages"
        content = m.get("content")
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            return f"messages[{i}]: content is required"
        if not isinstance(content, str | list | type(None)):
            return f"messages[{i}]: content must be a string or a list of parts"
        if role == "assistant" and m.get("tool_calls"):
            pending = {c.get("id") for c in m["tool_calls"]}
    if pending:
        return f"tool_calls {sorted(pending)} were not answered by tool messages"
    for tool in body.get("tools") or []:
        if tool.get("type") != "function" or not tool.get("function", {}).get("name"):
            return "each tool must be {'type': 'function', 'function': {'name': ...}}"
    fmt = body.get("response_format")
    if fmt is not None:
        if fmt.get("type") == "json_schema":
            schema = fmt.get("json_schema") or {}
            if not schema.get("name") or not isinstance(schema.get("schema"), dict):
                return "response_format json_schema needs a 'name' and a 'schema'"
        elif fmt.get("type") not in ("json_object", "text"):
            return f"unsupported response_format type {fmt.get('type')!r}"
    return None


class StandinLLM:
    """The server. Use as a context manager; `model(kind)` and `params()` configure litellm to reach it."""

    def __init__(self, response_formats: Collection[str] | None = None) -> None:
        # The response_format types this server accepts (None: all). llama-cpp-python's server (0.3.x)
        # accepts only "text" and "json_object" and answers anything else with a 500 whose message is
        # the pydantic validation error naming those two (seen here against the real server).
        self.response_formats = None if response_formats is None else set(response_formats)
        self.script: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self._lock = threading.Lock()
        self._counter = 0
        handler = self._make_handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="standin-llm", daemon=True)

    # ------------------------------------------------------------------ public

    @property
    def api_base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def model(self, kind: str = "json") -> str:
        if kind not in STANDIN_MODELS:
            raise ValueError(f"unknown stand-in model kind {kind!r}")
        return f"openai/standin-{kind}"

    def params(self, **extra: Any) -> dict[str, Any]:
        return {"api_base": self.api_base, "api_key": "sk-standin", **extra}

    def add(self, *replies: Reply | str) -> StandinLLM:
        with self._lock:
            for r in replies:
                self.script.append(reply(r) if isinstance(r, str) else r)
        return self

    @property
    def remaining(self) -> int:
        return len(self.script)

    def __enter__(self) -> StandinLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ serving

    def _next(self, body: dict[str, Any]) -> Reply | None:
        with self._lock:
            self.requests.append(body)
            self._counter += 1
            return self.script.popleft() if self.script else None

    def _completion(self, body: dict[str, Any], r: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": r.content}
        if r.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{self._counter}_{i}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
                for i, (name, args) in enumerate(r.tool_calls)
            ]
        if r.usage is not None:
            prompt, completion = r.usage
        else:  # a rough, deterministic count: four characters a token
            prompt = max(1, len(json.dumps(body.get("messages", []))) // 4)
            completion = max(1, len(json.dumps(message)) // 4)
        return {
            "id": f"chatcmpl-standin-{self._counter}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "standin"),
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if r.tool_calls else "stop"}
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }

    def _chunks(self, body: dict[str, Any], r: Reply) -> list[dict[str, Any]]:
        """The reply as OpenAI `chat.completion.chunk`s: role, content and tool-call deltas, the finish,
        and a usage chunk (empty `choices`) when `stream_options.include_usage` asks for one."""
        whole = self._completion(body, r)
        message = whole["choices"][0]["message"]
        base = {"id": whole["id"], "object": "chat.completion.chunk", "created": whole["created"]}
        base["model"] = whole["model"]

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        n = max(1, r.chunk_chars)
        text = message.get("content") or ""
        # as OpenAI does: the opening delta's content is null when the reply is tool calls alone
        out = [chunk({"role": "assistant", "content": "" if text or not message.get("tool_calls") else None})]
        out += [chunk({"content": text[i : i + n]}) for i in range(0, len(text), n)]
        for index, call in enumerate(message.get("tool_calls") or []):
            head = {"index": index, "id": call["id"], "type": "function"}
            out.append(chunk({"tool_calls": [{**head, "function": {"name": call["function"]["name"]}}]}))
            args = call["function"]["arguments"]
            for i in range(0, len(args), n):
                out.append(
                    chunk({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + n]}}]})
                )
        out.append(chunk({}, whole["choices"][0]["finish_reason"]))
        if r.usage_chunk and (body.get("stream_options") or {}).get("include_usage"):
            out.append({**base, "choices": [], "usage": whole["usage"]})
        return out

    def _make_handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: dict[str, Any] | str) -> None:
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def _stream(self, body: dict[str, Any], r: Reply) -> None:
                """Server-sent events over chunked transfer encoding, as OpenAI streams a completion."""
                chunks = standin._chunks(body, r)
                events = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
                if r.cut_after is not None:
                    events = events[: r.cut_after]
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for event in events:
                        data = event.encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    if r.cut_after is not None:  # the connection drops mid-body: no terminating chunk
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(
                        400, {"error": {"message": "request body is not JSON", "type": "invalid_request"}}
                    )
                    return
                fmt = body.get("response_format")
                accepted = standin.response_formats
                if accepted is not None and isinstance(fmt, dict) and fmt.get("type") not in accepted:
                    names = " or ".join(repr(t) for t in sorted(accepted))
                    standin.rejected.append(f"response_format type {fmt.get('type')!r}")
                    detail = {
                        "type": "literal_error",
                        "loc": ("body", "response_format", "type"),
                        "msg": f"Input should be {names}",
                        "input": fmt.get("type"),
                    }
                    message = f"1 validation error:\n  {detail}\n"
                    self._send(
                        500,
                        {
                            "error": {
                                "message": message,
                                "type": "internal_server_error",
                                "param": None,
                                "code": None,
                            }
                        },
                    )
                    return
                problem = request_problem(body)
                if problem is not None:  # as the provider would: 400, and the script does not advance
                    standin.rejected.append(problem)
                    self._send(400, {"error": {"message": problem, "type": "invalid_request_error"}})
                    return
                r = standin._next(body)
                if r is None:
                    self._send(
                        500, {"error": {"message": "stand-in script exhausted", "type": "server_error"}}
                    )
                    return
                if r.respond is not None:
                    r = r.respond(body)
                if r.delay:
                    time.sleep(r.delay)
                if r.status != 200:
                    self._send(r.status, {"error": {"message": r.content or "error", "type": "server_error"}})
                elif r.raw is not None:
                    self._send(200, r.raw)
                elif body.get("stream"):
                    self._stream(body, r)
                else:
                    self._send(200, standin._completion(body, r))

        return Handler


# ---------------------------------------------------------------------- scripted agent replies


def react_call(action: str, args: dict[str, Any] | None = None, thought: str = "I will use a tool.") -> str:
    """A ReAct step in the JSON format, with `args` as a JSON string (as the prompt asks)."""
    return json.dumps({"thought": thought, "action": action, "args": json.dumps(args or {})})


def react_finish(answer: Any, successful: bool = True, thought: str = "I can answer now.") -> str:
    return json.dumps(
        {"thought": thought, "action": "FINISH", "final_answer": answer, "task_successful": successful}
    )


def code_step(code: str, thought: str = "Let me compute this.") -> str:
    """A CodeAct step in the JSON format."""
    return json.dumps({"thought": thought, "code": code})


def code_final(answer: Any, successful: bool = True, thought: str = "I can answer now.") -> str:
    return json.dumps({"thought": thought, "final_answer": answer, "task_successful": successful})


async def collect(responses: Any) -> list[Any]:
    """Drain an agent's `run()` into a list."""
    return [r async for r in responses]
