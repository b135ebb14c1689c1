"""The runner's memory reserve is kept across runs only while the address space has room for it,
and released once the code took the limit (in a process of its own: the limit is an rlimit)."""

from __future__ import annotations

import subprocess
import sys

from sandboxes.runtime import RUNTIME_DIR

PROBE = f"""
import contextlib, importlib.util, os, resource, sys
spec = importlib.util.spec_from_file_location("_kodeagent_siblings", os.path.join({str(RUNTIME_DIR)!r}, "siblings.py"))
sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules[spec.name])
limits = sys.modules[spec.name].load("limits")

class System:
    def trusted(self):
        return contextlib.nullcontext()

reserve = limits.MemoryReserve(limits.RESERVE_BYTES, System())
limits.apply_limits({{"memory_mb": 256}}, extra_address_space=reserve.size)
reserve.read_limit()
reserve.take()
print(reserve.limit == (256 << 20) + reserve.size, reserve.block is not None)
reserve.release_unless_room()
print(reserve.block is not None)  # room to spare: kept
keep = []
try:
    while True:
        keep.append(bytearray(1 << 20))
except MemoryError:
    pass
reserve.release_unless_room()
print(reserve.block is None)  # the code took the limit: released
del keep
reserve.take()
print(reserve.block is not None)  # taken again once there is room
"""


def test_the_reserve_is_kept_while_there_is_room_and_released_once_the_code_took_the_limit() -> None:
    found = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert found == ["True", "True", "True", "True", "True"], found


REPLACED = f"""
import contextlib, importlib.util, os, sys
spec = importlib.util.spec_from_file_location("_kodeagent_siblings", os.path.join({str(RUNTIME_DIR)!r}, "siblings.py"))
sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules[spec.name])
limits = sys.modules[spec.name].load("limits")

class System:
    def trusted(self):
        return contextlib.nullcontext()

reserve = limits.MemoryReserve(limits.RESERVE_BYTES, System())
limits.apply_limits({{"memory_mb": 256}}, extra_address_space=reserve.size)
reserve.read_limit()
reserve.take()
print(os.readlink(f"/proc/self/fd/{{reserve.size_fd}}") == f"/proc/{{os.getpid()}}/statm")
keep = []
try:
    while True:
        keep.append(bytearray(1 << 20))
except MemoryError:
    pass
# what code that can reach the descriptor may do: a file of its own that says "one page" put there
del keep[:4]
with open("forged-statm", "w") as forged:
    forged.write("1 1 1 1 0 1 0\\n")
fd = os.open("forged-statm", os.O_RDONLY)
os.dup2(fd, reserve.size_fd)
reserve.release_unless_room()
print(reserve.block is None)  # not fooled: the descriptor is not the statm it opened, so released
del keep
reserve.take()
reserve.reopen()
os.close(reserve.size_fd)  # or closed it
reserve.release_unless_room()
print(reserve.block is None)  # released: no reading is a doubt
reserve.reopen()
reserve.take()
pid = os.fork()
if pid == 0:  # a forked session's runner reopens (`Runner.moved_to`): its own size, not the parent's
    before = os.readlink(f"/proc/self/fd/{{reserve.size_fd}}")
    reserve.reopen()
    after = os.readlink(f"/proc/self/fd/{{reserve.size_fd}}")
    os.write(1, f"{{before == f'/proc/{{os.getppid()}}/statm'}} {{after == f'/proc/{{os.getpid()}}/statm'}}\\n".encode())
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_the_reserve_reads_only_its_own_processs_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The size reading is a descriptor the runner keeps open: one the code replaced or closed
    releases the reserve (a forged size cannot keep it), and a fork reads its own size."""
    found = subprocess.run(
        [sys.executable, "-I", "-c", REPLACED],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
    ).stdout.split()
    assert found == ["True", "True", "True", "True", "True"], found
