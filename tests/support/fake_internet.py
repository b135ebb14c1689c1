"""A fake internet on this machine, for the egress gateway's tests: nothing leaves the machine.

Two network namespaces the test makes (root only) and joins with a veth pair:

- ``host`` (``198.18.0.1``): where the gateway connects from, standing for this machine. It runs a
  "host service" on port 80 of its own addresses (loopback and ``198.18.0.1``): what a session
  must never reach.
- ``net`` (``198.18.0.2``): the internet. Its servers answer on port 80 of every address it has:
  ``203.0.113.10`` (public, ``public.test``), ``203.0.113.66`` (public, ``denied.test``),
  ``10.9.0.5`` (a private service), ``169.254.169.254`` (the metadata address); a DNS server on
  ``203.0.113.53`` (``rebind.test`` resolves to the private service, ``metadata.test`` to the
  metadata address, ``mixed.test`` to both the private service and the public server).

The internet's servers also speak HTTPS on port 443 with a certificate for every name of the zone
from a test authority (`FakeInternet.ca_file`; `gateway_through` makes the gateway verify with it),
and log every header they received: where a secret arrived, and where it did not.

``203.0.113.0/24`` and ``198.18.0.0/24`` are declared public for the gateway (they are reserved
ranges, so nothing real is ever reached), so ``198.18.0.1`` is a public address that is this
machine's own. Every server appends what reached it to its log: the proof of what did not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("fake_internet_server.py")
PUBLIC, DENIED, PRIVATE, METADATA, DNS = (
    "203.0.113.10",
    "203.0.113.66",
    "10.9.0.5",
    "169.254.169.254",
    "203.0.113.53",
)
HOST_OWN = "198.18.0.1"
ZONE = {
    "public.test": [PUBLIC],
    "denied.test": [DENIED],
    "rebind.test": [PRIVATE],
    "metadata.test": [METADATA],
    "mixed.test": [PRIVATE, PUBLIC],
    "secret.test": [PUBLIC],
    "other.test": [PUBLIC],
    "unverified.test": [PUBLIC],  # not in the HTTPS servers' certificate
}


def unavailable() -> str | None:
    """Why the fake internet cannot be built here, or None."""
    if os.geteuid() != 0:
        return "the fake internet needs root (network namespaces and veth pairs)"
    if shutil.which("ip") is None:
        return "the fake internet needs iproute2's `ip` (apt-get install iproute2)"
    return None


@dataclass
class FakeInternet:
    host_ns: str
    net_ns: str
    logs: Path

    @property
    def ca_file(self) -> str:
        """The test authority the HTTPS servers' certificate is from (PEM)."""
        return str(self.logs / "ca.pem")

    @property
    def host_netns_path(self) -> str:
        return f"/run/netns/{self.host_ns}"

    def hits(self, where: str) -> list[dict[str, str]]:
        """Requests that reached the servers of `where` (``net`` or ``host``)."""
        path = self.logs / f"{where}.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def hits_at(self, address: str) -> list[dict[str, str]]:
        return [h for h in self.hits("net") + self.hits("host") if h["at"] == address]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def _in(ns: str, *args: str) -> None:
    _ip("netns", "exec", ns, *args)


def _server(ns: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-I", str(SERVER), str(log), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError("a fake internet server did not start")
    return process


@contextmanager
def fake_internet() -> Iterator[FakeInternet]:
    tag = f"ka{os.getpid() % 100000}"
    host_ns, net_ns = f"{tag}-host", f"{tag}-net"
    logs = Path(tempfile.mkdtemp(prefix="kodeagent-fake-internet-"))
    servers: list[subprocess.Popen[str]] = []
    try:
        _ip("netns", "add", host_ns)
        _ip("netns", "add", net_ns)
        _ip("-n", host_ns, "link", "add", "veth-h", "type", "veth", "peer", "name", "veth-n", "netns", net_ns)
        for ns, dev, address in ((host_ns, "veth-h", HOST_OWN), (net_ns, "veth-n", "198.18.0.2")):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        for address in (PUBLIC, DENIED, PRIVATE, METADATA, DNS):
            _ip("-n", net_ns, "addr", "add", f"{address}/32", "dev", "lo")
        _ip("-n", host_ns, "route", "add", "default", "via", "198.18.0.2")
        chain = _test_authority(logs)
        servers.append(_server(net_ns, logs / "net.log", "--dns", DNS, json.dumps(ZONE), "--tls", str(chain)))
        servers.append(_server(host_ns, logs / "host.log"))
        yield FakeInternet(host_ns, net_ns, logs)
    finally:
        for server in servers:
            server.kill()
            server.wait(timeout=10)
        for ns in (host_ns, net_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        shutil.rmtree(logs, ignore_errors=True)


def _test_authority(logs: Path) -> Path:
    """A test CA (``ca.pem``) and a certificate from it for every name of the zone (``server.pem``,
    chain and key): what the fake internet's HTTPS servers present."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake internet test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "public.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in ZONE if name != "unverified.test"]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (logs / "ca.pem").write_bytes(ca.public_bytes(pem))
    chain = logs / "server.pem"
    chain.write_bytes(
        leaf.public_bytes(pem)
        + ca.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return chain


TEST_PUBLIC_RANGES = ("203.0.113.0/24", "198.18.0.0/24")
"""The fake internet's ranges, declared public to the gateway for the tests only."""


@contextmanager
def gateway_through(net: FakeInternet, **settings: Any) -> Iterator[FakeInternet]:
    """The egress gateway pointed at `net` (its outbound side and its resolver) while inside, with
    any further `GatewaySettings` fields; the default settings again on leaving."""
    from sandboxes.egress import service

    settings.setdefault("upstream_ca", net.ca_file)
    service.configure(
        service.GatewaySettings(
            netns=net.host_netns_path, nameservers=((DNS, 53),), extra_public=TEST_PUBLIC_RANGES, **settings
        )
    )
    try:
        yield net
    finally:
        service.configure(service.GatewaySettings())
