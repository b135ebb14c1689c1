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
        servers.append(_server(net_ns, logs / "net.log", "--dns", DNS, json.dumps(ZONE)))
        servers.append(_server(host_ns, logs / "host.log"))
        yield FakeInternet(host_ns, net_ns, logs)
    finally:
        for server in servers:
            server.kill()
            server.wait(timeout=10)
        for ns in (host_ns, net_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        shutil.rmtree(logs, ignore_errors=True)


TEST_PUBLIC_RANGES = ("203.0.113.0/24", "198.18.0.0/24")
"""The fake internet's ranges, declared public to the gateway for the tests only."""


@contextmanager
def gateway_through(net: FakeInternet, **settings: Any) -> Iterator[FakeInternet]:
    """The egress gateway pointed at `net` (its outbound side and its resolver) while inside, with
    any further `GatewaySettings` fields; the default settings again on leaving."""
    from sandboxes.egress import service

    service.configure(
        service.GatewaySettings(
            netns=net.host_netns_path, nameservers=((DNS, 53),), extra_public=TEST_PUBLIC_RANGES, **settings
        )
    )
    try:
        yield net
    finally:
        service.configure(service.GatewaySettings())
