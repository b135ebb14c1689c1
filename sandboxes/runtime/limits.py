"""The runner's resource limits and the memory it keeps back for itself under them (loaded by
`runner.py` as ``_kodeagent_limits``; stdlib only).

The limits are rlimits the runner sets on itself at `init`, before any code runs, soft and hard
alike (the code cannot raise them again); a limit of 0 leaves that rlimit as it is (Docker leaves
memory and processes to the container's cgroup). Under a memory limit the runner adds a reserve of
address space that only it uses (`MemoryReserve`), so a run that used up the limit still gets its
reply.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from typing import Any

RESERVE_BYTES = 32 << 20
"""Address space the runner keeps back for itself under a memory limit (added to the limit)."""


class MemoryReserve:
    """Address space the runner holds back from the code, so that it can still describe the run, collect
    its output and send the reply after the code used up the memory limit (and kept what it took).

    An anonymous mapping that is never touched: it counts against RLIMIT_AS but is never resident.
    When the code's run ends it is released unless the address space still has its size free (then
    the reply has that room either way, and a run pays no unmap and map again); taken again after
    the reply once there is room.
    """

    def __init__(self, size: int, system: Any) -> None:
        self.size = size
        self.system = system
        self.block: mmap.mmap | None = None
        self.limit = 0
        """The address-space limit the reserve lives under (RLIMIT_AS, read at `init`); 0: none."""
        self.size_fd: int | None = None
        """This process's /proc/<pid>/statm, opened once and re-read after every run (a run then pays
        a read and an fstat, not an audited open, a read and a close); None: none open (the check
        releases)."""
        self._size_file: tuple[int, int] | None = None  # (st_dev, st_ino) of what `size_fd` opened

    def read_limit(self) -> None:
        """After the limits are set: the address-space limit the room is measured against."""
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        self.limit = 0 if soft == resource.RLIM_INFINITY else soft
        self.reopen()

    def reopen(self) -> None:
        """Open this process's statm afresh: at `init`, and in a forked session's runner (a
        descriptor of /proc/self stays bound to the process that opened it)."""
        if self.size_fd is not None:
            try:
                os.close(self.size_fd)
            except OSError:
                pass  # (closed by the code)
            self.size_fd = self._size_file = None
        if self.limit and self.size:
            try:
                with self.system.trusted():
                    fd = os.open("/proc/self/statm", os.O_RDONLY)
                opened = os.fstat(fd)
            except OSError:
                return  # (out of descriptors under the code's limit) each run releases the reserve
            self.size_fd, self._size_file = fd, (opened.st_dev, opened.st_ino)

    def release_unless_room(self) -> None:
        """After a run: release the reserve unless at least its size of address space is still free
        under the limit (the process's size is read from /proc; any doubt releases it)."""
        if self.block is None:
            return
        if self.limit and self.size_fd is not None:
            try:
                # the code may have closed the number or put a file of its own there (os.dup2)
                found = os.fstat(self.size_fd)
                if (found.st_dev, found.st_ino) != self._size_file:
                    raise ValueError("not the statm the reserve opened")
                pages = int(os.pread(self.size_fd, 64, 0).split()[0])
                if self.limit - pages * mmap.PAGESIZE >= self.size:
                    return
            except (OSError, ValueError, IndexError, MemoryError):
                pass
        self.release()

    def take(self) -> None:
        if self.size and self.block is None:
            try:
                with self.system.trusted():  # the audit hook refuses mmap to the code, not to us
                    self.block = mmap.mmap(-1, self.size)
            except (OSError, ValueError, MemoryError):
                pass  # the code still holds the memory: tried again after the next request

    def release(self) -> None:
        block, self.block = self.block, None
        if block is not None:
            block.close()


def apply_limits(limits: Mapping[str, Any], extra_address_space: int = 0) -> None:
    """Set each limit of `limits` (a `LimitsConfig`) as soft and hard limit at once, never above a
    hard limit already set; the address space gets `extra_address_space` more (the reserve), and
    core dumps are always off (a dump would write the code's memory outside its working directory)."""
    import resource

    memory = limits.get("memory_mb", 0) * 1024 * 1024
    wanted = {
        "RLIMIT_AS": memory + extra_address_space if memory else 0,
        "RLIMIT_CPU": limits.get("cpu_seconds", 0),
        "RLIMIT_NPROC": limits.get("max_processes", 0),
        "RLIMIT_FSIZE": limits.get("max_file_mb", 0) * 1024 * 1024,
        "RLIMIT_NOFILE": limits.get("max_open_files", 0),
        "RLIMIT_CORE": 0,
    }
    for name, value in wanted.items():
        kind = getattr(resource, name, None)
        if kind is None or (value == 0 and name != "RLIMIT_CORE"):
            continue
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):
            pass
