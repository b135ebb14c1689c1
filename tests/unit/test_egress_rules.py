"""The egress rules (`sandboxes.egress.match`), the policy model, and the gateway's DNS and HTTP
parsers, on hostile input."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from pydantic import ValidationError

from sandboxes import Policy
from sandboxes.egress import dns
from sandboxes.egress.gateway import BadRequest, forward_head, parse_head, split_authority, split_url
from sandboxes.egress.match import RuleError, classify, decide, normal_host, parse_rule, parse_rules
from sandboxes.egress.policy import NetworkPolicy


def verdict(host: str, address: str | None, port: int = 443, allow=(), deny=(), local=()):
    return decide(
        host,
        None if address is None else ipaddress.ip_address(address),
        port,
        parse_rules(allow),
        parse_rules(deny),
        frozenset(ipaddress.ip_address(a) for a in local),
    )


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.20.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "cgnat"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "this-network"),
        ("224.0.0.1", "multicast"),
        ("255.255.255.255", "reserved"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00::1", "unique-local"),
        ("ff02::1", "multicast"),
        ("::ffff:10.0.0.1", "private"),
        ("64:ff9b::7f00:1", "loopback"),
        ("2002:a00:1::1", "private"),  # 6to4 of 10.0.0.1
        ("2001:db8::1", "reserved"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
    ],
)
def test_what_is_not_public_is_named(address: str, kind: str | None) -> None:
    assert classify(ipaddress.ip_address(address)) == kind


def test_this_machine_is_refused_even_at_a_public_address() -> None:
    refused = verdict("1.2.3.4", "1.2.3.4", local=["1.2.3.4"])
    assert not refused.allowed and refused.rule == "this-machine"
    assert verdict("1.2.3.4", "1.2.3.4", allow=["1.2.3.4/32"], local=["1.2.3.4"]).allowed


def test_domain_rules_never_lead_to_private_addresses() -> None:
    refused = verdict("api.example.com", "10.0.0.7", allow=["api.example.com"])
    assert not refused.allowed and refused.rule == "private"
    assert verdict("api.example.com", "10.0.0.7", allow=["10.0.0.0/8:443"]).allowed
    assert not verdict("api.example.com", "10.0.0.7", port=80, allow=["10.0.0.0/8:443"]).allowed


def test_wildcards_ports_and_deny_first() -> None:
    allow = ["*.pythonhosted.org", "pypi.org:443", "[2606:4700::/32]:443"]
    assert verdict("files.pythonhosted.org", "151.101.0.1", allow=allow).rule == "allow '*.pythonhosted.org'"
    assert verdict("pythonhosted.org", "151.101.0.1", allow=allow).rule == "not-allowed"
    assert verdict("evilpythonhosted.org", "151.101.0.1", allow=allow).rule == "not-allowed"
    assert verdict("pypi.org", "151.101.0.1", port=80, allow=allow).rule == "not-allowed"
    assert verdict("x.test", "2606:4700::1", allow=allow).allowed
    deny = verdict("files.pythonhosted.org", "151.101.0.1", allow=allow, deny=["files.pythonhosted.org"])
    assert deny.rule == "deny 'files.pythonhosted.org'"
    assert verdict("anything.test", "8.8.8.8").rule == "public"


@pytest.mark.parametrize(
    "rule",
    [
        "",
        "a..b",
        "-a.com",
        "exa mple.com",
        "10.0.0.0/33",
        "host:0",
        "host:70000",
        "2001:db8::/32:443",
        "*x.com",
    ],
)
def test_bad_rules_are_refused_with_the_shape_of_a_good_one(rule: str) -> None:
    with pytest.raises(RuleError):
        parse_rule(rule)
    with pytest.raises(ValidationError):
        NetworkPolicy(allow=[rule])


def test_hosts_are_normalised_or_refused() -> None:
    assert normal_host("PyPI.org.") == "pypi.org"
    assert normal_host("[::1]") == "::1"
    for bad in ("", "a" * 300, "a b", "x\x00y", "ex..ample", "é.com"):
        assert normal_host(bad) is None


def test_policy_network_takes_true_false_or_a_network_policy() -> None:
    assert Policy().network_policy is None
    assert Policy(network=True).network_policy == NetworkPolicy()
    rules = NetworkPolicy(allow=["pypi.org"])
    assert Policy(network=rules).network_policy is rules
    assert Policy(network=rules).runtime_config()["network"] is True


# ---------------------------------------------------------------------- the gateway's DNS client


def reply(ident: int, name: str, answers: bytes, count: int, flags: int = 0x8180) -> bytes:
    question = dns.encode_name(name) + struct.pack("!HH", 1, 1)
    return struct.pack("!HHHHHH", ident, flags, 1, count, 0, 0) + question + answers


def a_record(address: str, name: bytes = b"\xc0\x0c") -> bytes:
    return name + struct.pack("!HHIH", 1, 1, 60, 4) + ipaddress.IPv4Address(address).packed


def test_a_dns_reply_is_taken_only_for_its_query() -> None:
    good = reply(7, "x.test", a_record("1.2.3.4"), 1)
    assert dns.parse_reply(good, 7, "x.test", 1) == [ipaddress.IPv4Address("1.2.3.4")]
    with pytest.raises(dns.ResolveError):
        dns.parse_reply(good, 8, "x.test", 1)  # another id
    with pytest.raises(dns.ResolveError):
        dns.parse_reply(good, 7, "y.test", 1)  # another question
    with pytest.raises(dns.ResolveError):
        dns.parse_reply(reply(7, "x.test", b"", 0, flags=0x8183), 7, "x.test", 1)


@pytest.mark.parametrize(
    "answers",
    [
        b"\xc0\x30" + struct.pack("!HHIH", 1, 1, 60, 4) + b"\x01\x02\x03\x04",  # pointer forwards
        b"\xc0",  # cut inside a pointer
        b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 400) + b"\x01",  # rdata past the end
        b"\x3fabc",  # label past the end
        b"\x80abc",  # reserved label type
    ],
)
def test_malformed_dns_replies_are_errors_not_crashes(answers: bytes) -> None:
    with pytest.raises(dns.ResolveError):
        dns.parse_reply(reply(7, "x.test", answers, 1), 7, "x.test", 1)


def test_a_pointer_loop_ends() -> None:
    loop = reply(7, "x.test", b"", 1)
    looped = loop + b"\xc0" + bytes([len(loop)]) + struct.pack("!HHIH", 1, 1, 60, 4) + b"\x01\x02\x03\x04"
    with pytest.raises(dns.ResolveError):
        dns.parse_reply(looped, 7, "x.test", 1)


def test_answers_for_other_names_are_ignored() -> None:
    other = a_record("10.0.0.1", dns.encode_name("elsewhere.test"))
    assert dns.parse_reply(reply(7, "x.test", other + a_record("1.2.3.4"), 2), 7, "x.test", 1) == [
        ipaddress.IPv4Address("1.2.3.4")
    ]


# ---------------------------------------------------------------------- the gateway's HTTP parsing


def test_the_forwarded_head_drops_hop_by_hop_headers_and_keeps_the_urls_host() -> None:
    method, target, version, headers = parse_head(
        b"GET http://a.test:8080/p?q HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: x\r\n"
        b"Connection: X-Secret\r\nX-Secret: 1\r\nAccept: */*\r\n\r\n"
    )
    host, port, path = split_url(target)
    assert (host, port, path) == ("a.test", 8080, "/p?q")
    assert forward_head(method, path, version, host, port, headers) == (
        b"GET /p?q HTTP/1.1\r\nHost: a.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.parametrize("authority", ["", "a@b:1", "host", "[::1", "h:", "h:x", "h:0", "h:123456"])
def test_bad_destinations(authority: str) -> None:
    with pytest.raises(BadRequest):
        split_authority(authority, None)
