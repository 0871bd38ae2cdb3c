"""The alarm state machine on hand-made snapshots with a fake clock (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from equeue_spark.console.alarms.engine import AlarmEngine, Transition
from equeue_spark.console.alarms.rules import Rule
from equeue_spark.console.snapshot import Snapshot

LAG = Rule(
    name="lag",
    type="group_lag",
    messages=10_000,
    for_s=30,
    resolve_for_s=30,
    hysteresis=0.1,
    repeat_s=3600,
)


def group(name: str, lag: int, topic: str = "orders", unreachable: bool = False) -> dict[str, Any]:
    return {
        "group": name,
        "topics": [{"topic": topic, "lag": lag, "lag_ms": 0}],
        "dlq_messages": 0,
        "dlq_resent": 0,
        "unreachable_brokers": ["b1"] if unreachable else [],
    }


def member(broker: str, state: str = "live", **stats: Any) -> dict[str, Any]:
    figures = {
        "total_backlog": 0,
        "disk_free_bytes": 50,
        "disk_size_bytes": 100,
        "delayed_next_due_ms": 0,
        **stats,
    }
    return {
        "broker": broker,
        "address": f"{broker}:1",
        "role": "master",
        "state": state,
        "stats": None if state in ("unreachable", "down") else figures,
        "replicas": [],
    }


def snap(
    groups: Sequence[dict[str, Any]] = (),
    members: Sequence[dict[str, Any]] = (),
    stale: frozenset[str] = frozenset(),
) -> Snapshot:
    return Snapshot(round=0, at_ms=0, groups=tuple(groups), members=tuple(members), stale=stale)


def run(
    engine: AlarmEngine, lags: list[int], start: float = 0.0, every: float = 5.0, **kw: Any
) -> list[tuple[float, Transition]]:
    out = []
    for i, lag in enumerate(lags):
        now = start + i * every
        out += [(now, t) for t in engine.step(snap([group("billing", lag, **kw)]), now)]
    return out


def test_a_lag_flapping_around_the_threshold_fires_once_and_resolves_once() -> None:
    engine = AlarmEngine([LAG])
    flapping = [10_500, 9_500] * 20  # 200 s around 10,000, never below 9,000
    sent = run(engine, [10_500] * 7 + flapping)
    assert [(now, t.status) for now, t in sent] == [(30.0, "firing")]
    assert sent[0][1].value == 10_500 and sent[0][1].threshold == 10_000
    assert "group billing lags 10,500 messages on orders" in sent[0][1].summary
    # caught up: below 9,000 for resolve_for -> one "resolved"
    later = run(engine, [8_000] * 8, start=1000.0)
    assert [(now, t.status) for now, t in later] == [(1030.0, "resolved")]
    assert later[0][1].ends_at == 1030.0 and later[0][1].starts_at == 30.0
    assert engine.views() == []


def test_a_short_breach_is_pending_and_sends_nothing() -> None:
    engine = AlarmEngine([LAG])
    assert run(engine, [20_000, 20_000, 100]) == []
    engine.step(snap([group("billing", 20_000)]), 100.0)
    (view,) = engine.views()
    assert (view["state"], view["labels"]) == ("pending", {"group": "billing", "topic": "orders"})
    assert any(line.startswith('equeue_alarm_pending{alarm="lag"') for line in engine.metrics())


def test_clearing_then_breaching_again_while_resolving_is_the_same_alarm() -> None:
    engine = AlarmEngine([LAG])
    sent = run(engine, [20_000] * 7 + [100] * 3 + [20_000] * 3 + [9_500] + [100] * 7)
    assert [t.status for _, t in sent] == ["firing", "resolved"]


def test_firing_repeats_at_the_interval_with_a_count() -> None:
    rule = Rule(name="lag", type="group_lag", messages=10, for_s=0, repeat_s=60)
    engine = AlarmEngine([rule])
    sent = run(engine, [50] * 30, every=5.0)  # 0 .. 145 s
    assert [(now, t.repeat) for now, t in sent] == [(0.0, 0), (60.0, 1), (120.0, 2)]
    never = AlarmEngine([Rule(name="lag", type="group_lag", messages=10, for_s=0, repeat_s=0)])
    assert len(run(never, [50] * 30)) == 1


def test_missing_data_is_not_a_recovery_and_a_gone_instance_resolves_after_ten_minutes() -> None:
    engine = AlarmEngine([LAG])
    assert [t.status for _, t in run(engine, [20_000] * 7)] == ["firing"]
    # the broker holding the lag is unreachable: the figure is unknown, state kept
    assert run(engine, [0] * 20, start=100.0, unreachable=True) == []
    # a stale groups section: nothing changes either
    stale = snap([], stale=frozenset({"groups"}))
    assert all(engine.step(stale, 200.0 + i) == [] for i in range(1000))
    # the group is gone from the snapshot: resolved as "gone" after 10 minutes
    assert engine.step(snap([]), 300.0) == []
    (gone,) = engine.step(snap([]), 1300.0)
    assert (gone.status, gone.reason) == ("resolved", "gone")
    assert engine.views() == []


def test_patterns_pick_groups_and_topics_and_each_instance_has_its_own_state() -> None:
    rule = Rule(name="b", type="group_lag", group="billing-*", topic="orders", messages=5, for_s=0)
    engine = AlarmEngine([rule])
    groups = [
        group("billing-eu", 9),
        group("billing-us", 1),
        group("audit", 99),
        group("billing-eu", 99, topic="refunds"),
    ]
    sent = engine.step(snap(groups), 0.0)
    assert [dict(t.labels) for t in sent] == [{"group": "billing-eu", "topic": "orders"}]
    firing = [line for line in engine.metrics() if line.startswith("equeue_alarm_firing{")]
    assert firing == [
        'equeue_alarm_firing{alarm="b",type="group_lag",group="billing-eu",topic="orders",'
        'broker="",member="",replica=""} 1'
    ]


def test_lag_in_seconds_fires_too() -> None:
    rule = Rule(name="age", type="group_lag", seconds=300, for_s=0)
    engine = AlarmEngine([rule])
    row = group("g", 1)
    row["topics"][0]["lag_ms"] = 400_000
    (t,) = engine.step(snap([row]), 0.0)
    assert (t.value, t.threshold) == (400.0, 300)
    assert "lags 400 seconds" in t.summary


def test_disk_free_fires_below_and_clears_above_the_band() -> None:
    rule = Rule(name="disk", type="disk_free", percent=10, for_s=0, resolve_for_s=0)
    engine = AlarmEngine([rule])
    statuses = []
    for i, free in enumerate([50, 9, 10.5, 9, 10.9, 11.5]):
        members = [member("b1", disk_free_bytes=free)]
        statuses += [t.status for t in engine.step(snap(members=members), float(i))]
    assert statuses == ["firing", "resolved"]


def test_total_unconsumed_broker_down_and_dlq() -> None:
    rules = [
        Rule(name="total", type="total_unconsumed", messages=100, for_s=0),
        Rule(name="down", type="broker_down", for_s=15, resolve_for_s=0),
        Rule(name="dlq", type="dlq_not_empty", min=1, for_s=0),
    ]
    engine = AlarmEngine(rules)
    dead = group("g", 0)
    dead.update(dlq_messages=3, dlq_resent=1)
    members = [member("b1", total_backlog=500), member("b2", state="unreachable")]
    first = engine.step(snap([dead], members), 0.0)
    assert sorted(
        (t.rule.name, dict(t.labels).get("broker", dict(t.labels).get("group"))) for t in first
    ) == [("dlq", "g"), ("total", "b1")]
    (down,) = engine.step(snap([dead], members), 15.0)
    assert (down.rule.name, dict(down.labels)) == ("down", {"broker": "b2", "member": "b2:1"})
    # b2 back: resolved at once (resolve_for 0); its unknown backlog fired nothing
    back = engine.step(snap([dead], [member("b1", total_backlog=500), member("b2")]), 20.0)
    assert [(t.rule.name, t.status) for t in back] == [("down", "resolved")]


def test_replica_transaction_and_delayed_rules_read_the_member_rows() -> None:
    rules = [
        Rule(name="repl", type="replica_out_of_sync", for_s=0),
        Rule(name="txn", type="transaction_open", seconds=600, for_s=0),
        Rule(name="timer", type="delayed_overdue", seconds=60, for_s=0),
    ]
    engine = AlarmEngine(rules)
    b1 = member("b1", delayed_next_due_ms=1_000_000)  # due at 1,000 s
    b1["replicas"] = [
        {"address": "r1:1", "connected": True, "in_sync": True},
        {"address": "r2:1", "connected": True, "in_sync": False},
    ]
    txn = {"broker": "b1", "created_ms": 0}
    now = 1_100.0  # the transaction is 1,100 s old, the timer 100 s late
    shot = Snapshot(round=0, at_ms=0, members=(b1,), transactions=(txn,))
    sent = {
        (t.rule.name, dict(t.labels).get("replica", "")): t.value for t in engine.step(shot, now)
    }
    assert sent == {("repl", "r2:1"): 1.0, ("txn", ""): 1_100.0, ("timer", ""): 100.0}


def test_only_alarms_that_are_on_take_memory_and_resolved_ones_are_listed() -> None:
    engine = AlarmEngine([LAG])
    for i in range(100):  # many groups under the threshold keep no state
        engine.step(snap([group(f"g{i}", 10)]), float(i))
    assert engine.views() == [] and engine._rules[0].instances == {}
    run(engine, [20_000] * 8 + [0] * 8, start=1000.0)
    (resolved,) = engine.recently_resolved()
    assert (resolved["alarm"], resolved["labels"], resolved["state"]) == (
        "lag", {"group": "billing", "topic": "orders"}, "resolved",
    )  # fmt: skip
    assert engine._rules[0].instances == {}


def test_the_alarm_gauges_are_bounded(monkeypatch: Any) -> None:
    from equeue_spark.console.alarms import engine as engine_module

    monkeypatch.setattr(engine_module, "MAX_METRIC_SERIES", 3)
    quick = Rule(name="lag", type="group_lag", messages=1, for_s=0)
    engine = AlarmEngine([quick])
    engine.step(snap([group(f"g{i}", 5) for i in range(5)]), 0.0)
    firing = [line for line in engine.metrics() if line.startswith("equeue_alarm_firing{")]
    assert len(firing) == 3
    assert "equeue_alarm_series_dropped 2" in engine.metrics()
    views = engine.views()
    assert len(views) == 5 and all(v["notified_ms"] == 0 for v in views)
