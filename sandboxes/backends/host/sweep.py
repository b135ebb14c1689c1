"""Finding and ending every process of a host session's private user (`host/process.py` kills with it).

A session's processes can leave its process group and tree (`setsid`, double forks), but not its
private user: the last session of a user to close kills every process of that user and waits until
none is left, zombies included, before the uid is handed out again (`host.reap.PrivateUsers`). The
kill is one ``kill(-1)`` sent as that user (`signal_user`), where it can be, else a walk of the
user's processes (`kill_user_processes`); the wait walks them (twice, to confirm none is left).
Under namespaces they are looked for among the fork server's PID namespace only (see
`user_processes`); at the ``process`` level among every process of the machine.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import signal
import threading
import time
from collections.abc import Collection

from ...usage import children, read_text


def start_time(pid: int | None) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def wait_until_reaped(
    pid: int | None, start: int | None, uid: int | None, within: int | None = None, limit: float = 2.0
) -> bool:
    """Wait (briefly) until a fork-server child and its user's processes are gone, zombies included,
    so that a reaped session has nothing left in the process table; False if some are still there.
    `within`: see `user_processes`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if pid is not None and start is not None and start_time(pid) == start:
            time.sleep(0.001)
            continue
        if uid is not None and user_processes(uid, within):
            time.sleep(0.002)
            continue
        return True
    return False


def user_processes(
    uid: int, within: int | None = None, *, living: bool = False, confirm: bool = True
) -> list[int]:
    """The pids of `uid`'s processes, zombies included unless `living`.

    `within` (the fork server's bwrap, under namespaces): only the processes below it, which are
    every process of its PID namespace (none can leave it, and an orphan is re-parented to a reaper
    inside it, an ancestor), matched by real, effective or saved uid; the walk skips what lies below
    another session's process (no unprivileged process can start one of another user, nor be
    re-parented below a process that was not its ancestor). The listing is taken twice and must
    agree on being empty (unless not `confirm`: a caller that looks again after), as a process
    re-parented during a walk could be missed once. That is a few processes instead of the
    machine's whole process table. Without `within`: every process in /proc, by its entry's owner
    (zombies included: /proc does not tell them apart here)."""
    if within is None:
        return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and _owner(e) == uid]
    for _ in range(2 if confirm else 1):
        found = [pid for pid, state in _namespace_processes(uid, within) if not (living and state == "Z")]
        if found:
            return found
    return []


def users_present(uids: Collection[int], within: int | None = None) -> set[int]:
    """Which of `uids` still have a process, zombies included: `user_processes` for many users in
    one walk instead of one each (the reaper confirms the sessions it killed in batches). A user is
    absent only when two listings agree; `within` as in `user_processes`."""
    wanted = {str(uid) for uid in uids}
    present: set[str] = set()
    for _ in range(2):
        if within is None:
            found = {str(_owner(e)) for e in os.scandir("/proc") if e.name.isdigit()}
        else:
            found = {owner for _pid, owners, _state in _namespace_walk(wanted, within) for owner in owners}
        present |= found & wanted
        if present == wanted:
            break  # all found: a second listing could not clear any of them
    return {int(uid) for uid in present}


def _namespace_walk(wanted: set[str], within: int) -> list[tuple[int, list[str], str]]:
    """(pid, uids, state) of every process below `within` that runs as one of `wanted` or as root,
    pruned below any other user's process (see `user_processes`)."""
    found: list[tuple[int, list[str], str]] = []
    queue = [within]
    seen = {within}
    while queue:
        pid = queue.pop()
        owner = _uids_and_state(pid)
        if owner is None:
            continue  # gone
        uids, state = owner
        if "0" not in uids and wanted.isdisjoint(uids):
            continue  # another session's process: nothing of these users lies below it
        found.append((pid, uids, state))
        for child in children(pid):
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return found


def _namespace_processes(uid: int, within: int) -> list[tuple[int, str]]:
    """(pid, state letter) of `uid`'s processes below `within`, pruned as `user_processes` says."""
    mine = str(uid)
    return [(pid, state) for pid, uids, state in _namespace_walk({mine}, within) if mine in uids]


