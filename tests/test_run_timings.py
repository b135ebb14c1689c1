"""The runner reports how long a run's code ran and how long the runner spent on the run
(`RunnerSession.exec_seconds`, `runner_seconds`): what `bench latency` splits the locked run with.

Orderings only, no speed asserted: a sleep lasts at least its time, the code's time is within the
runner's, and the runner's within the parent's wall time of the run (`result.duration`).
"""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes import HostExecutor

pytestmark = pytest.mark.anyio

SLEEP = 0.2


async def test_a_sleeping_run_reports_its_sleep_within_the_runner_and_the_wall_time() -> None:
    async with HostExecutor(timeout=10) as ex:
        result = await ex.run(f"import time\ntime.sleep({SLEEP})")
        session: Any = ex.session
        assert result.ok, result.error
        assert SLEEP <= session.exec_seconds <= session.runner_seconds < result.duration
        quick = await ex.run("x = 1")
        assert quick.ok and 0 <= session.exec_seconds < SLEEP  # this run's figure, not the last one's
        assert session.exec_seconds <= session.runner_seconds < quick.duration


async def test_a_run_that_raises_or_answers_reports_its_time_too() -> None:
    async with HostExecutor(timeout=10) as ex:
        session: Any = ex.session
        raising = await ex.run(f"import time\ntime.sleep({SLEEP})\n1 / 0")
        assert raising.error is not None and raising.error.type == "ZeroDivisionError"
        assert SLEEP <= session.exec_seconds <= session.runner_seconds < raising.duration
        answering = await ex.run(f"import time\ntime.sleep({SLEEP})\nfinal_answer(1)")
        assert answering.has_final_answer and answering.final_answer == 1
        assert SLEEP <= session.exec_seconds <= session.runner_seconds < answering.duration
