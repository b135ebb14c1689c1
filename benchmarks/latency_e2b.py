"""E2B backend latency on the loopback stand-in, against the stand-in's bare round trip in the same run.

    python -m benchmarks.latency_e2b [--n 200] [--json]

What is measured (medians and p95, in milliseconds):
- warm run: `E2BExecutor.run("x = 1")` in an open session: the static policy check, one ``SendInput``
  RPC carrying the request, the runner's work, and the reply line re-assembled from the command's
  output stream, all through the unmodified `e2b` SDK.
- bare round trip: the same request to the same runner in another stand-in sandbox, sent by a minimal
  raw HTTP/1.1 client (one keep-alive socket for ``SendInput``, one reading the ``Start`` stream's
  Connect frames), with no SDK and no executor: what the protocol and the stand-in cost by themselves.
- client overhead: warm run p50 minus bare round trip p50, i.e. what our backend and the SDK add.
  Target: under 5 ms. Nothing here asserts it.
- open: `open()` of a new executor (create, upload the runtime, check RestrictedPython, start the
  runner, init): the stand-in's sandboxes start instantly, so this is the client-side cost only.

The stand-in runs on its own event loop thread in this process, like a server on the same machine.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .common import fmt_ms, make_console, print_table, summarize, time_async, to_json, write_result

OVERHEAD_TARGET_MS = 5.0
CODE = "x = 1"


def _standin_class() -> Any:
    try:
        from support.e2b_standin import StandIn  # type: ignore[import-not-found]  # lives in tests/support/
    except ImportError:  # the stand-in lives with the tests
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from support.e2b_standin import StandIn
    return StandIn


class _RawConnection:
    """One HTTP/1.1 keep-alive connection, written by hand: the floor any client could reach."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    @classmethod
    async def open(cls, url: str) -> _RawConnection:
        host, port = url.removeprefix("http://").split(":")
        return cls(await anyio.connect_tcp(host, int(port)))

    async def send_request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        await self.stream.send(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    async def _fill(self) -> None:
        chunk = await self.stream.receive()
        self.buffer += chunk

    async def read_until(self, marker: bytes) -> bytes:
        while (end := self.buffer.find(marker)) < 0:
            await self._fill()
        data = bytes(self.buffer[: end + len(marker)])
        del self.buffer[: end + len(marker)]
        return data

    async def read_exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            await self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def read_head(self) -> tuple[int, dict[str, str]]:
        head = (await self.read_until(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {}
        for line in head[1:]:
            if ":" in line:
                key, value = line.split(":", 1)
                headers[key.strip().lower()] = value.strip()
        return int(head[0].split()[1]), headers

    async def read_chunk(self) -> bytes:
        size = int((await self.read_until(b"\r\n"))[:-2].split(b";")[0], 16)
        data = await self.read_exactly(size)
        await self.read_exactly(2)
        return data

    async def read_body(self, headers: dict[str, str]) -> bytes:
        if "content-length" in headers:
            return await self.read_exactly(int(headers["content-length"]))
        if headers.get("transfer-encoding") == "chunked":
            parts = []
            while chunk := await self.read_chunk():
                parts.append(chunk)
            await self.read_exactly(2)
            return b"".join(parts)
        return b""

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        await self.send_request(method, path, headers, body)
        status, response_headers = await self.read_head()
        data = await self.read_body(response_headers)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data[:200]!r}")
        return data


class _BareRunner:
    """A runner in a stand-in sandbox, driven over raw HTTP: Start stream in, SendInput out."""

    def __init__(self, standin: Any) -> None:
        self.standin = standin
        self.frames = bytearray()
        self.output = bytearray()

    async def start(self, command: str, init: Mapping[str, Any], files: list[tuple[str, bytes]]) -> None:
        api = await _RawConnection.open(self.standin.api_url)
        body = json.dumps({"templateID": "base", "timeout": 600}).encode()
        created = json.loads(
            await api.request("POST", "/v2/sandboxes", {"X-API-KEY": self.standin.api_key}, body)
        )
        self.api, self.sandbox_id = api, created["sandboxID"]
        self.headers = {"E2b-Sandbox-Id": created["sandboxID"], "X-Access-Token": created["envdAccessToken"]}
        self.control = await _RawConnection.open(self.standin.sandbox_url)
        for path, data in files:
            octet = {**self.headers, "Content-Type": "application/octet-stream"}
            await self.control.request("POST", f"/files?path={path}", octet, data)
        start = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}, "stdin": True}
        payload = json.dumps(start).encode()
        self.stream = await _RawConnection.open(self.standin.sandbox_url)
        stream_headers = {
            **self.headers,
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
        }
        await self.stream.send_request(
            "POST", "/process.Process/Start", stream_headers, struct.pack(">BI", 0, len(payload)) + payload
        )
        status, _ = await self.stream.read_head()
        if status != 200:
            raise RuntimeError(f"Start answered HTTP {status}")
        self.pid = (await self._next_event())["start"]["pid"]
        await self.round_trip(init)

    async def _next_event(self) -> dict[str, Any]:
        while True:
            if len(self.frames) >= 5:
                flags, size = struct.unpack_from(">BI", self.frames)
                if len(self.frames) >= 5 + size:
                    message = json.loads(bytes(self.frames[5 : 5 + size]))
                    del self.frames[: 5 + size]
                    if flags & 0x02:
                        raise RuntimeError(f"the runner's stream ended: {message}")
                    return dict(message["event"])
            self.frames += await self.stream.read_chunk()

    async def round_trip(self, message: Mapping[str, Any]) -> dict[str, Any]:
        line = json.dumps(message).encode() + b"\n"
        body = json.dumps({"process": {"pid": self.pid}, "input": {"stdin": base64.b64encode(line).decode()}})
        unary = {**self.headers, "Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        await self.control.request("POST", "/process.Process/SendInput", unary, body.encode())
        while (newline := self.output.find(b"\n")) < 0:
            event = await self._next_event()
            if "data" in event and "stdout" in event["data"]:
                self.output += base64.b64decode(event["data"]["stdout"])
        reply = json.loads(bytes(self.output[:newline]))
        del self.output[: newline + 1]
        return dict(reply)

    async def close(self) -> None:
        await self.api.request("DELETE", f"/sandboxes/{self.sandbox_id}", {"X-API-KEY": self.standin.api_key})
        for connection in (self.api, self.control, self.stream):
            await connection.stream.aclose()


async def _measure(standin: Any, n: int, open_n: int) -> dict[str, list[float]]:
    from sandboxes.backends.e2b.executor import REMOTE_RUNTIME, E2BExecutor, _runtime_files

    options = {"api_key": standin.api_key, "api_url": standin.api_url, "sandbox_url": standin.sandbox_url}
    samples: dict[str, list[float]] = {}
    async with E2BExecutor(timeout=30, **options) as ex:
        for _ in range(20):
            await ex.run(CODE)
        samples["warm run"] = await time_async(lambda: ex.run(CODE), n)

        bare = _BareRunner(standin)
        files = [(f"{REMOTE_RUNTIME}/{name}", data) for name, data in await _runtime_files()]
        await bare.start(ex._runner_command(), ex._runner_init(), files)
        request = {"op": "run", "code": CODE}
        for _ in range(20):
            await bare.round_trip(request)
        samples["bare round trip"] = await time_async(lambda: bare.round_trip(request), n)
        await bare.close()

    durations = []
    for _ in range(open_n):
        session = E2BExecutor(timeout=30, **options)
        started = time.perf_counter()
        await session.open()
        durations.append(time.perf_counter() - started)
        await session.close()
    samples["open"] = durations
    return samples


def e2b_latency_rows(n: int = 200, *, open_n: int | None = None) -> list[dict[str, Any]]:
    """Rows for the latency report: warm run, bare round trip, client overhead (target < 5 ms), open."""
    from sandboxes.backends.e2b import E2BExecutor

    from .streaming import measure, stream_rows

    with _standin_class()() as standin:
        samples = anyio.run(_measure, standin, n, open_n if open_n is not None else min(n, 10))
        options = {"api_key": standin.api_key, "api_url": standin.api_url, "sandbox_url": standin.sandbox_url}

        def make(**more: Any) -> E2BExecutor:
            return E2BExecutor(**options, **more)

        streamed = stream_rows("e2b latency (stand-in)", anyio.run(measure, make, n))
    warm, bare = summarize(samples["warm run"]), summarize(samples["bare round trip"])
    overhead = warm["p50_ms"] - bare["p50_ms"]
    rows: list[dict[str, Any]] = [
        {"benchmark": "e2b latency (stand-in)", "name": "warm run", **warm, "baseline": "bare round trip"},
        {"benchmark": "e2b latency (stand-in)", "name": "bare round trip", **bare},
        {
            "benchmark": "e2b latency (stand-in)",
            "name": "client overhead (p50 warm - p50 bare)",
            "n": warm["n"],
            "p50_ms": overhead,
            # A difference of two independent samples' p95 means nothing (it is often negative).
            "p95_ms": math.nan,
            "target_p50_ms": OVERHEAD_TARGET_MS,
            "meets_target": overhead <= OVERHEAD_TARGET_MS,
        },
        {"benchmark": "e2b latency (stand-in)", "name": "open", **summarize(samples["open"])},
        *streamed,
    ]
    return rows


def run(n: int = 200, open_n: int | None = None) -> dict[str, Any]:
    """JSON-ready result of the benchmark (what `kodeagent bench` calls)."""
    return {"benchmark": "latency_e2b", "rows": e2b_latency_rows(n, open_n=open_n)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.latency_e2b", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--n", type=int, default=200, help="samples of the warm measurements")
    parser.add_argument("--open-n", type=int, default=None, help="samples of open() (default min(n, 10))")
    parser.add_argument("--json", action="store_true", help="print the JSON result on stdout")
    parser.add_argument("--output", default=None, help="where to write the JSON result file")
    args = parser.parse_args(argv)
    console = make_console(args.json)
    result = run(args.n, args.open_n)
    path = write_result("latency_e2b", result, args.output)
    if args.json:
        print(to_json(result))
    rows = [
        [
            r["name"],
            r["n"],
            fmt_ms(r["p50_ms"]),
            fmt_ms(r["p95_ms"]),
            r.get("baseline", ""),
            (("yes" if r["meets_target"] else "NO") + f" (< {r['target_p50_ms']:g} ms)")
            if "meets_target" in r
            else "",
        ]
        for r in result["rows"]
    ]
    print_table(
        console,
        "E2B backend latency (loopback stand-in)",
        ["measurement", "n", "p50", "p95", "baseline", "target"],
        rows,
        note=f"result: {path}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
