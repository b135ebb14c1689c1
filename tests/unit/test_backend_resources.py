"""The backends' process-wide resources: the one warm-pool shape, and the owner that makes threads
lazily and runs the clean-ups (in order, once each where asked, and at interpreter exit)."""

from __future__ import annotations

import threading

import pytest

from sandboxes.backends.resources import BackendResources, WarmPool, fill


class Item:
    def __init__(self, name: str, alive: bool = True) -> None:
        self.name = name
        self.alive = alive

    def __repr__(self) -> str:
        return self.name


def _pool(discarded: list[Item], **options: object) -> WarmPool[str, Item]:
    return WarmPool(lambda item: item.alive, discarded.append, **options)  # type: ignore[arg-type]


def test_take_hands_out_live_items_and_discards_dead_ones_on_the_way() -> None:
    discarded: list[Item] = []
    pool = _pool(discarded)
    old, dead, new = Item("old"), Item("dead", alive=False), Item("new")
    for item in (old, dead, new):
        assert pool.put("k", item)
    assert pool.take("k") is new  # the newest first by default
    assert pool.take("k") is old and discarded == [dead]
    assert pool.take("k") is None and pool.take("other") is None
    fifo = _pool(discarded, oldest_first=True)
    fifo.put("k", old)
    fifo.put("k", new)
    assert fifo.take("k") is old


def test_max_keys_evicts_the_least_recently_wanted_and_refuses_its_late_items() -> None:
    pool = _pool([], max_keys=2)
    a, b = Item("a"), Item("b")
    assert pool.want("a") == [] and pool.put("a", a, only_wanted=True)
    assert pool.want("b") == [] and pool.put("b", b, only_wanted=True)
    pool.take("a")  # taking from "a" makes it the most recent: "b" goes next
    pool.put("a", a, only_wanted=True)
    assert pool.want("c") == [b]
    assert not pool.wanted("b") and not pool.put("b", Item("late"), only_wanted=True)
    assert pool.count("b") == 0 and pool.by_key() == {"a": [a], "c": []}


def test_put_respects_a_limit_and_drain_empties_every_key() -> None:
    pool = _pool([])
    assert pool.put("k", Item("1"), limit=1)
    assert not pool.put("k", Item("2"), limit=1)
    pool.put("j", Item("3"))
    assert sorted(map(repr, pool.drain())) == ["1", "3"]
    assert pool.idle() == [] and pool.count("k") == 0


def test_fill_tops_up_and_stops_at_the_first_item_it_cannot_make() -> None:
    pool = _pool([])
    made = iter([Item("1"), Item("2"), None, Item("never")])
    fill(pool, "k", 5, lambda: next(made))
    assert pool.count("k") == 2
    fill(pool, "k", 2, lambda: pytest.fail("a full pool makes nothing"))


def test_close_runs_clean_ups_last_first_past_a_failing_one_and_once_ones_once() -> None:
    owned = BackendResources("unit")
    ran: list[str] = []
    owned.on_close(lambda: ran.append("first"))

    @owned.on_close
    def broken() -> None:
        raise OSError("a clean-up that fails")

    owned.once_on_close(lambda: ran.append("once"))
    owned.close()
    owned.close()
    assert ran == ["once", "first", "first"]


def test_threads_are_made_on_first_use_named_and_made_again_after_close() -> None:
    owned = BackendResources("unit")
    owned.declare("pair", 2)
    names: set[str] = set()
    barrier = threading.Barrier(2, timeout=10)

    def meet() -> None:
        barrier.wait()  # needs two threads of the role at once
        names.add(threading.current_thread().name)

    for future in [owned.submit("pair", meet), owned.submit("pair", meet)]:
        future.result(timeout=10)
    assert len(names) == 2 and all(name.startswith("kodeagent-unit-pair") for name in names)
    owned.close()
    assert owned.submit("pair", lambda: 7).result(timeout=10) == 7
    owned.close()


def test_work_submitted_while_closing_is_refused() -> None:
    owned = BackendResources("unit")
    refused: list[str] = []

    def late() -> None:
        try:
            owned.submit("role", print)
        except RuntimeError as exc:
            refused.append(str(exc))

    owned.on_close(late)
    owned.close()
    assert refused and "being closed" in refused[0]
