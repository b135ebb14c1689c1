"""E2B's network options (`allow_internet_access`, the `network` allow/deny lists) as our egress
policy (`Policy.network`): what maps is enforced by the egress gateway outside the sandbox; what does
not map is refused (400) rather than silently widened or narrowed.

E2B: everything is allowed unless `denyOut` says otherwise, and `allowOut` wins over `denyOut`.
Ours: `allow` empty means every public address, non-empty means only those; `deny` is checked first.
So E2B's usual "deny all, allow these" (``denyOut: ["0.0.0.0/0"]`` with `allowOut`) is our `allow`;
a `denyOut` without deny-all is our `deny`; an `allowOut` that would carve exceptions out of a
narrower `denyOut` has no equivalent and is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ...egress.policy import NetworkPolicy
from .errors import BadRequest

ALL_TRAFFIC = "0.0.0.0/0"
"""E2B's rule for every destination (`e2b.ALL_TRAFFIC`)."""
UNMAPPED = ("dnsServers", "egressProxy", "maskRequestHost", "httpsPorts", "rules")
"""Fields of E2B's network config this server has no equivalent for (refused when given a value)."""


def network_of(allow_internet_access: Any, network: Any, *, internet: bool) -> bool | NetworkPolicy:
    """The `Policy.network` for a create's options; `internet` is the server's own switch (off: no
    sandbox has internet, and a create asking for it is refused)."""
    if allow_internet_access is not None and not isinstance(allow_internet_access, bool):
        raise BadRequest("allow_internet_access must be true or false")
    if network is not None and not isinstance(network, dict):
        raise BadRequest("network must be an object (allowOut, denyOut)")
    rules = network or {}
    for name in UNMAPPED:
        if rules.get(name) not in (None, [], {}, False):
            raise BadRequest(
                f"network.{name} is not supported by this server (only allowOut and denyOut map onto "
                "its egress gateway); leave it out"
            )
    if allow_internet_access is None and not rules:
        return internet  # E2B's default (on), if the server gives internet at all
    allow = _rule_list(rules, "allowOut")
    deny = _rule_list(rules, "denyOut")
    wanted = allow_internet_access is not False
    if not wanted:
        if allow:
            raise BadRequest("allow_internet_access is false but network.allowOut names destinations")
        return False
    if ALL_TRAFFIC in deny:
        if not allow:
            return False
        if ALL_TRAFFIC in allow:
            allow = []
        policy = _policy(allow=allow, deny=[])
    elif allow and ALL_TRAFFIC not in allow:
        raise BadRequest(
            "network.allowOut without denyOut ['0.0.0.0/0'] has no equivalent here (E2B lets it win over "
            "a narrower denyOut); deny all traffic and list what is allowed instead"
        )
    else:
        policy = _policy(allow=[], deny=deny) if deny else True
    if not internet:
        raise BadRequest(
            "this server gives sandboxes no internet (its setting internet = false): create the sandbox "
            "with allow_internet_access=False"
        )
    return policy


def _rule_list(rules: dict[str, Any], name: str) -> list[str]:
    value = rules.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"network.{name} must be a list of strings (CIDR ranges, addresses or domains)")
    return list(value)


def _policy(*, allow: list[str], deny: list[str]) -> NetworkPolicy | bool:
    if not allow and not deny:
        return True
    try:
        return NetworkPolicy(allow=tuple(allow), deny=tuple(deny))
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]) for e in exc.errors())
        raise BadRequest(f"network rules not valid here: {problems}") from None
