"""`NetworkPolicy` (what a network-on session may reach) and the connection report of a run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .match import MAX_RULES, RuleError, decide, literal, normal_host, parse_rule, parse_rules

MAX_SECRETS = 64
MAX_SECRET_HEADERS = 32
MAX_SECRET_VALUE = 8 * 1024
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
FRAMING_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "expect",
    }
)
"""Headers a secret may not set: they decide where and how the request goes, not who sends it."""


class Secret(BaseModel):
    """Headers the egress gateway adds to the HTTPS requests a session sends to one host.

    The code never holds the values: the gateway terminates TLS for `host` (with a certificate of
    the session's own authority, which only that session trusts), replaces any header of the same
    name the code wrote, and sends the request on over TLS it verified itself. A server that echoes
    request headers back reveals them to the code.

    Args:
        host: a domain name, optionally with ``:PORT`` (default 443); no wildcard, no address: the
            gateway proves the destination by a certificate for this name.
        headers: name to value, e.g. ``{"Authorization": "Bearer ..."}``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    host: str
    port: int = Field(443, ge=1, le=65535)
    headers: tuple[tuple[str, SecretStr], ...]

    @model_validator(mode="before")
    @classmethod
    def _split_port(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("host"), str) and "port" not in data:
            host = data["host"]
            try:
                rule = parse_rule(host)
            except RuleError:
                raise ValueError(f"{host[:300]!r} is not a host name (optionally with :PORT)") from None
            if rule.domain is None or "*" in rule.domain or (":" in host and rule.ports[0] != rule.ports[1]):
                raise ValueError(
                    f"{host[:300]!r}: a secret's host is one domain name (no wildcard, address or port "
                    "range): the gateway proves it by a certificate for that name"
                )
            port = rule.ports[0] if ":" in host else 443
            return {**data, "host": rule.domain, "port": port}
        return data

    @field_validator("host")
    @classmethod
    def _name(cls, host: str) -> str:
        name = normal_host(host)
        if name is None or literal(name) is not None:
            raise ValueError(f"{host[:300]!r}: a secret's host is a domain name (its port apart)")
        return name

    @field_validator("headers", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> tuple[tuple[str, Any], ...]:
        pairs = tuple(value.items()) if isinstance(value, Mapping) else tuple(value)
        if not 0 < len(pairs) <= MAX_SECRET_HEADERS:
            raise ValueError(f"a secret has 1 to {MAX_SECRET_HEADERS} headers")
        names = set()
        for pair in pairs:
            if not (isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise ValueError("headers are a mapping of header name to value")
            name, raw = pair
            if not _HEADER_NAME.fullmatch(name) or name.lower() in FRAMING_HEADERS:
                raise ValueError(f"{name[:100]!r} is not a header a secret may set")
            if name.lower() in names:
                raise ValueError(f"the header {name!r} is given twice")
            names.add(name.lower())
            text = raw.get_secret_value() if isinstance(raw, SecretStr) else raw
            if not isinstance(text, str) or len(text) > MAX_SECRET_VALUE or _BAD_VALUE.search(text):
                raise ValueError(  # never the value itself: errors are shown to users and logs
                    f"the value of the header {name!r} must be text of at most {MAX_SECRET_VALUE} "
                    "characters without line breaks or control characters"
                )
        return tuple((name, raw) for name, raw in pairs)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def gateway_message(self) -> dict[str, Any]:
        """The host and the revealed values, for the gateway process only."""
        return {
            "host": self.host,
            "port": self.port,
            "headers": [[name, value.get_secret_value()] for name, value in self.headers],
        }


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
        secrets: headers the gateway adds to HTTPS requests to a host, so that the code never holds
            them: ``{"api.example.com": {"Authorization": "Bearer ..."}}`` (a host may carry
            ``:PORT``, default 443), or `Secret` objects. Each host must be one the rules allow.
            Values are `SecretStr`: never in a repr, a dump, a log or an error.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    max_connections: int = Field(64, ge=1, le=1024)
    bytes_per_second: int = Field(128 * 1024 * 1024, ge=1024)
    secrets: tuple[Secret, ...] = ()

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

    @field_validator("secrets", mode="before")
    @classmethod
    def _as_secrets(cls, value: Any) -> tuple[Any, ...]:
        if isinstance(value, Mapping):
            value = [
                item if isinstance(item, Secret) else {"host": host, "headers": item}
                for host, item in value.items()
            ]
        items = tuple(value)
        if len(items) > MAX_SECRETS:
            raise ValueError(f"at most {MAX_SECRETS} secret hosts")
        return items

    @model_validator(mode="after")
    def _secret_hosts_allowed(self) -> NetworkPolicy:
        allow, deny = parse_rules(self.allow), parse_rules(self.deny)
        seen: set[str] = set()
        for secret in self.secrets:
            if secret.target in seen:
                raise ValueError(f"two secrets for {secret.target}: give its headers in one")
            seen.add(secret.target)
            verdict = decide(secret.host, None, secret.port, allow, deny)
            if not verdict.allowed:
                raise ValueError(
                    f"a secret for {secret.target}, which the rules refuse ({verdict.rule}): allow the "
                    "host, or drop its secret"
                )
        return self

    def secret_for(self, host: str, port: int) -> Secret | None:
        return next((s for s in self.secrets if s.host == host and s.port == port), None)

    def gateway_message(self) -> dict[str, Any]:
        """The rules, bounds and secrets as the gateway process takes them (values revealed: for the
        control channel to the gateway only)."""
        return {
            "allow": list(self.allow),
            "deny": list(self.deny),
            "limits": {"max_connections": self.max_connections, "rate_bytes": self.bytes_per_second},
            "secrets": [secret.gateway_message() for secret in self.secrets],
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
    secret: bool = Field(False, description="The gateway added the host's secret headers to its request.")


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

    def refusals(self, limit: int = 20) -> list[str]:
        """One line per refused connection (at most `limit`), naming the rule: what a reader of text
        only (a model, a terminal) is told, since the code's own error often says only "Forbidden"."""
        return [
            f"[network: {c.host}:{c.port} refused by {c.rule}{f' ({c.reason})' if c.reason else ''}]"
            for c in self.refused[:limit]
        ]
