"""Egress rules: parsing rule strings and deciding one connection (standard library only).

A rule is a string: a domain (``pypi.org``), a wildcard domain (``*.pythonhosted.org``: any name
below it, not the name itself), ``*`` (any name or public address), or an address range
(``10.0.0.0/8``, ``192.0.2.7``, ``[2001:db8::/32]``), each optionally with ``:PORT`` or
``:LOW-HIGH``. The decision for a connection to `host` (the name the code asked for, or an address
literal) at `address` (where the gateway will connect: its own DNS answer) and `port`:

1. a matching ``deny`` rule refuses (``deny 'RULE'``);
2. an address that is not on the public internet (loopback, private, CGNAT, link-local with the
   metadata address, unique-local, multicast, reserved) or is one of this machine's own is refused
   unless an ``allow`` rule that is an *address range* contains it: a domain rule never lets a name
   lead to a private address (no DNS rebinding);
3. with no ``allow`` rules, any public destination is allowed (``public``); else the first matching
   ``allow`` rule allows it, and nothing matching is refused (``not-allowed``).

Every refusal names the rule that made it; the proxy's HTTP answer and the run's report carry it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_RULES = 256
MAX_RULE_CHARS = 300
MAX_HOST_CHARS = 253

_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_PORTS = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")

NOT_PUBLIC: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this-network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "cgnat"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),  # with the cloud metadata address, 169.254.169.254
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "reserved"),
    ("192.0.2.0/24", "reserved"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "reserved"),
    ("198.51.100.0/24", "reserved"),
    ("203.0.113.0/24", "reserved"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("::/128", "this-network"),
    ("::1/128", "loopback"),
    ("fe80::/10", "link-local"),
    ("fc00::/7", "unique-local"),
    ("ff00::/8", "multicast"),
    ("fec0::/10", "reserved"),
)
"""Named ranges for refusals; an address outside them that Python does not call global is
``reserved``."""
_NOT_PUBLIC = tuple((ipaddress.ip_network(net), name) for net, name in NOT_PUBLIC)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class RuleError(ValueError):
    """A rule string that cannot be parsed; the message says what a rule looks like."""


@dataclass(frozen=True)
class Rule:
    """One parsed rule: a name pattern or an address range, and a port range."""

    text: str
    domain: str | None  # "example.com", "*.example.com" or "*"; None for an address range
    network: IPNetwork | None
    ports: tuple[int, int] = (1, 65535)

    def matches(self, host: str, address: IPAddress | None, port: int) -> bool:
        if not self.ports[0] <= port <= self.ports[1]:
            return False
        if self.network is not None:
            return address is not None and address.version == self.network.version and address in self.network
        assert self.domain is not None
        if self.domain == "*":
            return True
        if self.domain.startswith("*."):
            return host.endswith(self.domain[1:]) and len(host) > len(self.domain) - 1
        return host == self.domain


@dataclass(frozen=True)
class Verdict:
    """The decision on one connection: allowed or not, and the rule that decided it."""

    allowed: bool
    rule: str
    reason: str = ""


def parse_rule(text: str) -> Rule:
    """Parse one rule string (see the module docs); `RuleError` says what is wrong with it."""
    if not isinstance(text, str) or not text or len(text) > MAX_RULE_CHARS:
        raise RuleError(f"a rule is a non-empty string of at most {MAX_RULE_CHARS} characters")
    raw = text.strip().lower()
    body, ports = raw, (1, 65535)
    if raw.startswith("["):  # [v6 address or range]:port
        end = raw.find("]")
        if end < 0:
            raise RuleError(f"{text!r}: an IPv6 rule in brackets needs its closing ']'")
        body, rest = raw[1:end], raw[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise RuleError(f"{text!r}: after ']' only ':PORT' may follow")
            ports = _parse_ports(text, rest[1:])
    elif raw.count(":") == 1:
        body, port_text = raw.split(":")
        ports = _parse_ports(text, port_text)
    network = _parse_network(body)
    if network is not None:
        return Rule(text, None, network, ports)
    if raw.count(":") > 1 and not raw.startswith("["):
        raise RuleError(f"{text!r} is not an address range; write IPv6 with a port as '[2001:db8::/32]:443'")
    domain = body.rstrip(".")
    if domain != "*":
        labels = domain[2:] if domain.startswith("*.") else domain
        if not labels or not all(_LABEL.fullmatch(label) for label in labels.split(".")):
            raise RuleError(
                f"{text!r} is not a rule: use a domain ('pypi.org'), a wildcard ('*.pythonhosted.org'), "
                "'*', or an address range ('10.0.0.0/8'), each optionally with ':PORT' or ':LOW-HIGH'"
            )
    return Rule(text, domain, None, ports)


def _parse_ports(text: str, port_text: str) -> tuple[int, int]:
    found = _PORTS.fullmatch(port_text)
    if found is None:
        raise RuleError(f"{text!r}: the port must be a number or LOW-HIGH")
    low = int(found.group(1))
    high = int(found.group(2) or low)
    if not 1 <= low <= high <= 65535:
        raise RuleError(f"{text!r}: ports go from 1 to 65535, low to high")
    return low, high


def _parse_network(body: str) -> IPNetwork | None:
    try:
        return ipaddress.ip_network(body, strict=False)
    except ValueError:
        return None


def parse_rules(texts: Iterable[str]) -> tuple[Rule, ...]:
    rules = tuple(parse_rule(text) for text in texts)
    if len(rules) > MAX_RULES:
        raise RuleError(f"at most {MAX_RULES} rules per list")
    return rules


def normal_host(host: str) -> str | None:
    """The host as rules see it (lower case, no trailing dot, brackets off an IPv6 literal), or None
    when it is neither a valid name nor an address literal."""
    if not isinstance(host, str) or not 0 < len(host) <= MAX_HOST_CHARS + 2:
        return None
    text = host.lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if literal(text) is not None:
        return text
    text = text.rstrip(".") if not text.endswith("..") else text
    if len(text) > MAX_HOST_CHARS or not all(_LABEL.fullmatch(label) for label in text.split(".")):
        return None
    return text


def literal(host: str) -> IPAddress | None:
    """The address `host` is written as (``1.2.3.4``, ``::1``), or None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def embedded_v4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64), which is what it reaches."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in net for net in _NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def classify(
    address: IPAddress,
    local: frozenset[IPAddress] = frozenset(),
    extra_public: Sequence[IPNetwork] = (),
) -> str | None:
    """None for a public address; else the name of what it is (``loopback``, ``private``,
    ``link-local``, ``this-machine``...). `extra_public`: ranges an operator declares public (a test's
    fake internet); `local`: this machine's own addresses, never public."""
    inner = embedded_v4(address)
    if inner is not None:
        kind = classify(inner, local, extra_public)
        if kind is not None:
            return kind
    named = None
    for net, name in _NOT_PUBLIC:
        if address.version == net.version and address in net:
            named = name
            break
    if named is None and (not address.is_global or address.is_multicast):
        named = "multicast" if address.is_multicast else "reserved"
    if named is not None and not any(address.version == n.version and address in n for n in extra_public):
        return named
    if address in local or (inner is not None and inner in local):
        return "this-machine"
    return None


