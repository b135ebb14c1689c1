"""What one in-sandbox request may cost (envd and the interpreter), declared once: the server's config
holds them (`ServeConfig.inside`, the ``[inside]`` table of its file), every handler checks them before
reading."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MIB = 1024 * 1024


class InsideLimits(BaseModel):
    """Caps for requests to a sandbox's ports.

    max_file_bytes: one file written or read through ``/files`` (a multipart body may carry this much
        file data plus its framing); past it, 413 before the body is read when its length is declared.
    max_rpc_bytes: the body of one Connect call or one interpreter request other than ``/execute``.
    max_code_bytes: the body of one ``/execute`` (code and environment variables).
    max_list_entries: entries one ``ListDir`` answers; a bigger listing is refused, naming the cap.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_file_bytes: int = Field(100 * MIB, ge=1)
    max_rpc_bytes: int = Field(MIB, ge=1)
    max_code_bytes: int = Field(2 * MIB, ge=1)
    max_list_entries: int = Field(5_000, ge=1)
