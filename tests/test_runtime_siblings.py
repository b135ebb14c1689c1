"""The runtime is loaded by path under private names, each file once per process: the runner's
siblings, and the copies audit and capture use, are one module each (siblings.py is the one loader)."""

from __future__ import annotations

import subprocess
import sys

from sandboxes.runtime import RUNTIME_DIR

PROBE = f"""
import importlib.util, os, sys
here = {str(RUNTIME_DIR)!r}
spec = importlib.util.spec_from_file_location("_kodeagent_siblings", os.path.join(here, "siblings.py"))
sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules[spec.name])
siblings = sys.modules[spec.name]
runner = siblings.load("runner")
runner.preimport()
mods = sys.modules
ours = sorted(n for n, m in mods.items() if os.path.dirname(getattr(m, "__file__", "") or "") == here)
print(ours)
print(mods["_kodeagent_capture"].bounds is mods["_kodeagent_bounds"] is runner.bounds is mods["_kodeagent_tools"].bounds)
print(mods["_kodeagent_audit"]._FRAME_ATTRIBUTES is mods["_kodeagent_guard"].FRAME_ATTRIBUTES)
print(siblings.load("guard") is mods["_kodeagent_guard"], runner.values is mods["_kodeagent_tools"].values)
print([name for name in ("runner", "bounds", "channel", "siblings", "tools") if importlib.util.find_spec(name)])
"""


def test_each_runtime_file_is_loaded_once_under_its_private_name_and_shared() -> None:
    found = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    loaded = eval(found[0])  # a list of str, printed by the probe above
    assert loaded and all(name.startswith("_kodeagent_") for name in loaded), loaded
    for name in ("runner", "channel", "limits", "tools", "cells", "artifacts", "capture", "startup", "audit"):
        assert f"_kodeagent_{name}" in loaded
    assert found[1:] == ["True", "True", "True True", "[]"]


ENTRY_PROBE = f"""
import importlib.util, os, sys
here = {str(RUNTIME_DIR)!r}
spec = importlib.util.spec_from_file_location("entry", os.path.join(here, sys.argv[1]))
entry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(entry)
print(hasattr(entry, "_siblings"))
runner = entry._runner()
mods = sys.modules
print(runner is mods["_kodeagent_runner"], runner.siblings is mods["_kodeagent_siblings"])
print(runner.siblings.load("runner") is runner, runner.siblings.load("channel") is runner.channel)
"""


def test_the_fork_server_and_session_host_take_the_runners_loader() -> None:
    """Both entry points load runner.py by path and use its one copy of siblings.py: no loader of
    their own, and every file the runner loads is the one they get from `siblings.load`."""
    for entry in ("forkserver.py", "sessionhost.py"):
        found = subprocess.run(
            [sys.executable, "-I", "-c", ENTRY_PROBE, entry],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.splitlines()
        assert found == ["False", "True True", "True True"], (entry, found)
