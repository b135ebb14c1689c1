"""`NetworkPolicy` (what a network-on session may reach) and the connection report of a run."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .match import MAX_RULES, RuleError, parse_rule


class NetworkPolicy(BaseModel):
    """Where a network-on session may connect, enforced by the egress gateway outside the sandbox.

    The default (``Policy(network=True)``) is the public internet only: never loopback, private
    (RFC 1918), CGNAT, link-local (the cloud metadata address), unique-local, multicast or reserved
    ranges, this machine's own addresses or another session. Rules (see `sandboxes.egress.match`):

    Attributes:
        allow: if empty, every public destination; else only destinations a rule names, e.g.
            ``["pypi.org", "*.pythonhosted.org", "api.example.com:443"]``. A private address or this
            machine is reached only through an address-range rule that contains it
            (``"10.0.0.5/32:5432"``): a domain rule never leads to one, whatever its DNS says.
        deny: destinations refused even where `allow` would let them through (checked first).
        max_connections: connections open at once (more are refused at once).
        bytes_per_second: the session's bandwidth through the gateway, both directions together.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    max_connections: int = Field(64, ge=1, le=1024)
    bytes_per_second: int = Field(128 * 1024 * 1024, ge=1024)

    @field_validator("allow", "deny", mode="before")
    @classmethod
    def _as_tuple(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            raise ValueError("give a list of rules, not a single string")
        rules = tuple(value)
        if len(rules) > MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} rules")
        for rule in rules:
            try:
                parse_rule(rule)
            except RuleError as exc:
                raise ValueError(str(exc)) from None
        return rules

    def gateway_message(self) -> dict[str, Any]:
        """The rules and bounds as the gateway process takes them."""
        return {
            "allow": list(self.allow),
            "deny": list(self.deny),
            "limits": {"max_connections": self.max_connections, "rate_bytes": self.bytes_per_second},
        }


class Connection(BaseModel):
    """One connection the code made (or tried) through the gateway during a run."""

    host: str = Field(max_length=300, description="The name or address the code asked for.")
    port: int = Field(ge=0, le=65535)
    protocol: Literal["connect", "http", "socks5", "unknown"]
    address: str | None = Field(
        None, max_length=64, description="Where the gateway connected (or would have)."
    )
    allowed: bool
    rule: str = Field(max_length=400, description="The rule that allowed or refused it.")
    reason: str = Field("", max_length=1000)
    bytes_sent: int = Field(0, ge=0)
    bytes_received: int = Field(0, ge=0)
    open: bool = Field(False, description="Still open when the run ended (bytes so far).")


REPORT_ENTRIES = 256


class NetworkReport(BaseModel):
    """The connections since the previous run's report, at most `REPORT_ENTRIES` of them."""

    connections: list[Connection] = Field(default_factory=list, max_length=REPORT_ENTRIES)
    omitted: int = Field(0, ge=0, description="Connections past the bound, not listed.")
    error: str | None = Field(
        None, description="Why the report is missing (the gateway's answer was unusable)."
    )

    @property
    def refused(self) -> list[Connection]:
        return [c for c in self.connections if not c.allowed]
