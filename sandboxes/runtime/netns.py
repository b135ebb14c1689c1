"""Network and IPC namespaces of one's own, loopback up: what keeps forked sessions apart (Linux).

Sessions forked from one fork server live in one bubblewrap sandbox. Without this they would share
its network namespace (a listener on 127.0.0.1, or on an abstract unix socket, of one session is
reachable from another) and its IPC namespace (System V shared memory, semaphores, message queues).
The fork server's child calls `separate()` before it becomes a runner, while it still holds the
privileges it then drops:

- root in the sandbox (bwrap run by root keeps root's capabilities and makes no user namespace):
  ``unshare(CLONE_NEWNET | CLONE_NEWIPC)``; the runner's switch to the session's private user then
  drops every capability;
- otherwise (bwrap made a user namespace and dropped every capability): a user namespace of its own
  too, mapping its uid and gid to themselves, which owns the new namespaces and so may configure
  them; every capability is dropped before the function returns.

A new network namespace has one interface, ``lo``, and it is down: an ioctl brings it up, so code
that serves and connects on 127.0.0.1 or ::1 within one session works as it does anywhere.

Making a network namespace, and the kernel's tearing it down, cost about three times a bare fork
(its loopback device, its sysctl tables). A namespace made as root (no user namespace of its own) is
therefore handed to a later session of the same fork server once nothing is left in it
(`forkserver.Recycler`) and its `Usage` reads as it did when the namespace was new; the IPC namespace
is always new (`rejoin`). Standard library only (ctypes: ``os.unshare`` is Python 3.12+).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
_IFREQ = "16sh22x"  # struct ifreq: the interface name, then ifr_flags in a 24-byte union
_CAPABILITY_V3 = 0x20080522
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def prepare() -> None:
    """Load libc and look up ``unshare`` and ``setns`` now, in the fork server, so that every child inherits them
    instead of paying for the lookup itself (in a just-forked process, copy-on-write faults
    included)."""
    _c().unshare  # noqa: B018 - ctypes keeps the function on the library object once looked up
    _c().setns  # noqa: B018


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def separate() -> bool:
    """Move this (single-threaded) process into new network and IPC namespaces with loopback up.

    Returns whether it took a user namespace of its own to do so (then the network namespace is owned
    by it, and no other process of the sandbox may join it). Raises OSError, saying which step
    failed, when the kernel refuses; the caller must then not run a session (it would share the
    namespaces it was meant to leave).
    """
    flags = CLONE_NEWNET | CLONE_NEWIPC
    if _c().unshare(flags) == 0:
        own_user = False
    else:
        first = ctypes.get_errno()
        uid, gid = os.getuid(), os.getgid()
        if _c().unshare(CLONE_NEWUSER | flags) != 0:
            second = ctypes.get_errno()
            raise OSError(
                second,
                f"unshare(network, IPC) failed ({os.strerror(first)}), and with a user "
                f"namespace too ({os.strerror(second)})",
            )
        _map_to_self(uid, gid)
        own_user = True
    loopback_up()
    if own_user:
        drop_capabilities()
    return own_user


def rejoin(network: int) -> None:
    """Move this process into a new IPC namespace and into the network namespace open as `network`
    (one a session has left, shown unused: `forkserver.Recycler`), whose loopback is already up.
    Needs the privileges `separate` uses as root; raises OSError, saying which step failed."""
    _check(_c().unshare(CLONE_NEWIPC), "unshare(IPC)")
    _check(_c().setns(network, CLONE_NEWNET), "setns(network)")


USAGE_FILES = ("dev", "snmp", "snmp6", "unix", "ip6_flowlabel", "sockstat")
"""What `Usage` reads of a network namespace: the loopback's packet counts (every packet sent in it
crosses its one device), its IP, ICMP and UDP counters (a datagram refused for want of a route moves
them, and crosses no device), its unix sockets (in flight in a cycle they outlive every process, a
bound abstract name with them), its IPv6 flow labels (a lease lingers after its socket) and its
count of sockets in use and in TIME_WAIT."""

_MACHINE_WIDE = {b"alloc", b"orphan", b"mem"}  # sockstat fields counted for the whole machine


class Usage:
    """`USAGE_FILES` of one network namespace, opened from inside it (a file of ``/proc/net`` keeps
    the namespace of its opening) at descriptors from `lowest` on, so that a later reading needs no
    ``setns`` and no ``open``: `read()` is equal for two readings when nothing was sent, refused, left
    bound or in TIME_WAIT, or leased in between; `when_opened` is the first. Raises OSError when a
    file cannot be opened."""

    def __init__(self, lowest: int) -> None:
        self.descriptors: list[int] = []
        self.when_opened = b""
        try:
            for name in USAGE_FILES:
                fd = os.open(f"/proc/thread-self/net/{name}", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    self.descriptors.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest))
                finally:
                    os.close(fd)
            self.when_opened = self.read()
        except OSError:
            self.close()
            raise

    def read(self) -> bytes:
        """The files' texts now, without the fields counted for the whole machine."""
        parts = []
        for fd in self.descriptors:
            chunks, offset = [], 0
            while chunk := os.pread(fd, 1 << 16, offset):
                chunks.append(chunk)
                offset += len(chunk)
            text = b"".join(chunks)
            if text.startswith(b"sockets:"):  # sockstat
                words = text.split()
                text = b" ".join(
                    w
                    for i, w in enumerate(words)
                    if w not in _MACHINE_WIDE and (i == 0 or words[i - 1] not in _MACHINE_WIDE)
                )
            parts.append(text)
        return b"\0".join(parts)

    def close(self) -> None:
        for fd in self.descriptors:
            os.close(fd)
        self.descriptors = []


def usage_of(network: int, home: int, lowest: int) -> Usage:
    """A `Usage` of the network namespace open as `network`, opened by this (single-threaded)
    process moving into it and back to `home` (needs CAP_SYS_ADMIN)."""
    _check(_c().setns(network, CLONE_NEWNET), "setns(network)")
    try:
        return Usage(lowest)
    finally:
        _check(_c().setns(home, CLONE_NEWNET), "setns(home)")


def _map_to_self(uid: int, gid: int) -> None:
    """Map our uid and gid to themselves in the user namespace we just made (files keep their owner)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def loopback_up() -> None:
    """Bring ``lo`` of this process's network namespace up (SIOCSIFFLAGS; needs CAP_NET_ADMIN there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        if not flags & IFF_UP:
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))


def drop_capabilities() -> None:
    """Clear the effective, permitted, inheritable and ambient capability sets of this process."""
    _c().prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # fails harmlessly on old kernels
    header = _CapHeader(_CAPABILITY_V3, 0)
    data = (_CapData * 2)()
    _check(_c().capset(ctypes.byref(header), data), "capset")
