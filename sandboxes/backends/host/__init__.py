"""The host backend: the runner in a worker process on this machine.

Isolation comes from Linux namespaces under bubblewrap (its own PID, network, IPC and mount view, an
unprivileged user), or, where those are unavailable, from a separate process with rlimits and a user of
its own; the Python-level guards hold at both levels.

Modules: `executor` (`HostExecutor`, `HostOptions`, the warm pools), `process` (the worker and its
fork server), `bubblewrap` (building and diagnosing the ``bwrap`` command), `probe` (the usage probe),
`reap` (private users and the reaper that collects their processes), `sweep` (finding and killing a
user's processes). What the backend keeps for the process is owned by ``resources("host")``.
"""

from .executor import HostExecutor, HostOptions, namespaces_available

__all__ = ["HostExecutor", "HostOptions", "namespaces_available"]
