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
