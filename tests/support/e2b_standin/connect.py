"""The Connect protocol (connectrpc.com/docs/protocol), as envd speaks it to the e2b SDK.

The SDK's envd clients use the JSON codec without compression, so only that is implemented:

* unary: ``POST /<service>/<Method>`` with ``Content-Type: application/json``; the reply is the JSON
  message with status 200, or an error object ``{"code": "...", "message": "..."}`` with the HTTP
  status that the Connect spec assigns to the code;
* server streaming: the request body is one *envelope* and the reply is a sequence of envelopes
  (``application/connect+json``). An envelope is one flags byte, a big-endian uint32 length and the
  payload; flag ``0x02`` marks the end-of-stream message ``{"error": {...}}`` or ``{}``, which is
  how a stream reports an error after the 200 status was sent.

Written from the protocol spec and checked against the SDK's client (`connectrpc`) in this repo's
tests; nothing here imports the SDK, so the stand-in cannot inherit a client bug by construction.
"""

from __future__ import annotations

import json
import struct
from typing import Any

STREAM_CONTENT_TYPE = "application/connect+json"
UNARY_CONTENT_TYPE = "application/json"
END_STREAM_FLAG = 0x02
_HEADER = struct.Struct(">BI")

HTTP_STATUS: dict[str, int] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class RpcError(Exception):
    """An error a handler returns to the client as a Connect error."""

    def __init__(self, code: str, message: str) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"not a Connect error code: {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def envelope(message: dict[str, Any], *, end: bool = False) -> bytes:
    """Frame one JSON message (or the end-of-stream message when `end`)."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(END_STREAM_FLAG if end else 0, len(payload)) + payload


def end_of_stream(error: RpcError | None = None) -> bytes:
    return envelope({"error": error.to_json()} if error else {}, end=True)


def parse_single_envelope(body: bytes) -> dict[str, Any]:
    """The request message of a server-streaming call: exactly one uncompressed envelope."""
    if len(body) < _HEADER.size:
        raise RpcError("invalid_argument", "request body is shorter than an envelope header")
    flags, length = _HEADER.unpack_from(body)
    if flags & 0x01:
        raise RpcError("internal", "compressed request envelopes are not supported by this server")
    payload = body[_HEADER.size : _HEADER.size + length]
    if len(payload) != length or len(body) != _HEADER.size + length:
        raise RpcError("invalid_argument", "request body is not exactly one envelope")
    return parse_json(payload)


def parse_json(payload: bytes) -> dict[str, Any]:
    try:
        message = json.loads(payload or b"{}")
    except ValueError as exc:
        raise RpcError("invalid_argument", f"request is not valid JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise RpcError("invalid_argument", "request message must be a JSON object")
    return message


def timeout_seconds(headers: dict[str, str]) -> float | None:
    """The client's deadline (``Connect-Timeout-Ms``), or None when it sent none."""
    raw = headers.get("connect-timeout-ms")
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 10:
        raise RpcError("invalid_argument", f"invalid Connect-Timeout-Ms header: {raw!r}")
    return int(raw) / 1000.0
