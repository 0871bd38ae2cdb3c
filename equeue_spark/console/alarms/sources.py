"""What each alarm rule measures in a console ``Snapshot`` (design 30, 3.3):
one ``Sample`` per alarm instance (rule, labels). Pure.

A sample's value is None when the instance is known but its figure is not
(its broker is unreachable, or the section is stale this round): missing
data is not a recovery, so the engine keeps that instance's state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from equeue_spark.console.alarms.rules import Rule
from equeue_spark.console.snapshot import Row, Snapshot

Labels = tuple[tuple[str, str], ...]
UNAVAILABLE = ("unreachable", "down")


@dataclass(frozen=True)
class Sample:
    labels: Labels
    value: float | None
    """The rule's main figure (messages, percent, seconds or 0/1)."""
    age_s: float | None = None
    """group_lag only: the oldest unconsumed message's age."""


def labels(**kv: str) -> Labels:
    return tuple(sorted(kv.items()))


def samples(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    """The instances of ``rule`` in ``snap``; nothing when its section is stale
    (the engine then holds every instance of the rule)."""
    if is_stale(rule, snap):
        return iter(())
    return _SOURCES[rule.type](rule, snap, now_s)


def is_stale(rule: Rule, snap: Snapshot) -> bool:
    """The rule's figures were carried over from an earlier round."""
    return bool(_SECTION[rule.type] & snap.stale)


def _group_lag(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    for g in _groups(rule, snap):
        partial = bool(g.get("unreachable_brokers"))
        for t in g["topics"]:
            if fnmatchcase(t["topic"], rule.topic):
                lab = labels(group=g["group"], topic=t["topic"])
                if partial:  # the lag of an unreachable broker is unknown, not zero
                    yield Sample(lab, None)
                else:
                    yield Sample(lab, float(t["lag"]), t["lag_ms"] / 1000.0)


def _dlq(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    for g in _groups(rule, snap):
        unsettled = max(0, g["dlq_messages"] - g["dlq_resent"])
        yield Sample(labels(group=g["group"]), float(unsettled))


def _groups(rule: Rule, snap: Snapshot) -> Iterator[Row]:
    return (g for g in snap.groups if fnmatchcase(g["group"], rule.group))


def _masters(snap: Snapshot) -> Iterator[Row]:
    return (m for m in snap.members if m["role"] == "master")


def _stats(member: Row) -> dict[str, Any] | None:
    if member["state"] in UNAVAILABLE:
        return None
    stats: dict[str, Any] | None = member.get("stats")
    return stats


def _total(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    per_broker = [(m["broker"], _stats(m)) for m in _masters(snap)]
    if rule.scope == "cluster":
        known = [s["total_backlog"] for _, s in per_broker if s is not None]
        whole = len(known) == len(per_broker) and per_broker
        yield Sample(labels(), float(sum(known)) if whole else None)
        return
    for broker, stats in per_broker:
        if fnmatchcase(broker, rule.broker):
            value = None if stats is None else float(stats["total_backlog"])
            yield Sample(labels(broker=broker), value)


def _replicas(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    for m in _masters(snap):
        if fnmatchcase(m["broker"], rule.broker) and _stats(m) is not None:
            for r in m["replicas"]:
                ok = r["connected"] and r["in_sync"]
                yield Sample(labels(broker=m["broker"], replica=r["address"]), 0.0 if ok else 1.0)


def _disk(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    for m in snap.members:
        if not fnmatchcase(m["broker"], rule.broker):
            continue
        stats = _stats(m)
        size = stats["disk_size_bytes"] if stats else 0
        lab = labels(broker=m["broker"], member=m["address"])
        # size 0: a broker before 1.6 does not report its file system
        if stats is None or size > 0:
            yield Sample(lab, None if stats is None else 100.0 * stats["disk_free_bytes"] / size)


def _down(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    for m in snap.members:
        if fnmatchcase(m["broker"], rule.broker):
            down = 1.0 if m["state"] in UNAVAILABLE else 0.0
            yield Sample(labels(broker=m["broker"], member=m["address"]), down)


def _transactions(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    oldest: dict[str, float] = {}
    for t in snap.transactions:
        age = max(0.0, now_s - t["created_ms"] / 1000.0)
        oldest[t["broker"]] = max(oldest.get(t["broker"], 0.0), age)
    for m in _masters(snap):
        if fnmatchcase(m["broker"], rule.broker):
            value = None if _stats(m) is None else oldest.get(m["broker"], 0.0)
            yield Sample(labels(broker=m["broker"]), value)


def _delayed(rule: Rule, snap: Snapshot, now_s: float) -> Iterator[Sample]:
    for m in _masters(snap):
        if fnmatchcase(m["broker"], rule.broker):
            stats = _stats(m)
            due = stats["delayed_next_due_ms"] if stats else 0
            late = max(0.0, now_s - due / 1000.0) if due > 0 else 0.0
            yield Sample(labels(broker=m["broker"]), None if stats is None else late)


_SOURCES = {
    "group_lag": _group_lag,
    "total_unconsumed": _total,
    "dlq_not_empty": _dlq,
    "replica_out_of_sync": _replicas,
    "disk_free": _disk,
    "broker_down": _down,
    "transaction_open": _transactions,
    "delayed_overdue": _delayed,
}
_SECTION: dict[str, frozenset[str]] = {
    "group_lag": frozenset({"groups"}),
    "total_unconsumed": frozenset({"members"}),
    "dlq_not_empty": frozenset({"groups", "topics"}),
    "replica_out_of_sync": frozenset({"members"}),
    "disk_free": frozenset({"members"}),
    "broker_down": frozenset({"members"}),
    "transaction_open": frozenset({"members", "transactions"}),
    "delayed_overdue": frozenset({"members"}),
}
