"""The benchmarks' own parts, without running a benchmark: statistics, tables, result files, pass@k,
the HumanEval policy and corpora, answer grading. (Small real runs: `tests/test_benchmarks_smoke.py`.)"""

from __future__ import annotations

import collections
import io
import math

import pytest
from rich.console import Console

from benchmarks import common, floor, humaneval, latency, security
from benchmarks.humaneval_completions import LOOPS, generate


def quiet() -> Console:
    return Console(file=io.StringIO(), force_terminal=False, width=200)


def test_percentiles_and_summary() -> None:
    assert common.percentile([3, 1, 2], 50) == 2
    assert common.percentile([1, 2, 3, 4], 50) == 2.5
    assert common.percentile([float(i) for i in range(1, 101)], 95) == pytest.approx(95.05)
    assert math.isnan(common.percentile([], 50))
    stats = common.summarize([0.001, 0.002, 0.003])
    assert stats["n"] == 3 and stats["p50_ms"] == pytest.approx(2.0)


def test_plain_table_off_a_terminal() -> None:
    out = io.StringIO()
    common.print_table(
        Console(file=out, force_terminal=False, width=200), "T", ["a", "n"], [["x", 1], ["yy", 22]]
    )
    assert out.getvalue().splitlines() == ["T", "a    n", "--  --", "x    1", "yy  22"]


def test_pass_at_k_estimator() -> None:
    assert humaneval.pass_at_k(10, 0, 1) == 0.0
    assert humaneval.pass_at_k(10, 10, 5) == 1.0
    assert humaneval.pass_at_k(10, 5, 1) == pytest.approx(0.5)
    assert humaneval.pass_at_k(4, 1, 2) == pytest.approx(0.5)


def test_slot_seconds_split_by_verdict() -> None:
    def outcome(index: int, result: str, seconds: float) -> humaneval.Outcome:
        return humaneval.Outcome(f"HumanEval/{index}", 0, result == "passed", result, seconds)

    ours = [outcome(0, "passed", 0.1), outcome(1, "timed out", 3.0), outcome(2, "failed: x", 0.3)]
    theirs = [outcome(0, "passed", 0.4), outcome(1, "timed out", 4.0), outcome(2, "timed out", 3.1)]
    slots = humaneval.slot_summary(ours, concurrency=2, wall=3.0)
    assert slots["timed_out"] == {
        "count": 1,
        "slot_seconds": 3.0,
        "wall_seconds_at_concurrency": 1.5,
        "share_of_wall": 0.5,
    }
    assert slots["rest"]["count"] == 2 and slots["rest"]["slot_seconds"] == pytest.approx(0.4)
    assert slots["rest"]["per_program"]["max_ms"] == pytest.approx(300)
    assert humaneval.slot_summary(theirs, 2, 5.0)["timed_out"]["slot_seconds"] == pytest.approx(7.1)
    # the ratio pairs only programs neither side timed out: HumanEval/0 here
    rest = humaneval.rest_speedup(ours, theirs)
    assert rest["programs"] == 1 and rest["ratio"] == pytest.approx(4.0) and rest["target_met"]
    assert not humaneval.rest_speedup(theirs[:1], ours[:1])["target_met"]


def test_the_median_round_is_one_that_happened() -> None:
    # speed-ups 2x, 3x, 1.5x: the median is round 1's
    assert humaneval.median_round([2.0, 3.0, 1.5]) == 0
    # an even count takes the lower middle (2x of 1x, 2x, 3x, 4x), never an average of two rounds
    assert humaneval.median_round([2.0, 4.0, 3.0, 1.0]) == 0
    assert humaneval.median_round([3.0, 1.0, 2.0]) == 2


def test_rounds_summary_and_note() -> None:
    def outcomes(passed: int) -> list[humaneval.Outcome]:
        return [humaneval.Outcome(f"HumanEval/{i}", 0, i < passed, "passed", 0.01) for i in range(3)]

    sandbox = [(outcomes(3), 1.0), (outcomes(2), 0.5)]
    harness = [(outcomes(3), 2.0), (outcomes(3), 2.0)]
    summary = humaneval.rounds_summary(sandbox, harness)
    assert summary["count"] == 2 and summary["shown"] == 1  # 2x of 2x, 4x: the lower middle
    assert summary["sandbox_passed"] == [3, 2] and summary["speedups"] == [2.0, 4.0]
    assert (summary["speedup_min"], summary["speedup_max"]) == (2.0, 4.0)
    note = humaneval.rounds_note({"rounds": summary})
    assert "median of 2 alternating rounds" in note and "round 1" in note and "2.00x, 4.00x" in note
    # one round, or a result file from before rounds: the note says nothing more
    assert humaneval.rounds_note({"rounds": humaneval.rounds_summary(sandbox[:1], harness[:1])}) == ""
    assert humaneval.rounds_note({}) == ""
    alone = humaneval.rounds_summary(sandbox, [])
    # without a baseline: no speed-ups, and the round of the median sandbox wall (0.5 s of 1.0, 0.5)
    assert "speedups" not in alone and alone["shown"] == 2


