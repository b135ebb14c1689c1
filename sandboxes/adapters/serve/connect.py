"""The Connect protocol (connectrpc.com/docs/protocol) as envd speaks it to the e2b SDK: the JSON
codec, uncompressed, over HTTP/1.1.

* unary: ``POST /<service>/<Method>``, ``Content-Type: application/json``; the reply is the JSON
  message with 200, or an error object ``{"code", "message"}`` with the status the spec gives the code;
* server streaming: the request body is one *envelope* (a flags byte, a big-endian uint32 length, the
  payload) and the reply a sequence of envelopes (``application/connect+json``), the last one flagged
  ``0x02``: ``{}`` or ``{"error": {...}}``, how a stream reports an error once 200 was sent.

Every request is hostile: its size is bounded before it is read, an envelope's claimed length is
checked against the bytes that actually arrived, and the JSON must be an object.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .errors import ServeError, TooLarge

STREAM_CONTENT_TYPE = "application/connect+json"
UNARY_CONTENT_TYPE = "application/json"
END_STREAM_FLAG = 0x02
COMPRESSED_FLAG = 0x01
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

_CODE_OF_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    413: "resource_exhausted",
    429: "resource_exhausted",
    502: "unavailable",
    503: "unavailable",
}


class RpcError(ServeError):
    """An error answered as a Connect error: `code` is one of the spec's codes."""

    def __init__(self, code: str, message: str) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"not a Connect error code: {code!r}")
        super().__init__(message, status=HTTP_STATUS[code])
        self.code = code
        self.message = message

    @classmethod
    def of(cls, error: ServeError) -> RpcError:
        """The Connect form of a `ServeError` (a refusal of `resolve`, a cap)."""
        if isinstance(error, RpcError):
            return error
        return cls(_CODE_OF_STATUS.get(error.status, "internal"), str(error))

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def error_response(error: ServeError) -> Response:
    """A unary call's error reply."""
    rpc = RpcError.of(error)
    return Response(json.dumps(rpc.to_json()), status_code=rpc.status, media_type=UNARY_CONTENT_TYPE)


def unary_response(message: dict[str, Any]) -> Response:
    return Response(json.dumps(message, separators=(",", ":")), media_type=UNARY_CONTENT_TYPE)


def envelope(message: dict[str, Any], *, end: bool = False) -> bytes:
    """Frame one JSON message (or the end-of-stream message when `end`)."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(END_STREAM_FLAG if end else 0, len(payload)) + payload


def end_of_stream(error: RpcError | None = None) -> bytes:
    return envelope({"error": error.to_json()} if error else {}, end=True)


async def read_body(request: Request, cap: int) -> bytes:
    """The request's body, refused (`TooLarge`) as soon as it is known to pass `cap` bytes: from its
    Content-Length before a byte is read, else while it streams in."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit() or len(declared) > 19:
            raise RpcError("invalid_argument", f"invalid Content-Length {declared!r}")
        if int(declared) > cap:
            raise TooLarge(
                f"the request body of {int(declared):,} bytes is over this server's cap of {cap:,}"
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise TooLarge(f"the request body is over this server's cap of {cap:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(payload: bytes) -> dict[str, Any]:
    try:
        message = json.loads(payload or b"{}")
    except ValueError as exc:
        raise RpcError("invalid_argument", f"the request is not valid JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise RpcError("invalid_argument", "the request message must be a JSON object")
    return message


def parse_single_envelope(body: bytes) -> dict[str, Any]:
    """The request message of a server-streaming call: exactly one uncompressed envelope, whose
    claimed length must be the bytes that follow its header (never trusted to size anything)."""
    if len(body) < _HEADER.size:
        raise RpcError("invalid_argument", "the request body is shorter than an envelope header")
    flags, length = _HEADER.unpack_from(body)
    if flags & COMPRESSED_FLAG:
        raise RpcError(
            "unimplemented", "compressed request envelopes are not supported; send them uncompressed"
        )
    if len(body) != _HEADER.size + length:
        raise RpcError(
            "invalid_argument",
            f"the request envelope claims {length:,} bytes but {len(body) - _HEADER.size:,} followed its header",
        )
    return parse_json(body[_HEADER.size :])


def timeout_seconds(raw: str | None) -> float | None:
    """The client's deadline (``Connect-Timeout-Ms``), or None when it sent none."""
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 10:
        raise RpcError("invalid_argument", f"invalid Connect-Timeout-Ms header {raw!r}")
    return int(raw) / 1000.0
