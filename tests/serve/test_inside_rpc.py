"""The interpreter and envd's process service over raw HTTP (a loopback uvicorn, real host sessions):
NDJSON as e2b-code-interpreter parses it, and hostile requests (an envelope lying about its length,
malformed JSON, oversized bodies, another sandbox's token, a session that forges its helpers'
answers), each checked by its effect."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.serve_inside import Inside, serve_inside

from sandboxes.adapters.serve.limits import InsideLimits

CAP = 8192


@pytest.fixture(scope="module")
def inside() -> Iterator[Inside]:
    with serve_inside(count=2, limits=InsideLimits(max_rpc_bytes=CAP, max_code_bytes=CAP)) as served:
        yield served


def envelopes(body: bytes) -> list[tuple[int, dict[str, Any]]]:
    out, offset = [], 0
    while offset < len(body):
        flags, length = struct.unpack_from(">BI", body, offset)
        out.append((flags, json.loads(body[offset + 5 : offset + 5 + length])))
        offset += 5 + length
    return out


def start(inside: Inside, message: bytes, sandbox: str = "sbx0", token: str | None = None) -> list[Any]:
    headers = {**inside.headers(sandbox, token=token), "content-type": "application/connect+json"}
    response = httpx.post(f"{inside.url}/process.Process/Start", content=message, headers=headers, timeout=30)
    assert response.status_code in (200, 401)
    return envelopes(response.content) if response.status_code == 200 else [response.status_code]


def frame(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


def touch(path: str) -> dict[str, Any]:
    return {"process": {"cmd": "/bin/sh", "args": ["-c", f"touch {path}"]}}


def lexists(inside: Inside, path: str, sandbox: str = "sbx0") -> bool:
    return bool(inside.run(sandbox, f"import os; os.path.lexists({path!r})").value)


def execute(inside: Inside, body: Any, sandbox: str = "sbx0", **kwargs: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**inside.headers(sandbox, 49999), "content-type": "application/json", **kwargs}
    return httpx.post(f"{inside.url}/execute", content=content, headers=headers, timeout=30)


def test_start_streams_start_data_end(inside: Inside) -> None:
    events = start(inside, frame({"process": {"cmd": "/bin/sh", "args": ["-c", "echo a; exit 4"]}}))
    assert events[0][1]["event"]["start"]["pid"] > 0
    assert events[1][1] == {"event": {"data": {"stdout": "YQo="}}}
    assert events[-2][1]["event"]["end"]["exitCode"] == 4
    assert events[-1] == (2, {})


def test_an_envelope_claiming_a_huge_length_runs_nothing(inside: Inside) -> None:
    payload = json.dumps(touch("claimed")).encode()
    lying = struct.pack(">BI", 0, 0xFFFFFFFF) + payload
    ((flags, end),) = start(inside, lying)
    assert flags == 2 and end["error"]["code"] == "invalid_argument"
    trailing = frame(touch("trailing")) + b"extra"
    assert start(inside, trailing)[0][1]["error"]["code"] == "invalid_argument"
    compressed = struct.pack(">BI", 1, len(payload)) + payload
    assert start(inside, compressed)[0][1]["error"]["code"] == "unimplemented"
    assert start(inside, b"\x00\x00")[0][1]["error"]["code"] == "invalid_argument"
    assert start(inside, frame(touch("x" * CAP)))[0][1]["error"]["code"] == "resource_exhausted"
    assert not any(lexists(inside, p) for p in ("claimed", "trailing"))


def test_malformed_process_messages_are_invalid_argument(inside: Inside) -> None:
    for message in (
        b"\x00\x00\x00\x00\x03{x}",
        frame({"process": {"cmd": 7}}),
        frame({"process": {"args": "no"}}),
    ):
        assert start(inside, message)[0][1]["error"]["code"] == "invalid_argument"


def test_another_sandboxs_token_starts_nothing(inside: Inside) -> None:
    ((flags, end),) = start(inside, frame(touch("stolen")), token=inside.sandboxes["sbx1"].access_token)
    assert flags == 2 and end["error"]["code"] == "unauthenticated"
    assert not lexists(inside, "stolen") and not lexists(inside, "stolen", "sbx1")


def test_execute_ndjson_lines(inside: Inside) -> None:
    response = execute(inside, {"code": "print('a')\n6 * 7"})
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [m["type"] for m in lines] == ["stdout", "number_of_executions", "result", "end_of_execution"]
    assert lines[0]["text"] == "a\n" and isinstance(lines[0]["timestamp"], int)
    assert lines[2] == {"type": "result", "text": "42", "is_main_result": True}


def test_execute_refuses_what_the_sdk_never_sends(inside: Inside) -> None:
    assert execute(inside, b"{not json").status_code == 400
    assert execute(inside, {"code": 7}).status_code == 400
    assert execute(inside, {"code": "1", "env_vars": {"A": 1}}).status_code == 400
    assert execute(inside, {"code": "1", "context_id": "nope"}).status_code == 404
    assert execute(inside, {"code": "1", "language": "r"}).status_code == 400
    big = execute(inside, {"code": "x = 1\n" * CAP})
    assert big.status_code == 413


def test_execute_with_another_sandboxs_token_runs_nothing(inside: Inside) -> None:
    headers = {"X-Access-Token": inside.sandboxes["sbx1"].access_token}
    response = execute(inside, {"code": "open('stolen-cell', 'w').close()"}, **headers)
    assert response.status_code == 401
    assert not lexists(inside, "stolen-cell") and not lexists(inside, "stolen-cell", "sbx1")


def test_contexts_are_capped(inside: Inside) -> None:
    headers = inside.headers("sbx1", 49999)
    statuses = [httpx.post(f"{inside.url}/contexts", json={}, headers=headers).status_code for _ in range(33)]
    assert statuses.count(200) == 31 and statuses[-1] == 429  # 32 with the default one
    listed = httpx.get(f"{inside.url}/contexts", headers=headers).json()
    for context in listed[1:]:
        assert httpx.delete(f"{inside.url}/contexts/{context['id']}", headers=headers).status_code == 204
    assert httpx.delete(f"{inside.url}/contexts/default", headers=headers).status_code == 400


def test_a_session_forging_its_helpers_answers_gets_errors_not_a_crash(inside: Inside) -> None:
    with serve_inside(count=1) as own:
        headers = own.headers("sbx0")
        own.run("sbx0", "import stat\nopen('f', 'w').close()\nstat.filemode = lambda mode: 'x' * 5000")
        listed = httpx.post(
            f"{own.url}/filesystem.Filesystem/ListDir", json={"path": "/home/user"}, headers=headers
        )
        assert listed.status_code == 500 and listed.json()["code"] == "internal"  # a field past its bound
        own.run("sbx0", "import builtins\nbuiltins.exec = lambda *a, **k: None")  # the helper never runs
        stat = httpx.post(
            f"{own.url}/filesystem.Filesystem/Stat", json={"path": "/home/user"}, headers=headers
        )
        assert stat.status_code >= 500 and stat.json()["code"] in ("unavailable", "internal")
        cell = httpx.post(f"{own.url}/execute", json={"code": "1"}, headers=own.headers("sbx0", 49999))
        assert cell.status_code == 200 and '"type":"error"' in cell.text
    files = httpx.post(
        f"{inside.url}/filesystem.Filesystem/Stat",
        json={"path": "/home/user"},
        headers=inside.headers("sbx0"),
    )
    assert files.status_code == 200  # other sandboxes are served as before
