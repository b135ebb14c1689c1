"""The watchdog: nothing the server started outlives it, even when the server is killed with SIGKILL.

`supervise()` forks before the server starts anything. The child returns and becomes the server; the
parent stays behind as the watchdog, a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): every
process the server starts is its descendant, and when the server dies its orphans (workers, fork
servers, their children, ``setsid`` daemons included) are re-parented to the watchdog instead of
to init. So:

- the server ends (any way, SIGKILL included): the watchdog kills every process left under it, asks
  the Docker backend's own sweep (``python -m sandboxes.images cleanup``: containers whose owner
  process is gone) to remove the server's containers, removes the server's temporary directory
  (its ``TMPDIR``, where the host backend's working directories are), and exits with the server's
  status;
- the watchdog is killed: the server gets SIGTERM (``PR_SET_PDEATHSIG``) and shuts down the normal
  way, closing every session and removing its temporary directory.

bubblewrap's ``--die-with-parent`` covers namespaced host workers only; this covers every host
worker and Docker containers. Remote sandboxes (E2B, Ray) end by their own timeouts.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ...runtime.proctools import descendants

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def available() -> bool:
    """True where the watchdog works (Linux)."""
    return sys.platform.startswith("linux")


def supervise(*, docker_sweep: bool = False, name: str = "mcp") -> tuple[int, str]:
    """Fork into watchdog and server. Returns in the server: the watchdog's pid and the server's
    temporary directory. The watchdog never returns (it exits with the server's status). Call it
    before starting threads or an event loop. `name` is the command (``kodeagent <name>``) its
    messages and temporary directory are named after."""
    if not available() or not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        raise OSError("the watchdog needs Linux (PR_SET_CHILD_SUBREAPER)")
    watchdog = os.getpid()
    # Traversable but not listable: sandbox users reach their own directories inside, nothing else.
    scratch = tempfile.mkdtemp(prefix=f"kodeagent-{name}-")
    os.chmod(scratch, 0o711)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _prctl(PR_SET_CHILD_SUBREAPER, 0)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != watchdog:  # the watchdog died before the line above
            os.kill(os.getpid(), signal.SIGTERM)
        if not os.isatty(0):
            # Its own process group: a kill of the client's child group still leaves the server to
            # close its sessions (it learns of the watchdog's death from PDEATHSIG).
            os.setpgid(0, 0)
        os.environ["TMPDIR"] = tempfile.tempdir = scratch
        # Registered before any backend loads, so it runs after their exit handlers (LIFO), which
        # remove what they made inside; this removes the rest when the watchdog cannot.
        atexit.register(shutil.rmtree, scratch, True)
        return watchdog, scratch
    try:
        os._exit(_watch(pid, docker_sweep, scratch, name))
    except BaseException:  # never fall back into the caller's code as a second server
        os._exit(70)


def _watch(server: int, docker_sweep: bool, scratch: str, name: str) -> int:
    # Hold neither end of the client's pipes: when the server dies the client must see end-of-file.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    # Nor the listening socket or anything else the server inherited: the port must free with the server.
    os.closerange(3, 1 << 16)
    same_group = os.getpgid(server) == os.getpgrp()

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(server, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        if signum == signal.SIGINT and same_group:
            signal.signal(signum, signal.SIG_IGN)  # the terminal sends it to the server itself
        else:
            signal.signal(signum, forward)
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == server:
            break
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(
            signum, signal.SIG_IGN
        )  # the cleanup is the point: a stop request waits for it (bounded)
    killed = kill_descendants()
    removed = _sweep_containers() if docker_sweep else 0
    shutil.rmtree(scratch, ignore_errors=True)
    if os.WIFSIGNALED(status):
        code = 128 + os.WTERMSIG(status)
        how = f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        code = os.WEXITSTATUS(status)
        how = f"exited with {code}"
    if killed or removed or code:
        print(
            f"kodeagent {name} watchdog: the server (pid {server}) {how}; killed {killed} leftover "
            f"process(es), removed {removed} container(s)",
            file=sys.stderr,
            flush=True,
        )
    return code


def kill_descendants(deadline: float = 10.0) -> int:
    """Kill (SIGKILL) and reap every process left under this one; return how many there were.

    A killed process's own children are re-parented here in turn (we are their subreaper), so this
    repeats until nothing is left."""
    me = os.getpid()
    seen: set[int] = set()
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        children = list(descendants(me))  # every level at once: killing is all that is left to do
        _reap()
        if not children:
            break
        for child in children:
            seen.add(child)
            for kill in (os.killpg, os.kill):  # its group too: workers lead their own
                try:
                    kill(child, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        time.sleep(0.01)
        _reap()
    return len(seen)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _sweep_containers() -> int:
    """The Docker backend's own sweep: removes sandbox containers whose owner process is gone."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sandboxes.images", "cleanup"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
            text=True,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"kodeagent watchdog: the container sweep failed: {exc}", file=sys.stderr, flush=True)
        return 0
    return sum(1 for line in done.stderr.splitlines() if line.startswith("removed "))
