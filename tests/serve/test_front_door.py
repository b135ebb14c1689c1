"""Attacks on `kodeagent serve`'s front door, over real HTTP to a real server: another tenant's ids and
tokens, a token after its sandbox was killed, repeated and forged headers, floods of creates, huge
bodies, foreign Hosts and Origins. Each test checks that the attack's *effect* did not happen: the
in-sandbox app never saw the request (a recording app stands in for envd), the sandbox is still
there and unchanged, nothing was created."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from support.raw_http import RawConnection
from support.served import Served

from sandboxes.adapters.serve import ENVD_PORT, INTERPRETER_PORT
from sandboxes.adapters.web import DISCARD_BYTES


class Recorder:
    """An in-sandbox app that records what reached it (after the front door let it through) and
    answers 200; `hold` makes it wait until released (to keep requests in flight)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.hold = False
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.seen.append({"path": scope["path"], "sandbox": headers.get("e2b-sandbox-id")})
        while self.hold and not self.release.is_set():
            await anyio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"reached"})


@pytest.fixture
def recorder(served: Served) -> Recorder:
    rec = Recorder()
    served.app.ports[ENVD_PORT] = rec
    return rec


@pytest.fixture
def client(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=30) as c:
        yield c


def create(client: httpx.Client, key: str, **body: Any) -> dict[str, Any]:
    answer = client.post("/v2/sandboxes", json={"templateID": "base", **body}, headers={"X-API-KEY": key})
    assert answer.status_code == 201, answer.text
    result: dict[str, Any] = answer.json()
    return result


def envd(sandbox_id: str, token: str | None, **extra: str) -> dict[str, str]:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT), **extra}
    if token is not None:
        headers["X-Access-Token"] = token
    return headers


# ---------------------------------------------------------------------- tenants


def test_another_tenants_id_is_not_found_and_untouched_on_the_control_plane(
    served: Served, client: httpx.Client
) -> None:
    mine = create(client, served.keys["alice"], timeout=120)
    before = client.get(f"/sandboxes/{mine['sandboxID']}", headers={"X-API-KEY": served.keys["alice"]}).json()
    bob = {"X-API-KEY": served.keys["bob"]}
    sid = mine["sandboxID"]
    answers = [
        client.get(f"/sandboxes/{sid}", headers=bob),
        client.delete(f"/sandboxes/{sid}", headers=bob),
        client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 1}, headers=bob),
        client.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 3000}, headers=bob),
    ]
    assert [a.status_code for a in answers] == [404, 404, 404, 404]
    assert all("doesn't exist or you don't have access" in a.json()["message"] for a in answers)
    assert all(mine["envdAccessToken"] not in a.text for a in answers)
    assert client.get("/v2/sandboxes", headers=bob).json() == []
    after = client.get(f"/sandboxes/{sid}", headers={"X-API-KEY": served.keys["alice"]})
    assert after.status_code == 200
    assert after.json()["endAt"] == before["endAt"]  # neither shortened (timeout 1) nor extended (connect)


def test_another_tenants_id_with_its_own_token_never_reaches_the_sandbox(
    served: Served, client: httpx.Client, recorder: Recorder
) -> None:
    alice = create(client, served.keys["alice"])
    bob = create(client, served.keys["bob"])
    answer = client.get(
        "/files", params={"path": "secret"}, headers=envd(alice["sandboxID"], bob["envdAccessToken"])
    )
    assert answer.status_code == 502
    assert "was not found" in answer.json()["message"]
    assert recorder.seen == []
    ok = client.get("/files", headers=envd(alice["sandboxID"], alice["envdAccessToken"]))
    assert ok.status_code == 200 and recorder.seen == [{"path": "/files", "sandbox": alice["sandboxID"]}]


def test_wrong_missing_and_unknown_are_one_answer(
    served: Served, client: httpx.Client, recorder: Recorder
) -> None:
    mine = create(client, served.keys["alice"])
    wrong = client.get("/files", headers=envd(mine["sandboxID"], mine["envdAccessToken"][:-1] + "x"))
    missing = client.get("/files", headers=envd(mine["sandboxID"], None))
    unknown = client.get("/files", headers=envd("0" * 20, mine["envdAccessToken"]))
    api_key_instead = client.get("/files", headers=envd(mine["sandboxID"], None, **{"X-API-KEY": served.key}))
    for answer in (wrong, missing, unknown, api_key_instead):
        assert answer.status_code == 502
        assert answer.json()["message"].startswith("The sandbox was not found")
    assert recorder.seen == []


