"""Forking a live session's runner: the ``fork`` request (loaded by `runner.py`; stdlib only).

The runner forks itself, so the new session starts with a copy-on-write copy of everything the code
built (globals, imported modules, loaded data), and it gets its own channel, capture pipes, drain and
stream threads, working directory and process group. Exchange (``fd`` channel, the host backend)::

    parent -> {"op": "fork", "workdir": DIR, "channel": "fd"}
    runner -> {"op": "fork_channel"}          the parent then sends one byte carrying the new
                                               channel's descriptor (SCM_RIGHTS) on the same socket
    runner -> {"op": "reply", "pid", "threads", "processes", "sockets"}     (on the old channel)
    child  -> {"op": "reply", "pid", "uid", "files", "bytes", "token"}      (on the new channel)

``listen`` channel (Docker, E2B: the channel is a stream the sandbox's manager carries, so no
descriptor can cross it): the runner makes the fork's working directory itself (it must not exist
yet), listens on a unix socket in a fresh private directory and answers
``{"op": "fork_channel", "path": P, "secret": S, "pid": RUNNER_PID}``; the parent starts
`forkrelay.py` inside the sandbox, which connects to P, sends S and a newline, and pumps bytes between
its stdio (the parent's new stream) and the socket. The runner accepts one connection within
`LISTEN_TIMEOUT`, checks the secret, removes the socket and its directory, and the accepted
connection becomes the new channel. Anything wrong: an error reply, this session intact.

The child is a grandchild (the middle process exits at once) started while the runner is not a
subreaper, so it is re-parented above the runner (the sandbox's init or the host's): the kill that
ends one session never finds the other in its process tree, and the child calls ``setsid`` so neither
shares the other's process group. What a fork cannot copy is counted for the caller: the code's own
threads (only the forking thread survives a fork), its child processes (they stay the parent's), and
open sockets (the descriptors are shared by both sessions, not copied).

The working directory is copied by the child itself, as the session's user and inside its sandbox,
so a symlink planted by the code can never make a privileged copier read or write for it; symlinks are
copied as links, special files are skipped. Copying costs time and space in proportion to the
directory's size (ext4 and tmpfs cannot share file blocks).
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
LISTEN_TIMEOUT = 30.0
"""Seconds the runner waits for the relay of a ``listen`` channel to connect and send its secret."""
SECRET_BYTES = 32


def census(channel_fds: tuple[int, ...], own_threads: int) -> dict[str, int]:
    """What a fork of this process cannot copy: the code's threads (past the runner's `own_threads`),
    child processes, open sockets."""
    try:
        threads = max(0, len(os.listdir("/proc/self/task")) - own_threads)
    except OSError:
        threads = 0
    processes = 0
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as handle:
                processes += len(handle.read().split())
    except OSError:
        pass
    sockets = 0
    try:
        for name in os.listdir("/proc/self/fd"):
            if int(name) in channel_fds:
                continue
            try:
                if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    sockets += 1
            except OSError:
                continue
    except OSError:
        pass
    return {"threads": threads, "processes": processes, "sockets": sockets}


def copy_tree(source: str, target: str) -> tuple[int, int]:
    """Copy the contents of `source` into the existing directory `target`: files, directories and
    symlinks (as links), nothing followed; returns (files, bytes) copied."""
    files = size = 0
    stack = [(source, target)]
    while stack:
        src_dir, dst_dir = stack.pop()
        try:
            entries = list(os.scandir(src_dir))
        except OSError:
            continue
        for entry in entries:
            src, dst = entry.path, os.path.join(dst_dir, entry.name)
            try:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    os.symlink(os.readlink(src), dst)
                elif stat.S_ISDIR(info.st_mode):
                    os.mkdir(dst, stat.S_IMODE(info.st_mode) | 0o700)
                    stack.append((src, dst))
                elif stat.S_ISREG(info.st_mode):
                    size += _copy_file(src, dst, info)
                    files += 1
            except OSError:
                continue  # a file that went away, or one the session itself could not read
    return files, size


def _copy_file(source: str, target: str, info: os.stat_result) -> int:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd_in = os.open(source, flags)
    try:
        fd_out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IMODE(info.st_mode))
        try:
            copied = 0
            while True:
                # copy_file_range/sendfile stay in the kernel; ext4 and tmpfs still copy the blocks.
                n = os.sendfile(fd_out, fd_in, None, 1 << 24) if hasattr(os, "sendfile") else 0
                if n == 0:
                    break
                copied += n
            if copied == 0 and info.st_size:
                with open(fd_in, "rb", closefd=False) as src, open(fd_out, "wb", closefd=False) as dst:
                    shutil.copyfileobj(src, dst)
                    copied = info.st_size
            os.utime(fd_out, ns=(info.st_atime_ns, info.st_mtime_ns))
            return copied
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def _subreaper(on: bool) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def receive_channel(read_fd: int) -> int:
    """The new channel's descriptor, sent by the parent as one byte with SCM_RIGHTS."""
    # A blocking socket object on a duplicate: no timeout, which would make the shared descriptor
    # non-blocking under the channel's reader. The parent's own deadline ends a fork that hangs here.
    with socket.socket(fileno=os.dup(read_fd)) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if len(fds) != 1:
        raise OSError("the parent sent no channel for the fork")
    return fds[0]