def decide(
    host: str,
    address: IPAddress | None,
    port: int,
    allow: Sequence[Rule],
    deny: Sequence[Rule],
    local: frozenset[IPAddress] = frozenset(),
    extra_public: Sequence[IPNetwork] = (),
) -> Verdict:
    """Whether a connection to `host` at `address`, `port` may be made (see the module docs).

    `address` None: the name is not resolved yet; only the name rules are checked (the gateway
    decides again on each resolved address before it connects)."""
    for rule in deny:
        if rule.matches(host, address, port):
            return Verdict(False, f"deny '{rule.text}'", f"{host} port {port} matches the deny rule")
    if address is not None:
        kind = classify(address, local, extra_public)
        if kind is not None:
            for rule in allow:
                if rule.network is not None and rule.matches(host, address, port):
                    return Verdict(True, f"allow '{rule.text}'")
            what = "one of this machine's own addresses" if kind == "this-machine" else f"a {kind} address"
            return Verdict(
                False,
                kind,
                f"{address} is {what}, not the public internet; allow it explicitly with "
                f"an address range rule ('{address}/{address.max_prefixlen}') if the code must reach it",
            )
    if not allow:
        return Verdict(True, "public")
    for rule in allow:
        if rule.matches(host, address, port):
            return Verdict(True, f"allow '{rule.text}'")
    if address is None and any(rule.network is not None for rule in allow):
        return Verdict(True, "pending")  # an address rule may still allow what the name resolves to
    return Verdict(False, "not-allowed", f"no allow rule matches {host} port {port}")