def test_a_token_is_dead_once_its_sandbox_is_killed(
    served: Served, client: httpx.Client, recorder: Recorder
) -> None:
    old = create(client, served.keys["alice"])
    assert (
        client.delete(f"/sandboxes/{old['sandboxID']}", headers={"X-API-KEY": served.key}).status_code == 204
    )
    new = create(client, served.keys["alice"])
    for sandbox_id in (old["sandboxID"], new["sandboxID"]):
        answer = client.get("/files", headers=envd(sandbox_id, old["envdAccessToken"]))
        assert answer.status_code == 502
    assert recorder.seen == []
    assert (
        client.delete(f"/sandboxes/{old['sandboxID']}", headers={"X-API-KEY": served.key}).status_code == 404
    )


def test_the_interpreter_contexts_take_the_id_alone_but_execute_needs_the_token(
    served: Served, client: httpx.Client
) -> None:
    rec = Recorder()
    served.app.ports[INTERPRETER_PORT] = rec
    mine = create(client, served.keys["alice"])
    port = {"E2b-Sandbox-Id": mine["sandboxID"], "E2b-Sandbox-Port": str(INTERPRETER_PORT)}
    assert client.post("/contexts", json={}, headers=port).status_code == 200
    assert client.post("/execute", json={"code": "1"}, headers=port).status_code == 502
    assert client.post("/contexts", json={}, headers={**port, "E2b-Sandbox-Id": "1" * 20}).status_code == 502
    assert [s["path"] for s in rec.seen] == ["/contexts"]


def test_a_port_that_is_not_served_is_refused(
    served: Served, client: httpx.Client, recorder: Recorder
) -> None:
    mine = create(client, served.keys["alice"])
    for port in ("22", "8080", "-1", "+49983", "049983", "99999999999"):
        headers = {**envd(mine["sandboxID"], mine["envdAccessToken"]), "E2b-Sandbox-Port": port}
        answer = client.get("/files", headers=headers)
        assert answer.status_code == 502, port
        assert "port" in answer.json()["message"]
    assert recorder.seen == []


# ---------------------------------------------------------------------- forged and repeated headers


def test_two_sandbox_id_headers_are_refused(served: Served, client: httpx.Client, recorder: Recorder) -> None:
    alice = create(client, served.keys["alice"])
    bob = create(client, served.keys["bob"])
    for order in ((alice, bob), (bob, alice)):
        headers = [
            ("E2b-Sandbox-Id", order[0]["sandboxID"]),
            ("E2b-Sandbox-Id", order[1]["sandboxID"]),
            ("E2b-Sandbox-Port", str(ENVD_PORT)),
            ("X-Access-Token", bob["envdAccessToken"]),
        ]
        answer = client.get("/files", headers=headers)
        assert answer.status_code == 400
        assert "e2b-sandbox-id" in answer.json()["message"]
    assert recorder.seen == []


@pytest.mark.parametrize("name", ["X-Access-Token", "E2b-Sandbox-Port"])
def test_other_deciding_headers_repeated_are_refused(
    served: Served, client: httpx.Client, recorder: Recorder, name: str
) -> None:
    mine = create(client, served.keys["alice"])
    headers = list(envd(mine["sandboxID"], mine["envdAccessToken"]).items())
    value = dict(headers)[name]
    headers += [(name, value)]
    answer = client.get("/files", headers=headers)
    assert answer.status_code == 400
    assert recorder.seen == []


@pytest.mark.parametrize(
    "repeated", ["Host: 127.0.0.1\r\nHost: evil.example", "Content-Length: 0\r\nContent-Length: 2"]
)
def test_repeated_host_or_length_never_reaches_the_sandbox(
    served: Served, client: httpx.Client, recorder: Recorder, repeated: str
) -> None:
    mine = create(client, served.keys["alice"])
    lines = [f"{k}: {v}" for k, v in envd(mine["sandboxID"], mine["envdAccessToken"]).items()]
    head = "GET /files HTTP/1.1\r\n" + "\r\n".join([*lines, repeated]) + "\r\n\r\n{}"
    answer = _raw(served, head.encode())
    assert answer.startswith(b"HTTP/1.1 400")
    assert recorder.seen == []


def test_two_api_keys_are_refused_even_when_one_is_right(served: Served, client: httpx.Client) -> None:
    for keys in ((served.keys["bob"], served.keys["alice"]), ("e2b_" + "0" * 40, served.keys["alice"])):
        headers = [("X-API-KEY", keys[0]), ("X-API-KEY", keys[1])]
        answer = client.post("/v2/sandboxes", json={"templateID": "base"}, headers=headers)
        assert answer.status_code == 400
    for tenant in ("alice", "bob"):
        assert client.get("/v2/sandboxes", headers={"X-API-KEY": served.keys[tenant]}).json() == []


