"""A hostile stand-in for the sandbox runner, for the wire fuzzer (tests/test_wire_fuzz.py).

Started as ``python3 -I -S scripted_runner.py SCRIPT.json`` with its stdin and stdout on the parent's
socket, as the real runner is. It answers each thing the parent sends (a request line, a tool's result,
the byte that carries a fork's channel) with the next entry of its script, a list of actions:

    ["line", TEXT]   write TEXT and a newline ("@TOKEN@" becomes this runner's token)
    ["raw", TEXT]    write TEXT as it is (no newline: a truncated message)
    ["flood", N]     write N bytes without a newline (past the parent's line limit)
    ["greet", TEXT]  write TEXT and a newline on the last channel the parent handed over (a fork)
    ["close"]        exit at once
    ["hang"]         answer nothing more (the parent's timeout ends it, or the idle exit below)

When the script runs out it exits, and so it does after `IDLE_SECONDS` without a byte from the parent
(the parent then waits for a line this runner will never finish: its handshake would wait 30 s).
Standard library only, and nothing of the parent's is imported.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

TOKEN = os.urandom(16).hex()
IDLE_SECONDS = 1.0


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as file:
        script: list[list[list[object]]] = json.load(file)
    channel = socket.socket(fileno=os.dup(0))
    channel.settimeout(IDLE_SECONDS)
    handed: list[int] = []
    buffer = b""
    for answer in script:
        while b"\n" not in buffer and not buffer.startswith(b"F"):
            try:
                data, fds, _, _ = socket.recv_fds(channel, 1 << 16, 4)
            except TimeoutError:
                return
            if not data:
                return
            handed.extend(fds)
            buffer += data
        if buffer.startswith(b"F"):  # a fork's channel arrived (one byte, with a descriptor)
            buffer = buffer[1:]
        else:
            buffer = buffer.split(b"\n", 1)[1]
        for action in answer:
            perform(action, handed)


def perform(action: list[object], handed: list[int]) -> None:
    kind = action[0]
    if kind == "line":
        write(1, str(action[1]).replace("@TOKEN@", TOKEN).encode("utf-8", "surrogatepass") + b"\n")
    elif kind == "raw":
        write(1, str(action[1]).replace("@TOKEN@", TOKEN).encode("utf-8", "surrogatepass"))
    elif kind == "flood":
        write(1, b"x" * int(str(action[1])))
    elif kind == "greet" and handed:
        write(handed[-1], str(action[1]).replace("@TOKEN@", TOKEN).encode("utf-8", "surrogatepass") + b"\n")
    elif kind == "close":
        os._exit(0)
    elif kind == "hang":
        time.sleep(IDLE_SECONDS)
        os._exit(0)


def write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        os._exit(0)


if __name__ == "__main__":
    main()
