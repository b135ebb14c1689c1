"""The pure parts of usage measurement (`sandboxes/usage.py`): parsing /proc and cgroup text, and
turning E2B's metric samples into a run's figures."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest

from sandboxes.usage import (
    CLOCK_TICKS,
    CpuReading,
    cgroup_paths,
    make_usage,
    metrics_usage,
    parse_cpuacct_stat,
    parse_nspid,
    parse_stat,
    parse_status_kib,
    split_cpu,
)


def stat_line(name: str, utime: int, stime: int, cutime: int, cstime: int, start: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    fields = ["S", "7", "7", "7", "0", "-1", "0", "0", "0", "0", "0"]
    fields += [str(utime), str(stime), str(cutime), str(cstime), "20", "0", "1", "0", str(start), "0"]
    return f"4242 ({name}) " + " ".join(fields)


def test_stat_sums_own_and_reaped_children_time_even_with_a_hostile_command_name() -> None:
    text = stat_line("evil) S 1 (x", utime=30, stime=10, cutime=70, cstime=5, start=99)
    state, start, user, system, ppid = parse_stat(text)
    assert (state, start, ppid) == ("S", 99, 7)
    assert user == pytest.approx(100 / CLOCK_TICKS) and system == pytest.approx(15 / CLOCK_TICKS)


def test_status_figures_and_namespace_pids() -> None:
    status = "Name:\tpython3\nVmHWM:\t  204800 kB\nVmRSS:\t   1024 kB\nNSpid:\t31337\t5\n"
    assert parse_status_kib(status, "VmHWM") == 204800 * 1024
    assert parse_status_kib(status, "VmRSS") == 1024 * 1024
    assert parse_status_kib(status, "VmSwap") is None
    assert parse_status_kib("VmHWM:\t 8 kB", "VmHWM") == 8 * 1024  # first line, no newline after
    assert parse_status_kib("Name:\tVmHWM: 9 kB\nVmHWM:\t 7 kB\n", "VmHWM") == 7 * 1024  # a name
    assert parse_status_kib("VmHWMx:\t 5 kB\n", "VmHWM") is None
    assert parse_nspid(status) == [31337, 5]
    assert parse_nspid("Name:\tx\n") == []


def test_cgroup_v1_paths_and_cpuacct_stat() -> None:
    text = "12:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n0::/system.slice\n"
    paths = cgroup_paths(text)
    assert paths["cpuacct"] == paths["cpu"] == paths["memory"] == "/docker/abc"
    reading = parse_cpuacct_stat(f"user {3 * CLOCK_TICKS}\nsystem {CLOCK_TICKS}\n")
    assert (reading.user, reading.system) == (3.0, 1.0)


def test_an_exact_total_is_split_in_the_ticks_proportion() -> None:
    user, system = split_cpu(2.0, CpuReading(0.3, 0.1))
    assert (user, system) == (pytest.approx(1.5), pytest.approx(0.5))
    assert split_cpu(0.004, CpuReading(0.0, 0.0)) == (0.004, 0.0)  # under a tick: all of it user


def test_readings_never_go_backwards() -> None:
    assert CpuReading(1.0, 1.0).since(CpuReading(2.0, 0.5)) == (0.0, 0.5)


def sample(at: float, percent: float, memory: int, cores: int = 2) -> SimpleNamespace:
    stamp = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return SimpleNamespace(timestamp=stamp, cpu_used_pct=percent, cpu_count=cores, mem_used=memory)


def test_metrics_prorate_each_sample_over_the_part_of_its_interval_inside_the_run() -> None:
    base = 1_700_000_000.0
    samples = [sample(base + t, p, m) for t, p, m in [(0, 0, 10), (1, 50, 20), (2, 25, 300), (3, 0, 40)]]
    # Run from 0.5 to 2.5: half of (0, 1] at one core, all of (1, 2] at half a core, half of (2, 3] at none.
    usage = metrics_usage(samples, base + 0.5, base + 2.5, wall=2.0)
    assert usage.cpu_seconds == pytest.approx(0.5 * 1.0 + 1.0 * 0.5)
    assert usage.cpu_user_seconds is None and usage.cpu_system_seconds is None
    assert usage.peak_memory_bytes == 300  # the highest sample taken during the run
    assert (usage.peak_scope, usage.source, usage.exact) == (
        "session",
        "e2b-metrics",
        {"cpu": False, "peak_memory": False, "wall": True},
    )


def test_metrics_without_a_sample_in_the_run_say_so() -> None:
    base = 1_700_000_000.0
    usage = metrics_usage([sample(base, 90, 10)], base + 5, base + 6, wall=1.0)
    assert usage.cpu_seconds is None and usage.peak_memory_bytes is None
    assert usage.wall_seconds == 1.0


def test_make_usage_totals_and_exactness() -> None:
    usage = make_usage(0.25, 0.05, 1024, 0.5, "run", "proc", cpu_exact=True, peak_exact=True)
    assert usage.cpu_seconds == pytest.approx(0.3)
    assert usage.peak_scope == "run" and usage.exact == {"cpu": True, "peak_memory": True, "wall": True}
    assert make_usage(None, None, None, 0.1, "x", "proc", cpu_exact=True, peak_exact=True).cpu_seconds is None
