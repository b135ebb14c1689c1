"""``python3 -I -S enter.py NET_FD IPC_FD COMMAND [ARG...]``: join a stand-in sandbox's namespaces, then
exec COMMAND (found on PATH) in place, keeping this pid. Standard library only."""

import ctypes
import os
import sys

if __name__ == "__main__":
    net_fd, ipc_fd, *argv = sys.argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    for fd in (int(net_fd), int(ipc_fd)):
        if libc.setns(fd, 0) != 0:
            error = ctypes.get_errno()
            print(f"enter.py: setns failed: {os.strerror(error)}", file=sys.stderr)
            sys.exit(126)
        os.close(fd)
    os.execvp(argv[0], argv)