def test_no_or_a_wrong_api_key_is_401_and_creates_nothing(served: Served, client: httpx.Client) -> None:
    body = {"templateID": "base"}
    assert client.post("/v2/sandboxes", json=body).status_code == 401
    assert (
        client.post("/v2/sandboxes", json=body, headers={"X-API-KEY": "e2b_" + "0" * 40}).status_code == 401
    )
    near = served.key[:-1] + ("0" if served.key[-1] != "0" else "1")
    assert client.post("/v2/sandboxes", json=body, headers={"X-API-KEY": near}).status_code == 401
    bearer = client.post("/v2/sandboxes", json=body, headers={"Authorization": f"Bearer {served.key}"})
    assert bearer.status_code == 401
    assert served.app.registry.count() == 0


def test_foreign_host_and_origin_are_refused(served: Served, client: httpx.Client) -> None:
    key = {"X-API-KEY": served.key}
    body = {"templateID": "base"}
    assert client.post("/v2/sandboxes", json=body, headers={**key, "Host": "evil.example"}).status_code == 421
    evil = {**key, "Origin": "https://evil.example"}
    assert client.post("/v2/sandboxes", json=body, headers=evil).status_code == 403
    assert served.app.registry.count() == 0
    local = {**key, "Origin": "http://localhost:3000", "Host": "localhost"}
    assert client.get("/v2/sandboxes", headers=local).status_code == 200


# ---------------------------------------------------------------------- floods and sizes


def test_a_flood_of_creates_gets_429_past_the_cap_and_leaves_other_tenants_their_share(
    serve_with: Any,
) -> None:
    served = serve_with(max_sandboxes_per_key=3, max_sandboxes=5)
    results: list[int] = []

    async def flood() -> None:
        async with httpx.AsyncClient(base_url=served.url, timeout=60) as c:

            async def one() -> None:
                r = await c.post(
                    "/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": served.key}
                )
                results.append(r.status_code)

            async with anyio.create_task_group() as group:
                for _ in range(20):
                    group.start_soon(one)

    anyio.run(flood)
    assert sorted(results) == [201] * 3 + [429] * 17
    assert served.app.registry.count("alice") == 3
    with httpx.Client(base_url=served.url, timeout=60) as c:
        bob = {"X-API-KEY": served.keys["bob"]}
        assert [
            c.post("/v2/sandboxes", json={"templateID": "base"}, headers=bob).status_code for _ in range(3)
        ] == [
            201,
            201,
            429,  # the server's own cap (5) now
        ]


