"""``GET/POST /files``: read a file, write files (``application/octet-stream``, optionally gzip, or
``multipart/form-data`` with ``file`` parts), as the e2b SDK sends them. Sizes are checked before the
body is read (its Content-Length) and while it arrives; the bytes go through the session's own
upload/download, so the session's boundary decides what they can reach."""

from __future__ import annotations

import json
import posixpath
import re
import zlib

from starlette.requests import Request
from starlette.responses import Response

from ....errors import FileTooLarge, SandboxFileError
from ..connect import RpcError, read_body
from ..errors import BadRequest, ServeError, TooLarge
from ..limits import InsideLimits
from ..paths import to_relative, to_sandbox
from ..sandbox import ServedSandbox
from . import session

MULTIPART_OVERHEAD = 64 * 1024
"""Framing a multipart body may add to its file data (boundaries, part headers)."""
MAX_PARTS = 1_000


def error(exc: ServeError) -> Response:
    """envd's HTTP error body, which the SDK reads `message` from."""
    return Response(
        json.dumps({"code": exc.status, "message": str(exc)}),
        status_code=exc.status,
        media_type="application/json",
    )


async def read(request: Request, sandbox: ServedSandbox, limits: InsideLimits) -> Response:
    path = request.query_params.get("path", "")
    relative = to_relative(path, sandbox.home)
    if relative == "":
        raise BadRequest(f"path {path!r} is a directory; read a file in it")
    # Resolved in the session (a symlink leaving the home is refused there); the bytes are then read
    # from the resolved path, which the transfer opens without following any symlink. With the guards
    # on no helper runs: the path is read as given, and a symlink on it is refused by the transfer.
    target = relative
    if not sandbox.executor.policy.python_guards:
        found = session.entry(await session.call(sandbox, {"op": "stat", "path": relative, "follow": True}))
        if found.kind == "directory":
            raise BadRequest(f"path {path!r} is a directory; read a file in it")
        if found.size > limits.max_file_bytes:  # the sandbox's word, only to refuse early: the cap holds
            raise TooLarge(_too_large(path, limits))
        target = found.path
    try:
        data = await sandbox.executor.download(target, max_bytes=limits.max_file_bytes)
    except FileTooLarge:
        raise TooLarge(_too_large(path, limits)) from None
    except SandboxFileError as exc:
        raise ServeError(f"cannot read {path!r}: {exc}", status=404) from None
    return Response(data, media_type="application/octet-stream")


def _too_large(path: str, limits: InsideLimits) -> str:
    return f"file {path!r} is larger than this server's file cap of {limits.max_file_bytes:,} bytes"


async def write(request: Request, sandbox: ServedSandbox, limits: InsideLimits) -> Response:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        body = await read_body(request, limits.max_file_bytes + MULTIPART_OVERHEAD)
        if request.headers.get("content-encoding", "identity") != "identity":
            raise BadRequest("a multipart upload cannot be compressed; send it as it is")
        parts = parse_multipart(body, content_type)
        if "path" in request.query_params and len(parts) == 1:
            parts = [(request.query_params["path"], parts[0][1])]
    elif content_type.startswith("application/octet-stream"):
        body = await read_body(request, limits.max_file_bytes)
        encoding = request.headers.get("content-encoding", "identity")
        if encoding == "gzip":
            body = _gunzip(body, limits.max_file_bytes)
        elif encoding != "identity":
            raise BadRequest(f"unsupported Content-Encoding {encoding!r}; send gzip or nothing")
        parts = [(request.query_params.get("path", ""), body)]
    else:
        raise BadRequest("a file upload is multipart/form-data or application/octet-stream")
    if sum(len(data) for _, data in parts) > limits.max_file_bytes:
        raise TooLarge(f"the upload is over this server's file cap of {limits.max_file_bytes:,} bytes")
    targets = [(to_relative(path, sandbox.home), data) for path, data in parts]
    written = []
    for relative, data in targets:
        if relative == "":
            raise BadRequest("cannot write to the home directory itself; name a file in it")
        try:
            await sandbox.executor.upload(relative, data)
        except SandboxFileError as exc:
            raise BadRequest(f"cannot write {to_sandbox(relative, sandbox.home)!r}: {exc}") from None
        written.append(
            {"name": posixpath.basename(relative), "type": "file", "path": to_sandbox(relative, sandbox.home)}
        )
    return Response(json.dumps(written), media_type="application/json")


def _gunzip(body: bytes, cap: int) -> bytes:
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
    try:
        data = inflater.decompress(body, cap + 1)
    except zlib.error as exc:
        raise BadRequest(f"the gzip body is not valid: {exc}") from None
    if len(data) > cap or inflater.unconsumed_tail:
        raise TooLarge(f"the decompressed upload is over this server's file cap of {cap:,} bytes")
    if not inflater.eof:
        raise BadRequest("the gzip body is truncated")
    return data


_BOUNDARY = re.compile(r'boundary="?([0-9A-Za-z\'()+_,\-./:=?]{1,70})"?')


def parse_multipart(body: bytes, content_type: str) -> list[tuple[str, bytes]]:
    """The ``file`` parts of a multipart/form-data body, as (filename, data); anything malformed is a
    `BadRequest` (the body is already bounded)."""
    match = _BOUNDARY.search(content_type)
    if not match:
        raise BadRequest("the multipart body has no valid boundary")
    delimiter = b"--" + match[1].encode()
    pieces = body.split(b"\r\n" + delimiter)
    first = pieces[0]
    if not first.startswith(delimiter):
        raise BadRequest("the multipart body does not start with its boundary")
    pieces[0] = first[len(delimiter) :]
    files: list[tuple[str, bytes]] = []
    for index, piece in enumerate(pieces):
        if piece.startswith(b"--"):
            break
        if index == len(pieces) - 1 or not piece.startswith(b"\r\n"):
            raise BadRequest("the multipart body is malformed (a part is not closed by its boundary)")
        head, separator, data = piece[2:].partition(b"\r\n\r\n")
        if not separator or len(head) > 8192:
            raise BadRequest("a multipart part has no headers or too long ones")
        disposition = next(
            (
                line
                for line in head.decode("utf-8", "replace").split("\r\n")
                if line.lower().startswith("content-disposition:")
            ),
            "",
        )
        name = re.search(r'\bname="([^"]*)"', disposition)
        filename = re.search(r'\bfilename="([^"]*)"', disposition)
        if name and name[1] == "file" and filename:
            files.append((filename[1], data))
            if len(files) > MAX_PARTS:
                raise BadRequest(f"a multipart upload carries at most {MAX_PARTS} files")
    else:
        raise BadRequest("the multipart body has no closing boundary")
    if not files:
        raise BadRequest("the multipart body has no file part")
    return files


__all__ = ["RpcError", "error", "parse_multipart", "read", "write"]
