"""What one in-sandbox request may cost (envd and the interpreter), declared once; the server's config
sets them, every handler checks them before reading."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InsideLimits:
    """Caps for requests to a sandbox's ports.

    max_file_bytes: one file written or read through ``/files`` (a multipart body may carry this much
        file data plus its framing); past it, 413 before the body is read when its length is declared.
    max_rpc_bytes: the body of one Connect call or one interpreter request other than ``/execute``.
    max_code_bytes: the body of one ``/execute`` (code and environment variables).
    max_list_entries: entries one ``ListDir`` answers; a bigger listing is refused, naming the cap.
    """

    max_file_bytes: int = 100 * 1024 * 1024
    max_rpc_bytes: int = 1024 * 1024
    max_code_bytes: int = 2 * 1024 * 1024
    max_list_entries: int = 5_000

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_rpc_bytes", "max_code_bytes", "max_list_entries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
