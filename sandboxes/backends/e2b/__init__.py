"""The E2B backend: the runner inside an E2B cloud microVM, driven through the ``e2b`` SDK.

Isolation comes from the microVM (a kernel of its own), with egress closed unless the policy allows
network, on top of the Python-level guards.

Modules: `executor` (`E2BExecutor`, its worker, fork worker and usage probe).
"""

from .executor import REMOTE_RUNTIME, E2BExecutor, E2BOptions

__all__ = ["REMOTE_RUNTIME", "E2BExecutor", "E2BOptions"]
