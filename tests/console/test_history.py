"""The console's ring buffers and rates (pure: no process, no clock)."""

from __future__ import annotations

import pytest

from equeue_spark.console.history import History, Rates


def test_points_come_back_oldest_first_and_the_ring_keeps_capacity_rounds() -> None:
    history = History(capacity=3)
    for i in range(5):
        history.append(1000 * (i + 1), {("topic_in", ("t",)): float(i)})
    points = history.points("topic_in", ["t"])
    assert points.times_ms == [3000, 4000, 5000]
    assert points.values == [2.0, 3.0, 4.0]
    assert history.points("topic_in", ["t"], since_ms=4000).values == [4.0]


def test_a_round_without_a_value_is_a_gap_not_a_zero() -> None:
    history = History(capacity=10)
    history.append(1, {("group_lag", ("g", "t")): 5.0})
    history.append(2, {})
    history.append(3, {("group_lag", ("g", "t")): 7.0})
    points = history.points("group_lag", ("g", "t"))
    assert points.times_ms == [1, 3]
    assert points.values == [5.0, 7.0]


def test_a_series_absent_for_a_whole_history_is_forgotten() -> None:
    history = History(capacity=2)
    history.append(1, {("topic_in", ("gone",)): 1.0, ("topic_in", ("kept",)): 1.0})
    history.append(2, {("topic_in", ("kept",)): 1.0})
    assert history.series("topic_in") == [("topic_in", ("gone",)), ("topic_in", ("kept",))]
    history.append(3, {("topic_in", ("kept",)): 1.0})
    assert history.series("topic_in") == [("topic_in", ("kept",))]
    assert history.points("topic_in", ["gone"]).values == []


def test_series_past_the_limit_are_counted_and_not_kept() -> None:
    history = History(capacity=4, max_series=2)
    history.append(1, {("topic_in", (name,)): 1.0 for name in "abc"})
    assert len(history.series()) == 2
    assert history.dropped == 1
    assert history.memory_bytes() == 8 * 4 * 3


def test_an_hour_at_five_seconds_is_720_slots() -> None:
    history = History(capacity=720)
    for i in range(800):
        history.append(i * 5000, {("replica_lag", ("a", "r1")): float(i)})
    points = history.points("replica_lag", ("a", "r1"))
    assert len(points.values) == 720
    assert points.values[0] == 80.0 and points.values[-1] == 799.0


@pytest.mark.parametrize("capacity, series", [(1, 10), (10, 0)])
def test_bad_sizes_are_refused(capacity: int, series: int) -> None:
    with pytest.raises(ValueError, match="at least"):
        History(capacity, series)


def test_rates_skip_restarts_and_counters_that_went_down() -> None:
    rates = Rates()
    assert rates.rate(("in", "b", "t", "0"), "i1", 100, 10.0) is None  # first sight
    assert rates.rate(("in", "b", "t", "0"), "i1", 150, 15.0) == 10.0
    assert rates.rate(("in", "b", "t", "0"), "i2", 160, 20.0) is None  # restarted
    assert rates.rate(("in", "b", "t", "0"), "i2", 100, 25.0) is None  # went down
    assert rates.rate(("in", "b", "t", "0"), "i2", 120, 27.0) == 10.0
    rates.forget_except([])
    assert rates.rate(("in", "b", "t", "0"), "i2", 130, 28.0) is None