def test_requests_in_flight_past_the_cap_get_429(serve_with: Any) -> None:
    served = serve_with(max_requests_per_key=2)
    rec = Recorder()
    rec.hold = True
    served.app.ports[ENVD_PORT] = rec
    with httpx.Client(base_url=served.url, timeout=30) as c:
        mine = create(c, served.key)
        headers = envd(mine["sandboxID"], mine["envdAccessToken"])
        answers: list[int] = []
        threads = [
            threading.Thread(target=lambda: answers.append(c.get("/files", headers=headers).status_code))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        while len(rec.seen) < 2:
            anyio.run(anyio.sleep, 0.01)
        third = c.get("/files", headers=headers)
        control = c.get("/v2/sandboxes", headers={"X-API-KEY": served.key})
        bob = c.get("/v2/sandboxes", headers={"X-API-KEY": served.keys["bob"]})
        rec.release.set()
        for t in threads:
            t.join()
    assert third.status_code == 429 and control.status_code == 429
    assert bob.status_code == 200  # another tenant's share is its own
    assert sorted(answers) == [200, 200] and len(rec.seen) == 2


def _raw(served: Served, request: bytes) -> bytes:
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        return s.recv(65536)


def test_a_declared_huge_body_is_refused_before_it_is_sent(served: Served) -> None:
    head = (
        "POST /v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-API-KEY: {served.key}\r\nContent-Length: 1000000000\r\n\r\n"
    ).encode()
    answer = _raw(served, head)  # not one byte of the body sent: the answer comes anyway
    assert answer.startswith(b"HTTP/1.1 413")
    assert served.app.registry.count() == 0


def test_a_streamed_body_over_the_cap_is_cut_off(serve_with: Any) -> None:
    served = serve_with(max_control_bytes=4096, max_request_bytes=8192)
    rec = Recorder()
    served.app.ports[ENVD_PORT] = rec

    def chunks(total: int) -> Iterator[bytes]:
        yield b'{"templateID": "base", "metadata": {"a": "'
        for _ in range(total // 1024):
            yield b"x" * 1024
        yield b'"}}'

    with httpx.Client(base_url=served.url, timeout=30) as c:
        answer = c.post("/v2/sandboxes", content=chunks(64 * 1024), headers={"X-API-KEY": served.key})
        assert answer.status_code == 413
        assert served.app.registry.count() == 0
        small = c.post("/v2/sandboxes", content=chunks(1024), headers={"X-API-KEY": served.key})
        assert small.status_code == 201


@pytest.mark.parametrize("refusal", ["over the cap", "a wrong key"])
def test_a_refusal_waits_for_the_body_it_refuses_and_the_connection_goes_on(
    serve_with: Any, refusal: str
) -> None:
    """The head of a refused request sent alone: no answer until its body is in (a client still
    writing is not answered mid-write, which the E2B SDK's client can fail on), and then the same
    connection serves the next request."""
    served = serve_with(max_control_bytes=4096)
    body = b"x" * (8192 if refusal == "over the cap" else 2048)
    key = served.key if refusal == "over the cap" else "e2b_" + "f" * 40
    head = {"X-API-KEY": key, "Content-Type": "application/json", "Content-Length": str(len(body))}
    with RawConnection(served.url) as conn:
        conn.send_head("POST", "/v2/sandboxes", head)
        assert conn.nothing_within(0.5)
        conn.send(body)
        status, _ = conn.answer()
        assert status == (413 if refusal == "over the cap" else 401)
        conn.send_head("GET", "/v2/sandboxes", {"X-API-KEY": served.key})
        assert conn.answer() == (200, b"[]")
    assert served.app.registry.count() == 0


def test_a_client_waiting_for_100_continue_is_refused_without_sending_its_body(serve_with: Any) -> None:
    served = serve_with(max_control_bytes=4096)
    head = {"X-API-KEY": served.key, "Content-Length": "8192", "Expect": "100-continue"}
    with RawConnection(served.url) as conn:
        conn.send_head("POST", "/v2/sandboxes", head)
        status, _ = conn.answer()  # not 100 Continue: the server does not ask for what it refuses
    assert status == 413


def test_a_body_that_stops_coming_is_waited_for_only_so_long(serve_with: Any) -> None:
    served = serve_with(max_control_bytes=4096)
    head = {"X-API-KEY": served.key, "Content-Length": "1000000"}
    with RawConnection(served.url) as conn:
        conn.send_head("POST", "/v2/sandboxes", head)
        conn.send(b"x" * 5000)  # past the cap, then nothing more
        status, _ = conn.answer()  # before the socket's own 30 s timeout
    assert status == 413


def test_an_endless_body_is_read_only_so_far(serve_with: Any) -> None:
    """A chunked body that never ends: the refusal comes after at most `DISCARD_BYTES` were read and
    dropped, and the server then ends the connection (it does not go on taking the body at line
    speed)."""
    served = serve_with(max_control_bytes=4096)
    sent = 0
    chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
    with RawConnection(served.url) as conn:
        conn.send_head("POST", "/v2/sandboxes", {"X-API-KEY": served.key, "Transfer-Encoding": "chunked"})

        def flood() -> None:
            nonlocal sent
            try:
                while True:
                    conn.send(chunk)
                    sent += len(chunk)
            except OSError:  # the server ended the connection
                pass

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        status, _ = conn.answer()
        assert status == 413
        sender.join(10)
        assert not sender.is_alive()
    buffers = 32 * 1024 * 1024  # what the kernel's and the server's buffers can take beyond what was read
    assert sent <= DISCARD_BYTES + 4096 + buffers


def test_control_plane_bodies_that_are_not_what_the_sdk_sends_get_400(
    served: Served, client: httpx.Client
) -> None:
    key = {"X-API-KEY": served.key, "Content-Type": "application/json"}
    bodies: list[bytes] = [
        b"not json",
        b"[1, 2]",
        b'{"templateID": 5}',
        b'{"templateID": "../../etc"}',
        b'{"templateID": "base", "timeout": -1}',
        b'{"templateID": "base", "timeout": "9"}',
        b'{"templateID": "base", "timeout": 99999999}',
        b'{"templateID": "base", "envVars": {"A B": "x"}}',
        b'{"templateID": "base", "envVars": {"A": 1}}',
        b'{"templateID": "base", "mcp": {"x": {}}}',
        b'{"templateID": "base", "autoPause": "yes"}',
        b'{"templateID": "base", "autoResume": {"enabled": false}}',
        b'{"templateID": "base", "network": {"allowOut": ["1.1.1.1"]}}',
        b'{"templateID": "base", "network": {"dnsServers": ["1.1.1.1"]}}',
        b'{"templateID": "base", "allow_internet_access": true}',  # this server has internet off
        b"[" * 100_000,
    ]
    for body in bodies:
        answer = client.post("/v2/sandboxes", content=body, headers=key)
        assert answer.status_code == 400, (body[:60], answer.text)
        assert answer.json()["code"] == 400 and answer.json()["message"]
    assert served.app.registry.count() == 0