def listen_channel(runner: Any, workdir: str) -> int:
    """The new channel of a ``listen`` fork: the relay's connection, its secret checked (OSError else)."""
    import hmac  # here, not at the runner's start: only listen forks need it

    secret = os.urandom(SECRET_BYTES).hex()
    directory = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"kodeagent-fork-{os.urandom(8).hex()}")
    os.mkdir(directory, 0o700)  # this session's user only; a fresh name, so nobody else's
    path = os.path.join(directory, "channel")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            server.listen(1)
            server.settimeout(LISTEN_TIMEOUT)
            runner.channel.send({"op": "fork_channel", "path": path, "secret": secret, "pid": os.getpid()})
            try:
                conn, _ = server.accept()
            except TimeoutError:
                raise OSError(f"no relay connected within {LISTEN_TIMEOUT:g} s") from None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    try:
        conn.settimeout(LISTEN_TIMEOUT)
        line, expected = b"", secret.encode() + b"\n"
        while not line.endswith(b"\n") and len(line) < len(expected):
            chunk = conn.recv(len(expected) - len(line))
            if not chunk:
                break
            line += chunk
        if not hmac.compare_digest(line, expected):
            raise OSError("the connection to the fork's channel did not carry the secret")
        conn.settimeout(None)
        return conn.detach()
    except BaseException:
        conn.close()
        raise


def fork(runner: Any, message: dict[str, Any], subreaper: bool) -> dict[str, Any] | None:
    """Serve a ``fork`` request. A refusal is returned (the caller sends it); a fork is answered here,
    as soon as the child's pid is known (the middle process's exit is reaped after the answer, off
    the parent's path), and None returned. In the new session's runner (the child): set everything
    up, greet on the new channel, return None."""
    workdir = str(message.get("workdir", ""))
    mode = message.get("channel", "fd")
    channel = runner.channel
    if mode == "listen":
        try:
            os.mkdir(workdir, 0o700)  # absent: a fresh name the parent chose
        except OSError as exc:
            return {"op": "reply", "error": f"cannot make the fork's working directory {workdir!r} ({exc})"}
    elif mode != "fd":
        return {"op": "reply", "error": f"unknown fork channel {mode!r}"}
    if not os.path.isdir(workdir):
        return {"op": "reply", "error": f"the fork's working directory {workdir!r} does not exist"}
    report = census((channel.reader.fileno(), channel.write_fd), runner.own_threads())
    if mode == "listen":
        try:
            new_fd = listen_channel(runner, workdir)
        except OSError as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            return {"op": "reply", "error": f"the fork's channel could not be set up ({exc})"}
    else:
        channel.send({"op": "fork_channel"})
        new_fd = receive_channel(channel.reader.fileno())
    read_pid, write_pid = os.pipe()
    # No other thread may hold a lock the child needs: the drain, the stream sender and the writer.
    with runner.drain.lock, runner.streamer.cond, channel.lock:
        if subreaper:
            _subreaper(False)
        channel.own_fork = True  # for both forks below; the child's `rebind` leaves the channel
        try:
            middle = os.fork()
        except OSError as exc:  # RLIMIT_NPROC, or memory: this session goes on
            channel.own_fork = False
            if subreaper:
                _subreaper(True)
            for fd in (new_fd, read_pid, write_pid):
                os.close(fd)
            if mode == "listen":
                shutil.rmtree(workdir, ignore_errors=True)
            return {"op": "reply", "error": f"the runner could not fork ({exc})"}
        if middle:
            channel.own_fork = False
        else:
            try:
                child = os.fork()
            except OSError:
                os._exit(1)
            if child:
                os.write(write_pid, str(child).encode())
                os._exit(0)
            os.close(read_pid)
            os.close(write_pid)
            try:
                _become_child(runner, new_fd, workdir, subreaper)
            except BaseException:  # the parent sees the new channel close: `ForkError`
                os._exit(70)
            return None
    os.close(write_pid)
    os.close(new_fd)
    data = os.read(read_pid, 64)  # written right after the second fork (end-of-file if it failed)
    os.close(read_pid)
    if data:
        channel.send({"op": "reply", "pid": int(data), **report})
    # Subreaper again only once the middle is gone: the child must be re-parented above this runner.
    os.waitpid(middle, 0)
    if subreaper:
        _subreaper(True)
    if not data:
        if mode == "listen":
            shutil.rmtree(workdir, ignore_errors=True)
        return {"op": "reply", "error": "the runner could not fork"}
    return None


def _become_child(runner: Any, new_fd: int, workdir: str, subreaper: bool) -> None:
    """In the new session's runner: its own session, channel, pipes, threads and working directory."""
    os.setsid()
    if subreaper:
        _subreaper(True)
    runner.channel.rebind(new_fd)
    runner.restart_capture()
    files, size = copy_tree(runner.workdir, workdir)
    os.chdir(workdir)
    runner.moved_to(workdir)
    runner.channel.send(
        {"op": "reply", "pid": os.getpid(), "uid": os.getuid(), "files": files, "bytes": size}
    )
