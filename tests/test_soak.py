"""A short soak (benchmarks/soak.py): hundreds of sessions with timeouts, crashes, memory-limit hits,
output floods and forks mixed in leave nothing behind once the pools are warm, and every result is
what it must be. The soak itself must see a leak when there is one.

Not a timing test: only counts are asserted (descriptors, threads, processes, memory, directories,
containers), against the allowances that `benchmarks.soak` documents.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import backend_docker

from benchmarks import soak
from sandboxes import open_executor

pytestmark = pytest.mark.anyio


def _explain(result: dict) -> str:
    rows = [soak.checkpoint_line(row) for row in result["checkpoints"]]
    grew = [v for v in result["verdicts"] if v["grew"]]
    return "\n".join([*rows, f"grew: {grew}", f"anomalies: {result['anomalies'][:5]}"])


async def test_300_host_sessions_leave_nothing_behind() -> None:
    result = await soak.soak("host", sessions=300, every=100, settle=0.5)
    assert result["kinds"] == {"plain": 225, "timeout": 15, "crash": 15, "oom": 15, "flood": 15, "fork": 15}
    assert result["anomaly_count"] == 0, _explain(result)
    assert result["grew"] == [], _explain(result)
    assert result["ok"]
    measured = {v["resource"] for v in result["verdicts"]}
    assert {"fds", "threads", "processes", "zombies", "rss_mb", "temp_dirs"} <= measured
    # The pools and the fork server are counted once warm: the readings are not all zero.
    warm = result["checkpoints"][1]
    assert warm["processes"] >= 1 and warm["temp_dirs"] >= 1, _explain(result)


async def test_the_soak_sees_sessions_that_are_never_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = []
    one_session = soak.one_session

    async def leaky(backend: str, index: int, options: dict | None = None) -> None:
        await one_session(backend, index, options)
        if index >= 40 and index % 5 == 0:  # after warm-up: 8 sessions left open, with their workers
            kept.append(await open_executor(backend, timeout=10).open())

    monkeypatch.setattr(soak, "one_session", leaky)
    try:
        result = await soak.soak("host", sessions=80, every=40, settle=0.5)
    finally:
        for executor in kept:
            await executor.close()
    assert len(kept) == 8
    assert result["anomaly_count"] == 0, _explain(result)
    assert {"fds", "processes", "temp_dirs"} <= set(result["grew"]), _explain(result)
    assert not result["ok"]


def test_bench_soak_through_the_cli(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kodeagent_cli", "bench", "soak", "--sessions", "40", "--every", "20"]
    done = subprocess.run(
        [*command, "--json", "--output", str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [c["sessions"] for c in data["checkpoints"]] == [0, 20, 40]
    assert data["ok"] and data["anomaly_count"] == 0 and data["sessions_per_s"] > 0
    assert json.loads((tmp_path / "s.json").read_text())["benchmark"] == "soak"
    # The sessions' private temporary directory was removed at exit, after the backends stopped.
    assert data["tempdir"] and not os.path.exists(data["tempdir"])
    bad = subprocess.run([*command[:-1], "30"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "at least twice --every" in bad.stdout


def test_growth_is_judged_after_warm_up_against_the_allowance() -> None:
    start = {"fds": 9, "rss_mb": 30.0}
    warm = {"fds": 20, "rss_mb": 40.0}
    within = soak.verdicts([start, warm, {"fds": 25, "rss_mb": 48.0}])
    assert [v["grew"] for v in within] == [False, False]  # start-up growth (9 -> 20) is not judged
    beyond = soak.verdicts([start, warm, {"fds": 26, "rss_mb": 48.1}])
    assert [v["grew"] for v in beyond] == [True, True]
    with pytest.raises(ValueError, match="warm-up"):
        soak.verdicts([start, warm])


@pytest.mark.docker
async def test_40_docker_sessions_leave_nothing_behind() -> None:
    backend_docker.require()
    from sandboxes.backends.docker.container import client

    # Pinned by id: other test processes here may move the tag to their checkout's runner meanwhile.
    image = client().images.get(backend_docker.IMAGE).id
    result = await soak.soak("docker", sessions=40, every=20, settle=2.0, options={"image": image})
    assert result["anomaly_count"] == 0, _explain(result)
    assert result["grew"] == [], _explain(result)
    assert result["checkpoints"][1]["containers"] is not None