def _uids_and_state(pid: int) -> tuple[list[str], str] | None:
    """The real, effective and saved uids of `pid` and its state letter (``R``, ``S``, ``Z``...)."""
    text = read_text(f"/proc/{pid}/status")  # State and Uid are in its first few hundred bytes
    if text is None:
        return None
    state_at, uids = text.find("\nState:\t"), process_uids(text)
    if state_at < 0 or not uids:
        return None
    return uids, text[state_at + 8 : state_at + 9]


def process_uids(status: str) -> list[str]:
    """The real, effective and saved uids in a /proc/<pid>/status text (empty if it has none)."""
    uid_at = status.find("\nUid:\t")
    if uid_at < 0:
        return []
    return status[uid_at + 6 : status.find("\n", uid_at + 1)].split()[:3]


def _owner(entry: os.DirEntry[str]) -> int | None:
    try:
        return entry.stat().st_uid
    except OSError:
        return None


def kill_user_processes(uid: int, within: int | None = None) -> None:
    """Kill every process of a worker's private user: catches `setsid` children that left the group.
    After each round of signals, wait (briefly) for those processes to die before looking again, so
    the next look finds only what was started meanwhile."""
    for _ in range(3):
        found = user_processes(uid, within, living=True, confirm=False)  # the reap's wait confirms
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        if not found:
            return
        if within is not None:
            _wait_dead(found, uid)


def _wait_dead(pids: list[int], uid: int, limit: float = 0.5) -> None:
    """Until each of `pids` (if still `uid`'s) is a zombie or gone, at most `limit` seconds."""
    deadline = time.monotonic() + limit
    mine = str(uid)
    for pid in pids:
        while time.monotonic() < deadline:
            owner = _uids_and_state(pid)
            if owner is None or mine not in owner[0] or owner[1] == "Z":
                break
            time.sleep(0.0005)


# The raw system call: glibc's setresuid() changes every thread of the process, the kernel's only
# the calling one. x86-64 and arm64 numbers; elsewhere the kill walks the user's processes instead.
_SETRESUID = {"x86_64": 117, "aarch64": 147}.get(platform.machine())
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_as_user = threading.Lock()


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def signal_user(uid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to every process of `uid` in one ``kill(-1, sig)`` made with this thread's
    credentials set to `uid` for that call only; False (nothing sent) where that cannot be done here
    (not root, another architecture), and the caller walks the processes instead.

    Why: the kernel signals every process the sender may signal (those whose real or saved uid is
    `uid`: any process of the user, setuid binaries included, in every PID namespace below ours)
    while it holds the task list, which a fork needs to add its child, so no process of the user can
    fork its way past the signal: a fork bomb ends in one call, without walking the process table
    (`kill_user_processes` walks it at least twice). Our own process is never signalled (the kernel
    skips the caller's thread group), and no other thread of ours changes credentials. The saved uid
    stays 0, so the thread takes root back at once; the change of effective uid clears the
    process's dumpable flag, which is restored (and keeps the thread from being traced meanwhile).

    It reaches `uid`'s processes anywhere on the machine, not only below one fork server: `uid` must
    be this process's alone (the host backend's private uids are, by `reap.UidBlocks`).

    For that call the thread is `uid`'s, so `uid`'s processes may signal it: call this only where
    none of them can name it (a PID namespace of their own, which our pid is not in), never where
    they share our PID namespace (the host backend's ``process`` level walks instead)."""
    if _SETRESUID is None or os.geteuid() != 0 or uid <= 0:
        return False
    libc = _libc()
    with _as_user:
        dumpable = libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
        if libc.syscall(_SETRESUID, uid, uid, 0) != 0:
            return False
        try:
            sent = libc.kill(-1, sig) == 0 or ctypes.get_errno() == 3  # ESRCH: none left to signal
        finally:
            if libc.syscall(_SETRESUID, 0, 0, 0) != 0:  # cannot fail with a saved uid of 0
                os.abort()  # a thread of ours left as the session's user must not go on
            if dumpable > 0:
                libc.prctl(_PR_SET_DUMPABLE, dumpable, 0, 0, 0)
    return sent
