"""Branching from one sandbox state (`kodeagent.branching`): n candidates on n forks, one kept.

Real host executors throughout: the forks are real runner processes, found in /proc by the session's
private user (a session and its forks share it; nothing else runs as it). A CodeAct run drives the
state once, with the LLM stand-in as its model.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator

import pytest
from support.llm_standin import StandinLLM, code_final, code_step, collect

from kodeagent import (
    BranchError,
    CodeActAgent,
    Observer,
    StepRecord,
    adopt_branch,
    best_of,
    first_success,
    observer_rank,
)
from sandboxes import Executor, ExecutorState, open_executor

pytestmark = pytest.mark.anyio

# Waits for a file that only the winning candidate writes, in its own fork's working directory: it
# never appears in this fork's, so this candidate can only end by being cancelled (or timing out).
WAITS_FOREVER = (
    "loser_waiting = True\n"
    "open('waiting.txt', 'w').write('w')\n"
    "import time\n"
    "while True:\n"
    "    try:\n"
    "        open('winner.txt').read()\n"
    "        break\n"
    "    except OSError:\n"
    "        time.sleep(0.02)\n"
    "print('saw the winner file')\n"
)
FAILS = "loser_failed = True\nopen('failed.txt', 'w').write('f')\n1 / 0\n"
WINS = "winner = base + 1\nopen('winner.txt', 'w').write('won')\nprint(winner)\n"


def runners_of(uid: int) -> list[int]:
    """Live processes of `uid` (zombies, already dead, are not counted)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as handle:
                status = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith("Z"):
            found.append(int(name))
    return sorted(found)


def runner(executor: Executor) -> int:
    tree = executor.session.worker.process_tree()  # type: ignore[union-attr]
    assert tree is not None
    return int(tree.pid)


def settle(uid: int, expected: list[int], within: float = 10.0) -> list[int]:
    """The live runners of `uid` once they are `expected` (a killed runner is reaped by its init, not
    by us), or what they were when `within` ran out."""
    deadline = time.monotonic() + within
    while (found := runners_of(uid)) != sorted(expected) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


@pytest.fixture
async def parent() -> AsyncIterator[Executor]:
    async with open_executor("host", timeout=30) as executor:
        setup = await executor.run("base = 41\nopen('shared.txt', 'w').write('from the parent')")
        assert setup.ok, setup.error
        yield executor


def uid_of(executor: Executor) -> int:
    uid = executor.session.worker.uid  # type: ignore[union-attr]
    assert isinstance(uid, int)
    return uid


async def test_first_success_keeps_the_winner_alone_and_closes_the_rest(parent: Executor) -> None:
    uid = uid_of(parent)
    assert settle(uid, [runner(parent)]) == [runner(parent)]
    branch = await first_success(parent, [FAILS, WAITS_FOREVER, WINS])
    kept = branch.executor
    try:
        assert branch.index == 2 and branch.code == WINS and branch.result.stdout == "42\n"
        failed, waiting, won = branch.results
        # the failing one ran as fast as the winner: finished first (its error) or cancelled
        assert failed is None or (failed.error is not None and failed.error.type == "ZeroDivisionError")
        assert waiting is None  # cancelled when the winner came in: it never saw the winner's file
        assert won is branch.result
        # only the parent and the kept fork run as the session's user: the two losers are gone
        assert settle(uid, [runner(parent), runner(kept)]) == sorted([runner(parent), runner(kept)])
        assert kept.state is ExecutorState.OPEN

        seen = await kept.run(
            "print(base, winner, open('shared.txt').read(), open('winner.txt').read())\n"
            "try:\n    loser_failed\n    print('visible loser_failed')\nexcept NameError:\n    pass\n"
            "try:\n    loser_waiting\n    print('visible loser_waiting')\nexcept NameError:\n    pass\n"
            "for path in ('failed.txt', 'waiting.txt'):\n"
            "    try:\n"
            "        open(path)\n"
            "        print('visible', path)\n"
            "    except OSError:\n"
            "        pass\n",
        )
        assert seen.ok, seen.error
        assert seen.stdout == "41 42 from the parent won\n"  # nothing of the losers' is in the kept one
    finally:
        await kept.close()

    untouched = await parent.run(
        "print(base, open('shared.txt').read())\n"
        "try:\n    winner\n    print('winner leaked')\nexcept NameError:\n    pass\n"
        "for path in ('winner.txt', 'failed.txt', 'waiting.txt'):\n"
        "    try:\n        open(path)\n        print('leaked', path)\n    except OSError:\n        pass\n"
    )
    assert untouched.ok and untouched.stdout == "41 from the parent\n", (untouched.stdout, untouched.error)
    assert not untouched.state_lost
    assert settle(uid, [runner(parent)]) == [runner(parent)]


async def test_first_success_counts_what_the_caller_calls_success(parent: Executor) -> None:
    branch = await first_success(
        parent, ["print('no')", "print('yes')"], succeeded=lambda r: r.ok and r.stdout == "yes\n"
    )
    async with branch.executor:
        assert branch.index == 1


async def test_a_failing_success_check_is_raised_as_itself_and_closes_every_fork(parent: Executor) -> None:
    uid = uid_of(parent)

    def broken(result: object) -> bool:
        raise LookupError("the check broke")

    with pytest.raises(LookupError, match="the check broke"):  # itself, not an exception group
        await first_success(parent, ["a = 1", "b = 2"], succeeded=broken)
    assert settle(uid, [runner(parent)]) == [runner(parent)]
    assert (await parent.run("print(base)")).stdout == "41\n"


