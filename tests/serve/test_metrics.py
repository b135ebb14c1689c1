"""The control plane's metrics through the unmodified `e2b` SDK (`Sandbox.get_metrics`) and E2B's list
form (``GET /sandboxes/metrics?sandbox_ids=...``): real figures of the session, read on this machine
from its processes and its home (a burner shows as CPU, an allocation as memory, a file as disk), and
nothing of another tenant's sandbox."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.served import Served

from sandboxes.adapters.serve.pause import stopped_processes

e2b = pytest.importorskip("e2b")
from e2b import Sandbox  # noqa: E402
from e2b.exceptions import NotFoundException, SandboxException  # noqa: E402

pytestmark = pytest.mark.e2b

MIB = 1024 * 1024


@pytest.fixture
def sandbox(served: Served) -> Iterator[Sandbox]:
    made = Sandbox.create(**served.sdk_options())
    yield made
    made.kill()


def control(served: Served, tenant: str = "alice") -> httpx.Client:
    return httpx.Client(base_url=served.url, headers={"X-API-KEY": served.keys[tenant]}, timeout=30)


def run(served: Served, sandbox: Sandbox, code: str) -> object:
    executor = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.executor
    return served.call(lambda: executor.run(code))


def session_cpu(executor: Any) -> float:
    """CPU seconds of the session's processes, read by this test from /proc."""
    total = 0
    for pid in stopped_processes(executor):
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ attacks


def test_another_tenants_sandbox_has_no_metrics(served: Served, sandbox: Sandbox) -> None:
    with pytest.raises((NotFoundException, SandboxException)):
        Sandbox.get_metrics(sandbox.sandbox_id, **served.sdk_options("bob"))
    with control(served, "bob") as bob:
        answer = bob.get("/sandboxes/metrics", params={"sandbox_ids": sandbox.sandbox_id})
        assert answer.status_code == 200 and answer.json() == {"sandboxes": {}}
        assert bob.get(f"/sandboxes/{sandbox.sandbox_id}/metrics").status_code == 404
    assert served.app.registry.get("alice", sandbox.sandbox_id).sandbox.meter is None  # never even read


@pytest.mark.parametrize(
    "params",
    [
        {"start": "yesterday"},
        {"end": "-1"},
        {"start": "9" * 40},
        {"start": "200", "end": "100"},
    ],
)
def test_bad_time_ranges_are_400(served: Served, sandbox: Sandbox, params: dict[str, str]) -> None:
    with control(served) as alice:
        assert alice.get(f"/sandboxes/{sandbox.sandbox_id}/metrics", params=params).status_code == 400


def test_the_list_form_is_bounded(served: Served, sandbox: Sandbox) -> None:
    with control(served) as alice:
        assert alice.get("/sandboxes/metrics").status_code == 400
        many = ",".join([sandbox.sandbox_id] * 101)
        assert alice.get("/sandboxes/metrics", params={"sandbox_ids": many}).status_code == 400
        huge = "x" * 10_000
        assert alice.get("/sandboxes/metrics", params={"sandbox_ids": huge}).status_code == 400


# ------------------------------------------------------------------ real figures


def test_metrics_show_the_sessions_cpu_memory_and_disk(served: Served, sandbox: Sandbox) -> None:
    (idle,) = sandbox.get_metrics()[-1:]
    assert idle.cpu_count >= 1 and idle.mem_total > idle.mem_used > 0 and idle.disk_total > 0

    sandbox.files.write("/home/user/blob.bin", b"\x01" * (3 * MIB))
    run(
        served, sandbox, "held = bytearray(64 * 1024 * 1024)\nfor i in range(0, len(held), 4096): held[i] = 1"
    )
    run(
        served,
        sandbox,
        "import subprocess, sys\nburner = subprocess.Popen([sys.executable, '-c', 'while True: pass'])",
    )
    executor = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.executor
    before = sandbox.get_metrics()[-1]
    ticks = session_cpu(executor)
    time.sleep(1.0)
    spent = session_cpu(executor) - ticks
    busy = sandbox.get_metrics()[-1]
    assert busy.disk_used >= idle.disk_used + 3 * MIB
    assert busy.mem_used >= idle.mem_used + 60 * MIB
    # However loaded this machine is, the figure is the CPU the session's processes really used
    # between the two readings (this test's own reading of them is inside that window).
    window = (busy.timestamp - before.timestamp).total_seconds()
    reported = busy.cpu_used_pct / 100 * busy.cpu_count * window
    assert spent > 0.05 and reported >= spent * 0.8, (reported, spent)

    run(served, sandbox, "burner.kill(); burner.wait(); del held")
    time.sleep(0.5)
    calm = sandbox.get_metrics()[-1]
    assert calm.cpu_used_pct < busy.cpu_used_pct
    assert calm.mem_used < busy.mem_used - 32 * MIB

    series = sandbox.get_metrics()
    assert len(series) >= 4  # each request kept a reading
    assert [m.timestamp for m in series] == sorted(m.timestamp for m in series)
    start = series[-1].timestamp
    assert all(m.timestamp >= start.replace(microsecond=0) for m in sandbox.get_metrics(start=start))


def test_the_list_form_gives_each_sandboxs_latest(served: Served, sandbox: Sandbox) -> None:
    other = Sandbox.create(**served.sdk_options())
    try:
        ids = f"{sandbox.sandbox_id},{other.sandbox_id},{sandbox.sandbox_id},nosuchsandbox"
        with control(served) as alice:
            answer = alice.get("/sandboxes/metrics", params={"sandbox_ids": ids}).json()
        assert set(answer["sandboxes"]) == {sandbox.sandbox_id, other.sandbox_id}
        from e2b.api.client.models import SandboxMetric

        for metric in answer["sandboxes"].values():
            parsed = SandboxMetric.from_dict(metric)  # the SDK's own model reads it
            assert parsed.mem_used > 0 and parsed.cpu_count >= 1
    finally:
        other.kill()
