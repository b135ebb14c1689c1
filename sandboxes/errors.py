"""The exceptions `sandboxes` raises.

`Executor.run()` never raises because of what the *code* did: that comes back in the
`ExecutionResult`. These exceptions are for misuse of the API and for backends that
cannot work here; every message says what to do about it.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every exception raised by `sandboxes`."""


class BackendUnavailable(SandboxError):
    """The backend cannot run on this machine (missing package, daemon down, no credentials, ...)."""


class EgressUnavailable(BackendUnavailable):
    """This host cannot build the egress gateway a network-on session needs; the message says why and
    what to do. Never a reason to give the session this machine's network instead."""


class UnknownBackend(SandboxError, ValueError):
    """`open_executor()` was given a backend name it does not know."""


class ExecutorClosed(SandboxError):
    """The executor was used after `close()` (or before `open()`)."""


class WorkerStartError(SandboxError):
    """A sandbox worker could not be started or did not answer its handshake."""


class ProtocolError(SandboxError):
    """The runner sent something that is not a valid protocol message."""


class ExecutorBusy(SandboxError):
    """An operation that needs the session idle (`fork()`) was called while a run was in progress."""


class ForkError(SandboxError):
    """The session could not be forked (this backend or session cannot, or the fork failed); the
    parent session is intact unless the message says otherwise."""


class SandboxFileError(SandboxError):
    """`upload()` or `download()` was given a path outside the working directory, or the file is missing."""


class FileTooLarge(SandboxFileError):
    """`download()` found more bytes than its cap (`max_bytes`); it stopped reading there. The session
    is intact where the transfer could be stopped cleanly; the message says how to raise the cap."""

    @classmethod
    def over(cls, path: str, max_bytes: int) -> FileTooLarge:
        """The error for `path` once more than `max_bytes` of it arrived."""
        return cls(
            f"{path!r} is larger than the download cap of {max_bytes:,} bytes, so reading stopped there; "
            "pass a larger max_bytes= to download() to read it"
        )
