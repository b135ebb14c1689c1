"""The Observer's rules on recorded steps: loops, runs of failures, stalls, the last-steps warning."""

from __future__ import annotations

from typing import Any

from kodeagent import Observer, StepRecord, ToolCallRecord


def _step(
    i: int,
    *,
    action: str = "t",
    args: dict[str, Any] | None = None,
    error: str | None = None,
    observation: str = "",
) -> StepRecord:
    return StepRecord(
        index=i,
        action=action,
        tool_calls=[ToolCallRecord(name=action, args=args or {})],
        error=error,
        observation=observation or f"obs {i}",
    )


def test_observer_loop_of_identical_successful_actions() -> None:
    observer = Observer()
    notes = [observer.observe(_step(i, observation="same"), steps_left=10) for i in range(3)]
    assert notes[:2] == [None, None]
    assert notes[2] and "repeated the same action 3 times" in notes[2]


def test_observer_run_of_different_failures() -> None:
    observer = Observer()
    notes = [observer.observe(_step(i, action=f"t{i}", error="boom"), steps_left=10) for i in range(3)]
    assert notes[2] and "last 3 steps all failed" in notes[2]


def test_observer_stall_and_deadline() -> None:
    observer = Observer(stall_threshold=2)
    first = observer.observe(_step(0, action="a", observation="nothing"), steps_left=10)
    second = observer.observe(_step(1, action="b", observation="nothing"), steps_left=10)
    third = observer.observe(_step(2, action="c", observation="nothing"), steps_left=10)
    assert first is None and second is None
    assert third and "produced nothing new" in third
    fresh = Observer()
    assert fresh.observe(_step(0), steps_left=5) is None
    reminder = fresh.observe(_step(1, action="other"), steps_left=2)
    assert reminder and "2 step(s) remain" in reminder
    assert fresh.observe(_step(2, action="third"), steps_left=1) is None  # said once


def test_observer_ignores_healthy_progress() -> None:
    observer = Observer()
    assert all(observer.observe(_step(i, action=f"t{i}"), steps_left=10) is None for i in range(6))


def test_observer_warns_of_the_last_steps_even_while_a_loop_note_repeats() -> None:
    observer = Observer(repeat_threshold=2, warn_remaining=2)
    same = StepRecord(index=1, code="print(1)", observation="1")
    notes = [observer.observe(same.model_copy(update={"index": i}), steps_left=5 - i) for i in range(1, 5)]
    assert notes[0] is None
    assert notes[1] is not None and "repeated the same action" in notes[1]  # step 2: the loop
    assert (
        notes[2] is not None and "2 step(s) remain" in notes[2]
    )  # step 3: loop note not repeated, warning fires
    assert "repeated" not in notes[2] and notes[3] is None
