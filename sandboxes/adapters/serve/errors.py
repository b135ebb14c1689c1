"""What the server answers when a request cannot be served: each error carries the HTTP status the
E2B SDK turns into its own exception (404/502 → `NotFoundException`/`SandboxException`, 401 →
`AuthenticationException`, 429 → `RateLimitException`, 400 → `InvalidArgumentException`), and a
message that says what to do."""

from __future__ import annotations

from ...errors import SandboxError


class ServeError(SandboxError):
    """A request the server refuses; `status` is the HTTP status it answers with."""

    status = 500

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class BadRequest(ServeError):
    status = 400


class Unauthorized(ServeError):
    status = 401


class Forbidden(ServeError):
    status = 403


class SandboxNotFound(ServeError):
    """No such sandbox for this caller (another tenant's sandbox is not found either, never forbidden:
    an id must not be probed). E2B's edge answers 502 with a message containing "was not found"; the
    control plane 404."""

    status = 404


class TooLarge(ServeError):
    status = 413


class TooMany(ServeError):
    status = 429
