"""The host pools' sizing (`sandboxes/backends/host/demand.py`): plain bookkeeping on a fake clock."""

from __future__ import annotations

from sandboxes.backends.host.demand import BASE_POOL, POOL_PER_CORE, Demand


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def demand(cores: int = 2, **options: object) -> tuple[Demand, Clock]:
    clock = Clock()
    return Demand(cores, clock=clock, shrink_after=5.0, **options), clock  # type: ignore[arg-type]


def test_one_caller_opening_in_turn_keeps_the_base_pool_and_one_spawner() -> None:
    sizing, clock = demand()
    for _ in range(20):
        token = sizing.begin()
        assert sizing.pool_size() == BASE_POOL and sizing.spawners() == 1
        sizing.end(token)
        clock.now += 0.01
    assert sizing.peak() == 1 and sizing.expires_in() is None


def test_a_burst_sizes_the_pool_to_its_peak_and_the_spawners_to_the_cores() -> None:
    sizing, clock = demand(cores=2)
    tokens = [sizing.begin() for _ in range(6)]
    assert sizing.pool_size() == 6 and sizing.spawners() == 2  # two cores: two spawners at most
    for token in tokens:
        sizing.end(token)
    clock.now += 1
    sizes = sizing.sizes()
    assert (sizes.in_flight, sizes.peak, sizes.pool_size, sizes.spawners) == (0, 6, 6, 2)


def test_the_pool_is_capped_at_four_per_core() -> None:
    sizing, _ = demand(cores=2)
    for _ in range(50):
        sizing.begin()
    assert sizing.max_pool == 2 * POOL_PER_CORE
    assert sizing.pool_size() == 2 * POOL_PER_CORE and sizing.spawners() == 2
    one, _ = demand(cores=1)
    for _ in range(50):
        one.begin()
    assert one.pool_size() == POOL_PER_CORE and one.spawners() == 1


def test_a_capacity_caps_the_pool_below_the_cores() -> None:
    sizing, _ = demand(cores=4, capacity=3)
    for _ in range(10):
        sizing.begin()
    assert sizing.max_pool == 3 and sizing.pool_size() == 3 and sizing.max_spawners == 4


def test_the_pool_shrinks_back_a_shrink_period_after_the_peak() -> None:
    sizing, clock = demand()
    tokens = [sizing.begin() for _ in range(8)]
    clock.now += 2.0  # the burst's opens take two seconds
    for token in tokens:
        sizing.end(token)
    clock.now += 4.9  # the peak was held until the end: remembered five seconds from there
    assert sizing.pool_size() == 8
    assert sizing.expires_in() is not None and abs(sizing.expires_in() - 0.1) < 1e-6  # type: ignore[operator]
    clock.now += 0.2
    assert sizing.pool_size() == BASE_POOL and sizing.spawners() == 1
    assert sizing.expires_in() is None


def test_a_lower_peak_later_outlives_the_higher_one_before_it() -> None:
    sizing, clock = demand()
    for token in [sizing.begin() for _ in range(8)]:
        sizing.end(token)
    clock.now += 3.0
    for token in [sizing.begin() for _ in range(4)]:
        sizing.end(token)
    clock.now += 2.5  # the peak of 8 is 5.5 s old, that of 4 is 2.5 s old
    assert sizing.peak() == 4 and sizing.pool_size() == 4
    clock.now += 3.0
    assert sizing.peak() == 0 and sizing.pool_size() == BASE_POOL


def test_opens_still_in_flight_hold_the_size() -> None:
    sizing, clock = demand()
    tokens = [sizing.begin() for _ in range(5)]
    clock.now += 20  # five sessions still starting (their first runs not ended) 20 s later
    assert sizing.pool_size() == 5
    assert sizing.expires_in() == 5.0  # held: the trimmer looks again after a shrink period
    sizing.end(tokens[0])
    clock.now += 6
    assert sizing.pool_size() == 4


def test_an_open_left_without_a_run_stops_counting_after_the_hold() -> None:
    sizing, clock = demand()
    tokens = [sizing.begin() for _ in range(6)]
    clock.now += 29
    assert sizing.sizes().in_flight == 6
    clock.now += 1  # 30 s: sessions opened and left idle are not starting any more
    assert sizing.sizes().in_flight == 0 and sizing.pool_size() == 6  # the peak, remembered a while
    clock.now += 5
    assert sizing.pool_size() == BASE_POOL and sizing.expires_in() is None
    for token in tokens:  # their first runs, much later: nothing counted twice or below zero
        sizing.end(token)
    assert sizing.sizes().in_flight == 0 and sizing.pool_size() == BASE_POOL


def test_the_fixed_sizing_of_before_ignores_the_load() -> None:
    sizing, _ = demand(cores=8, fixed=True)
    for _ in range(20):
        sizing.begin()
    assert sizing.pool_size() == BASE_POOL and sizing.spawners() == 1 and sizing.sizes().fixed


def test_an_open_ended_twice_or_unknown_counts_once() -> None:
    sizing, _ = demand()
    token = sizing.begin()
    sizing.end(token)
    sizing.end(token)
    sizing.end(12345)
    sizing.begin()
    assert sizing.sizes().in_flight == 1
