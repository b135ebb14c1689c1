"""envd's files over real HTTP (a loopback uvicorn, real host sessions): `/files` reads and writes as
the e2b SDK sends them, the filesystem Connect service, and the attacks on them (traversal, symlinks
out of the home, /proc, oversized and malformed bodies, another sandbox's token), each checked by its
effect inside the session."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx
import pytest
from support.serve_inside import Inside, serve_inside

from sandboxes.adapters.serve.limits import InsideLimits

CAP = 4096


@pytest.fixture(scope="module")
def inside() -> Iterator[Inside]:
    with serve_inside(count=2, limits=InsideLimits(max_file_bytes=CAP, max_rpc_bytes=CAP)) as served:
        yield served


@pytest.fixture
def client(inside: Inside) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=inside.url, headers=inside.headers("sbx0"), timeout=30) as c:
        yield c


def rpc(client: httpx.Client, method: str, **message: object) -> httpx.Response:
    return client.post(f"/filesystem.Filesystem/{method}", json=message)


def exists_in_session(inside: Inside, path: str, sandbox: str = "sbx0") -> bool:
    return bool(inside.run(sandbox, f"import os; os.path.lexists({path!r})").value)


def test_octet_stream_write_then_read_round_trips_bytes(client: httpx.Client) -> None:
    data = bytes(range(256)) * 4
    written = client.post(
        "/files",
        params={"path": "/home/user/rt/data.bin"},
        content=data,
        headers={"content-type": "application/octet-stream"},
    )
    assert written.status_code == 200
    assert written.json() == [{"name": "data.bin", "type": "file", "path": "/home/user/rt/data.bin"}]
    read = client.get("/files", params={"path": "rt/data.bin"})
    assert read.status_code == 200 and read.content == data


def test_multipart_writes_every_file_part(client: httpx.Client, inside: Inside) -> None:
    files = [("file", ("/home/user/mp/one.txt", b"1")), ("file", ("mp/two.txt", b"22"))]
    response = client.post("/files", files=files)
    assert response.status_code == 200
    assert [f["path"] for f in response.json()] == ["/home/user/mp/one.txt", "/home/user/mp/two.txt"]
    assert inside.run("sbx0", "open('mp/two.txt').read()").value == "22"


def test_gzip_upload_is_decompressed(client: httpx.Client) -> None:
    response = client.post(
        "/files",
        params={"path": "gz.txt"},
        content=gzip.compress(b"zipped"),
        headers={"content-type": "application/octet-stream", "content-encoding": "gzip"},
    )
    assert response.status_code == 200
    assert client.get("/files", params={"path": "gz.txt"}).content == b"zipped"


def test_stat_list_mkdir_move_remove(client: httpx.Client, inside: Inside) -> None:
    assert rpc(client, "MakeDir", path="/home/user/ops/deep/er").status_code == 200
    again = rpc(client, "MakeDir", path="/home/user/ops/deep/er")
    assert again.status_code == 409 and again.json()["code"] == "already_exists"
    client.post(
        "/files",
        params={"path": "ops/f.txt"},
        content=b"abc",
        headers={"content-type": "application/octet-stream"},
    )
    stat = rpc(client, "Stat", path="/home/user/ops/f.txt").json()["entry"]
    assert stat["type"] == "FILE_TYPE_FILE" and stat["size"] == "3" and stat["path"] == "/home/user/ops/f.txt"
    shallow = [e["path"] for e in rpc(client, "ListDir", path="ops", depth=1).json()["entries"]]
    deep = [e["path"] for e in rpc(client, "ListDir", path="ops", depth=3).json()["entries"]]
    assert shallow == ["/home/user/ops/deep", "/home/user/ops/f.txt"]
    assert "/home/user/ops/deep/er" in deep and len(deep) == 3
    moved = rpc(client, "Move", source="ops/f.txt", destination="/home/user/ops/g.txt")
    assert moved.status_code == 200 and moved.json()["entry"]["name"] == "g.txt"
    assert not exists_in_session(inside, "ops/f.txt") and exists_in_session(inside, "ops/g.txt")
    assert rpc(client, "Remove", path="ops").status_code == 200
    assert not exists_in_session(inside, "ops")
    gone = rpc(client, "Stat", path="ops")
    assert gone.status_code == 404 and gone.json()["code"] == "not_found"


def test_reading_missing_file_or_directory_is_refused(client: httpx.Client) -> None:
    assert client.get("/files", params={"path": "no/such.txt"}).status_code == 404
    rpc(client, "MakeDir", path="adir")
    assert client.get("/files", params={"path": "adir"}).status_code == 400


def test_file_ops_leave_the_session_namespace_alone(client: httpx.Client, inside: Inside) -> None:
    inside.run("sbx0", "kept = 41")
    rpc(client, "ListDir", path="/home/user", depth=1)
    assert inside.run("sbx0", "kept + 1").value == 42
    assert inside.run("sbx0", "'main' in globals() or '__kodeagent_envd' in globals()").value is False


# ------------------------------------------------------------------ attacks


@pytest.mark.parametrize(
    "path",
    [
        "../escape.txt",
        "/home/user/../escape.txt",
        "/home/userx/e.txt",
        "/tmp/escape.txt",
        "/proc/self/environ",
        "/etc/passwd",
        "a/../../e.txt",
    ],
)
def test_paths_outside_home_are_refused_before_the_sandbox_is_asked(
    client: httpx.Client, inside: Inside, path: str
) -> None:
    write = client.post(
        "/files", params={"path": path}, content=b"x", headers={"content-type": "application/octet-stream"}
    )
    assert write.status_code == 400 and "outside /home/user" in write.json()["message"]
    assert client.get("/files", params={"path": path}).status_code == 400
    assert rpc(client, "Stat", path=path).status_code == 400
    assert not exists_in_session(inside, "../escape.txt") and not exists_in_session(inside, "/tmp/escape.txt")


def test_multipart_filename_cannot_traverse(client: httpx.Client, inside: Inside) -> None:
    response = client.post("/files", files=[("file", ("../../mp-escape.txt", b"x"))])
    assert response.status_code == 400
    assert not exists_in_session(inside, "../mp-escape.txt") and not exists_in_session(
        inside, "../../mp-escape.txt"
    )


def test_symlinks_out_of_home_are_refused(client: httpx.Client, inside: Inside) -> None:
    inside.run(
        "sbx0",
        "import os\n"
        "os.symlink('/etc', 'link') if not os.path.lexists('link') else None\n"
        "os.symlink('/etc/passwd', 'flink') if not os.path.lexists('flink') else None",
    )
    for path in ("link/passwd", "/home/user/flink"):
        read = client.get("/files", params={"path": path})
        assert read.status_code == 400 and b"root:" not in read.content
    listed = rpc(client, "ListDir", path="link", depth=1)
    assert listed.status_code == 400 and "symlink" in listed.json()["message"]
    assert rpc(client, "Stat", path="link/passwd").status_code == 400
    write = client.post(
        "/files",
        params={"path": "link/planted"},
        content=b"x",
        headers={"content-type": "application/octet-stream"},
    )
    assert write.status_code == 400
    assert rpc(client, "MakeDir", path="link/made").status_code == 400
    assert rpc(client, "Move", source="link/passwd", destination="stolen").status_code == 400
    assert rpc(client, "Remove", path="link/passwd").status_code == 400
    assert not exists_in_session(inside, "stolen") and not exists_in_session(inside, "/etc/planted")
    link = rpc(client, "Stat", path="link").json()["entry"]  # the link itself is the sandbox's, and shown
    assert link["symlinkTarget"] == "/etc" and link["type"] == "FILE_TYPE_DIRECTORY"


def test_declared_oversized_upload_is_refused_before_it_is_read(client: httpx.Client, inside: Inside) -> None:
    response = client.post(
        "/files",
        params={"path": "big.bin"},
        content=b"x" * (CAP + 1),
        headers={"content-type": "application/octet-stream"},
    )
    assert response.status_code == 413 and f"{CAP:,}" in response.json()["message"]
    assert not exists_in_session(inside, "big.bin")


def test_streamed_oversized_upload_is_cut_off(client: httpx.Client, inside: Inside) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(64):
            yield b"y" * 1024

    response = client.post(
        "/files",
        params={"path": "big2.bin"},
        content=chunks(),
        headers={"content-type": "application/octet-stream"},
    )
    assert response.status_code == 413
    assert not exists_in_session(inside, "big2.bin")


def test_huge_multipart_is_refused(client: httpx.Client, inside: Inside) -> None:
    response = client.post("/files", files=[("file", ("huge.bin", b"z" * (CAP + 70_000)))])
    assert response.status_code == 413
    assert not exists_in_session(inside, "huge.bin")


def test_gzip_bomb_is_refused(client: httpx.Client, inside: Inside) -> None:
    bomb = gzip.compress(b"\0" * (2 * 1024 * 1024))
    assert len(bomb) < CAP
    response = client.post(
        "/files",
        params={"path": "bomb"},
        content=bomb,
        headers={"content-type": "application/octet-stream", "content-encoding": "gzip"},
    )
    assert response.status_code == 413
    assert not exists_in_session(inside, "bomb")


def test_reading_a_file_over_the_cap_is_refused(client: httpx.Client, inside: Inside) -> None:
    inside.run("sbx0", f"open('grown.bin', 'wb').write(b'g' * {CAP * 3})")
    response = client.get("/files", params={"path": "grown.bin"})
    assert response.status_code == 413 and not response.content.startswith(b"ggg")


@pytest.mark.parametrize(
    "body",
    [
        b"--nope\r\n",
        b"no boundary at all",
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\nx',
    ],
)
def test_malformed_multipart_is_a_bad_request(client: httpx.Client, body: bytes) -> None:
    response = client.post(
        "/files", content=body, headers={"content-type": "multipart/form-data; boundary=B"}
    )
    assert response.status_code == 400


def test_malformed_connect_json_is_invalid_argument(client: httpx.Client) -> None:
    for body in (b"{not json", b"[1, 2]", b'"text"'):
        response = client.post(
            "/filesystem.Filesystem/Stat", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400 and response.json()["code"] == "invalid_argument"
    too_big = client.post(
        "/filesystem.Filesystem/Stat", content=b" " * (CAP + 1), headers={"content-type": "application/json"}
    )
    assert too_big.status_code == 429 and too_big.json()["code"] == "resource_exhausted"
    deep = rpc(client, "ListDir", path="/home/user", depth=10_000)
    assert deep.status_code == 400


def test_listing_over_the_cap_is_refused(inside: Inside) -> None:
    with serve_inside(count=1, limits=InsideLimits(max_list_entries=5)) as small:
        small.run("sbx0", "import os\nfor i in range(8): open(f'f{i}', 'w').close()")
        with httpx.Client(base_url=small.url, headers=small.headers("sbx0")) as c:
            response = rpc(c, "ListDir", path="/home/user", depth=1)
    assert response.status_code == 429 and "5" in response.json()["message"]


def test_another_sandboxs_token_reaches_nothing(inside: Inside) -> None:
    stolen = inside.headers("sbx0", token=inside.sandboxes["sbx1"].access_token)
    with httpx.Client(base_url=inside.url, headers=stolen) as c:
        write = c.post(
            "/files",
            params={"path": "planted.txt"},
            content=b"x",
            headers={"content-type": "application/octet-stream"},
        )
        assert write.status_code == 401
        assert c.post("/filesystem.Filesystem/Stat", json={"path": "/home/user"}).status_code == 401
        assert c.get("/health").status_code == 401
    assert not exists_in_session(inside, "planted.txt", "sbx0")
    assert not exists_in_session(inside, "planted.txt", "sbx1")


def test_sandboxes_do_not_share_a_home(inside: Inside) -> None:
    with httpx.Client(base_url=inside.url, headers=inside.headers("sbx1")) as c:
        c.post(
            "/files",
            params={"path": "mine.txt"},
            content=b"1",
            headers={"content-type": "application/octet-stream"},
        )
    with httpx.Client(base_url=inside.url, headers=inside.headers("sbx0")) as c:
        assert c.get("/files", params={"path": "mine.txt"}).status_code == 404
    assert json.loads(json.dumps(exists_in_session(inside, "mine.txt", "sbx1"))) is True