def test_floors_of_several_rounds_show_the_median_round() -> None:
    def measured(rate: float, p50_ms: float) -> dict[str, object]:
        return {"programs": 100, "per_core_per_second": rate, "per_program": {"p50_ms": p50_ms}}

    rounds = [
        {"fork_exit": measured(120.0, 8.0), "fork_namespaces": measured(90.0, 11.0)},
        {"fork_exit": measured(210.0, 4.0)},  # a round whose namespaces floor was refused
        {"fork_exit": measured(150.0, 6.0), "fork_namespaces": measured(95.0, 10.0)},
    ]
    combined = floor.median_of(rounds)
    # a floor only some rounds have is left out rather than shown from fewer rounds
    assert list(combined) == ["fork_exit"]
    assert combined["fork_exit"]["per_core_per_second"] == 150.0  # the median round's, with its own p50
    assert combined["fork_exit"]["per_program"] == {"p50_ms": 6.0}
    assert combined["fork_exit"]["rounds_per_core"] == [120.0, 210.0, 150.0]
    # an even count shows the lower middle: a round that happened
    assert floor.median_of(rounds[:2])["fork_exit"]["per_core_per_second"] == 120.0
    assert floor.median_of([]) == {}
    (line,) = floor.notes(combined, 75.0)
    assert line.startswith(f"floor: {floor.LABELS['fork_exit']}: 150.0 programs/s per core (p50 ")
    assert "; the median of 3 rounds, 120.0-210.0)" in line and line.endswith("the sandbox at 50% of it")
    # one round: no spread; no side given: no share
    (single,) = floor.notes(rounds[0] | {"fork_namespaces": measured(0.0, 0.0)})
    assert single.endswith(")") and "median" not in single and "of it" not in single


def test_rounds_below_one_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        humaneval.run(rounds=0, console=quiet())


def test_policy_comes_from_trusted_parts_only() -> None:
    problems = humaneval.load_problems()
    assert "eval" in humaneval.policy_for(problems["HumanEval/160"]).allow_builtins
    assert humaneval.policy_for(problems["HumanEval/0"]).allow_builtins == ()
    assert "os" not in humaneval.policy_for(problems["HumanEval/0"]).allowed_imports


def test_latency_reports_a_missing_backend_module() -> None:
    rows, reason = latency.other_backend_rows("nosuchbackend", 1)
    assert rows == [] and reason and "latency_nosuchbackend" in reason


def test_corpus_is_well_formed() -> None:
    attacks, benign = security.load_corpus()
    classes = {a.attack_class for a in attacks}
    assert {
        "imports",
        "introspection",
        "files",
        "environment",
        "network",
        "processes",
        "resources",
        "forgery",
    } <= classes
    names = [(a.attack_class, a.name) for a in attacks]
    assert len(names) == len(set(names))
    assert len(benign) >= 10 and all(b.expected.endswith("\n") for b in benign)


def test_tool_answers_are_graded_by_value() -> None:
    from benchmarks import agent

    first = agent.TOOL_TASKS[0]
    assert agent.grade_tool_answer(first, f"It costs {first.answer:.2f} EUR.")
    assert agent.grade_tool_answer(first, first.answer)
    assert not agent.grade_tool_answer(first, "It costs 27.00 EUR.")
    listed = agent.TOOL_TASKS[7]
    assert agent.grade_tool_answer(listed, listed.answer.upper())
    assert not agent.grade_tool_answer(listed, "eggplant, apple, banana")


def test_corpus_covers_every_kind_of_behaviour() -> None:
    """The generated corpus is what the agreement test claims it is (and is reproducible)."""
    problems = humaneval.load_problems()
    samples = generate(problems, count=1200, seed=0)
    assert samples == generate(problems, count=1200, seed=0)
    kinds = collections.Counter(s["kind"].split("/")[0] for s in samples)
    assert sum(kinds[k] for k in LOOPS) == 48  # 4 %
    for family in (
        "plain",
        "imports-used",
        "imports-unused",
        "stderr-print",
        "print-megabytes",
        "exit",
        "sys-exit",
        "os-exit",
        "raise-systemexit",
        "recursion-error",
        "setrecursionlimit",
        "tempfile",
        "environ",
        "os-system",
        "subprocess-popen",
        "os-getcwd",
        "str-raises",
    ):
        assert kinds[family] > 0, family
    assert len({s["task_id"] for s in samples}) == 164


def test_fork_sizes_option_parses_and_refuses() -> None:
    from benchmarks import forking

    assert latency.parse_fork_sizes("1MB,100MB,1GB") == forking.SIZES
    assert latency.parse_fork_sizes("512KB, 2 GiB") == (512 * 1024, 2 * 1024 * forking.MB)
    assert latency.parse_fork_sizes("none") == () and latency.parse_fork_sizes("") == ()
    with pytest.raises(ValueError, match="not a size"):
        latency.parse_fork_sizes("lots")
    with pytest.raises(ValueError, match="smaller than one"):
        forking.parse_size("1KB")


def test_fork_state_code_and_repetitions() -> None:
    from benchmarks import forking

    namespace: dict[str, object] = {}
    exec(forking.build_code(2 * forking.MB).replace("print(len(state))", ""), namespace)  # noqa: S102
    state = namespace["state"]
    assert isinstance(state, list) and sum(map(len, state)) == forking.state_bytes(2 * forking.MB)
    assert len(set(state)) == len(state)  # distinct chunks: no page is shared by construction
    assert forking.size_label(forking.MB) == "1 MB" and forking.size_label(1024 * forking.MB) == "1 GB"
    assert latency.fork_repetitions(20) == {"n": 20, "rebuild_n": 10, "big_n": 5, "big_rebuild_n": 3}
    assert latency.fork_repetitions(1) == {"n": 1, "rebuild_n": 1, "big_n": 1, "big_rebuild_n": 1}
