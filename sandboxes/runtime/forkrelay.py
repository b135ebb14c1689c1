"""Inside a sandbox: the far end of a forked session's channel, and the kills that end one session of
a family sharing the sandbox (stdlib only; started by the parent, as the session's user).

    forkrelay.py relay             read a line ``PATH SECRET`` from stdin (the parent may start the
                                   relay before the fork it serves), connect to the unix socket PATH
                                   (a runner's ``listen`` fork, `sessionfork.py`), send the secret,
                                   then pump bytes stdin -> socket and socket -> stdout until either
                                   side closes. stdin/stdout are the parent's stream (a ``docker exec``
                                   attach, an E2B command), so the fork gets a channel of its own.
                                   Neither the path nor the secret is ever in a command line, which
                                   the sessions' code could read.
    forkrelay.py end PID [DIR]     a fork's runner PID (its own session and process group, it called
                                   setsid) and every process in its group or below it: SIGKILL; then
                                   remove its working directory DIR.
    forkrelay.py retire PID        the sandbox's first runner PID, when forks of it still live: its
                                   descendants SIGKILL, itself SIGSTOP (it is the sandbox's main
                                   process: its exit would end the sandbox and every fork in it).

Nothing here trusts what the session's code could have changed: it is started fresh from the
read-only runtime directory, with ``python3 -I -S``. The PID it is given came from a runner's reply,
which the code can forge, so it ends a PID only if that process is one the code could signal itself
(`_ours`: of this helper's user, in this sandbox's network namespace, not its init): a forged PID
then reaches nothing beyond the session's own family, even where the helper runs with more rights.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import sys

CHUNK = 1 << 16


def relay() -> int:
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)  # byte by byte: nothing past the first line may be taken from stdin
        if not byte or len(line) > 4096:
            return 2  # the parent closed a spare relay it did not need
        line += byte
    path, _, secret = line.decode().rstrip("\n").rpartition(" ")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(secret.encode() + b"\n")
    ends = {0: sock.fileno(), sock.fileno(): 1}  # source -> destination
    while ends:
        readable, _, _ = select.select(list(ends), [], [])
        for source in readable:
            try:
                data = os.read(source, CHUNK)
            except OSError:
                data = b""
            if not data:
                if source == 0:  # the parent closed the stream: the runner reads end-of-file
                    sock.shutdown(socket.SHUT_WR)
                    del ends[0]
                    continue
                return 0  # the runner closed its channel: the parent's stream ends with us
            view = memoryview(data)
            while view:
                view = view[os.write(ends[source], view) :]
    return 0


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process this user can see."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            found[int(name)] = (int(fields[1]), int(fields[2]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _descendants(root: int, table: dict[int, tuple[int, int]]) -> set[int]:
    below, frontier = set(), [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in table.items():
            if ppid == parent and pid not in below:
                below.add(pid)
                frontier.append(pid)
    return below


def _signal(pids: set[int], signum: int) -> None:
    for pid in pids:
        if pid > 1 and pid != os.getpid():
            try:
                os.kill(pid, signum)
            except OSError:
                pass


def _ours(pid: int) -> bool:
    """Whether `pid` is this sandbox's and this user's: real, effective and saved uid ours, and (where
    its namespace can be read) our network namespace. Never the sandbox's init, nor this helper."""
    if pid <= 1 or pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/status") as handle:
            uids = next((line.split()[1:4] for line in handle if line.startswith("Uid:")), [])
    except OSError:
        return False
    if set(uids) != {str(os.getuid())}:
        return False
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    except PermissionError:  # a non-dumpable process of our own user: ours to signal in any case
        return True
    except OSError:
        return False


def end(pid: int, workdir: str | None) -> int:
    # Its tree only if the runner is ours (a forged pid 1 has the whole family below it); its group's
    # members each if ours (the runner may be gone, a crash, leaving its group behind).
    # Stopped first, then killed: a process that forks meanwhile cannot leave a child behind.
    for _ in range(3 if pid > 1 else 0):
        table = _processes()
        group = {p for p, (_, leader) in table.items() if leader == pid and _ours(p)}
        targets = group | (_descendants(pid, table) | {pid} if _ours(pid) else set())
        if not targets:
            break
        _signal(targets, signal.SIGSTOP)
        _signal(targets, signal.SIGKILL)
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def retire(pid: int) -> int:
    if not _ours(pid):
        return 1
    _signal({pid}, signal.SIGSTOP)
    for _ in range(3):
        below = _descendants(pid, _processes())
        if not below:
            break
        _signal(below, signal.SIGSTOP)
        _signal(below, signal.SIGKILL)
    return 0


def main(argv: list[str]) -> int:
    if argv == ["relay"]:
        return relay()
    if len(argv) in (2, 3) and argv[0] == "end" and argv[1].isdigit():
        return end(int(argv[1]), argv[2] if len(argv) == 3 else None)
    if len(argv) == 2 and argv[0] == "retire" and argv[1].isdigit():
        return retire(int(argv[1]))
    print("usage: forkrelay.py relay | end PID [DIR] | retire PID", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
