"""`kodeagent serve`: kodeagent sessions behind E2B's protocol, so the unmodified `e2b` and
`e2b-code-interpreter` SDKs (and every framework built on them) reach self-hosted sandboxes.

One ASGI app answers every sandbox and both in-sandbox ports at one URL, told apart as E2B's own
edge does: the `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers. Without them a request is for the
control plane (`control`); port 49983 is envd (`envd`: files and processes), port 49999 the code
interpreter (`interpreter`). Each in-sandbox request is resolved to a `ServedSandbox` (its access
token checked, its tenant's) before a handler sees it.
"""

from .errors import ServeError
from .sandbox import ENVD_PORT, INTERPRETER_PORT, Resolve, ServedSandbox

__all__ = ["ENVD_PORT", "INTERPRETER_PORT", "Resolve", "ServeError", "ServedSandbox"]
