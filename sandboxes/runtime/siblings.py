"""The runtime's one loader: a file of this directory, by path, under a private name.

The runtime directory is never put on `sys.path`, so the code in a sandbox cannot import any of it
by name (``import runner`` finds nothing); each file is loaded as ``_kodeagent_<name>``, once per
process: a runner forked from the fork server or a session host finds the copies its parent loaded
(none holds a session's state). `runner.py` loads this file by path first (the fork server and the
session host load `runner.py` by path and take its copy, ``runner.siblings``); every other file
takes it from `sys.modules` (`NAME`), so each file is loaded exactly once and all share one copy of
each (one `bounds`, one `guard`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

PREFIX = "_kodeagent_"
NAME = PREFIX + "siblings"
"""This module's own name in `sys.modules`: where the other files of the runtime find `load`."""
HERE = os.path.dirname(os.path.abspath(__file__))


def load(name: str) -> ModuleType:
    """The runtime file `name`.py, loaded under ``_kodeagent_<name>`` unless it already is."""
    key = PREFIX + name
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.spec_from_file_location(key, os.path.join(HERE, f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # before it runs: a file it loads in turn finds it (no second copy)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return module