async def test_no_success_raises_with_every_result_and_leaves_no_fork(parent: Executor) -> None:
    uid = uid_of(parent)
    with pytest.raises(BranchError, match="none of the 2 candidates succeeded") as caught:
        await first_success(parent, [FAILS, "undefined_name"])
    errors = [r.error.type if r is not None and r.error else None for r in caught.value.results]
    assert errors == ["ZeroDivisionError", "NameError"]
    assert settle(uid, [runner(parent)]) == [runner(parent)]
    after = await parent.run("print(base)\ntry:\n    loser_failed\nexcept NameError:\n    print('clean')")
    assert after.stdout == "41\nclean\n"


async def test_best_of_runs_all_and_keeps_the_best_ranked(parent: Executor) -> None:
    uid = uid_of(parent)
    candidates = ["small = base - 40\nprint(small)", "big = base * 10\nprint(big)", FAILS]
    # by default a success ranks 1 and the earliest wins the tie
    first = await best_of(parent, candidates)
    async with first.executor:
        assert first.index == 0 and first.scores == [1.0, 1.0, 0.0]
        assert [r.ok for r in first.results if r is not None] == [True, True, False]
    # a rank of the caller's: the largest number printed
    biggest = await best_of(parent, candidates, rank=lambda code, r: float(r.stdout or "nan"))
    async with biggest.executor:
        assert biggest.index == 1 and biggest.result.stdout == "410\n"
        seen = await biggest.executor.run(
            "print(big)\ntry:\n    small\nexcept NameError:\n    print('only big')"
        )
        assert seen.stdout == "410\nonly big\n"
    assert settle(uid, [runner(parent)]) == [runner(parent)]


async def test_best_of_with_an_async_rank_that_fails_closes_every_fork(parent: Executor) -> None:
    uid = uid_of(parent)

    async def rank(code: str, result: object) -> float:
        raise RuntimeError("the ranker broke")

    with pytest.raises(RuntimeError, match="the ranker broke"):
        await best_of(parent, ["a = 1", "b = 2"], rank=rank)
    assert settle(uid, [runner(parent)]) == [runner(parent)]
    assert (await parent.run("print(base)")).stdout == "41\n"


async def test_observer_rank_prefers_a_step_the_observer_has_no_note_on(parent: Executor) -> None:
    observer = Observer(repeat_threshold=3)
    again = "print(base)"
    for index in (1, 2):  # the run has already taken this step twice
        assert observer.observe(StepRecord(index=index, code=again, observation="41"), 10) is None
    candidates = [again, "print(base + 1)", FAILS]
    branch = await best_of(parent, candidates, rank=observer_rank(observer))
    async with branch.executor:
        # the repeat succeeds too, but a third identical step is a loop to the observer
        assert branch.scores == [1.0, 2.0, 0.0] and branch.index == 1
    assert len(observer.notes) == 0  # the run's own observer saw nothing of the ranking


async def test_bad_candidate_lists_are_refused_before_any_fork(parent: Executor) -> None:
    uid = uid_of(parent)
    with pytest.raises(ValueError, match="candidates is empty"):
        await first_success(parent, [])
    with pytest.raises(TypeError, match="not one string"):
        await best_of(parent, "print(1)")
    with pytest.raises(TypeError, match="candidate 1 is a int"):
        await first_success(parent, ["print(1)", 2])  # type: ignore[list-item]
    assert runners_of(uid) == [runner(parent)]


async def test_a_codeact_run_goes_on_from_the_branch_it_kept(llm: StandinLLM) -> None:
    """Step 1 loads data; between steps, three candidate next steps run on three forks of the run's
    session, and the run adopts the first that succeeds; step 2 sees the winner's variables only."""
    step2 = (
        "print(best)\n"
        "try:\n    loser_failed\n    print('loser seen')\nexcept NameError:\n    print('no loser')"
    )
    llm.add(
        code_step("data = [3, 1, 2]\nprint(len(data))"),
        code_step(step2),
        code_final("[1, 2, 3]"),
    )
    agent = CodeActAgent(
        llm.model("json"),
        litellm_params=llm.params(),
        run_env="host",
        allowed_imports=["time"],
        timeout=20,
    )
    agent.retry_base_delay = 0.01
    candidates = [
        "loser_failed = True\nprint(data[5])",
        "loser_waiting = True\nimport time\ntime.sleep(60)",
        "best = sorted(data)\nprint('sorted')",
    ]
    executors: dict[str, Executor] = {}
    uids: list[int] = []

    async def on_step(record: StepRecord) -> None:
        run = agent.last_run
        if record.index != 1 or run is None or run.executor is None:
            return
        executors["original"] = run.executor
        uids.append(uid_of(run.executor))
        branch = await first_success(run.executor, candidates)
        executors["kept"] = branch.executor
        await adopt_branch(run, branch)

    agent.on_step = on_step
    responses = await collect(agent.run("Sort the data."))
    final = responses[-1]
    assert final.type == "final" and final.value == "[1, 2, 3]"
    assert llm.remaining == 0
    steps = agent.steps
    assert [s.index for s in steps[:2]] == [1, 2]
    assert steps[1].observation is not None and "[1, 2, 3]" in steps[1].observation
    assert "no loser" in steps[1].observation and "loser seen" not in steps[1].observation
    # the model was told which candidate was kept, with its code and output, before step 2
    asked = "\n".join(str(m.get("content")) for m in llm.requests[1]["messages"])
    assert "Candidate 3 of 3" in asked and "best = sorted(data)" in asked and "sorted" in asked
    # the run's first session was closed when the branch was adopted; the kept one when the run ended
    assert executors["original"].state is ExecutorState.CLOSED
    assert executors["kept"].state is ExecutorState.CLOSED
    assert settle(uids[0], []) == []  # no runner of the session's family is left
