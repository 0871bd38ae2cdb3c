"""The alarm state machine (design 30, 3.4): ``AlarmEngine(rules).step(snapshot,
now)`` returns the round's transitions to notify. Pure: no I/O, the clock is
passed in, so tests drive it with a fake clock.

Per instance (rule, labels)::

    inactive --breach--> pending --held for `for`--> firing (notify "firing")
    pending --no breach--> inactive (nothing sent)
    firing --cleared (past the hysteresis band)--> resolving
    resolving --cleared for `resolve_for`--> inactive (notify "resolved")
    resolving --breach or back in the band--> firing (no notification: a flap
        is not a new alarm)
    firing --each `repeat`--> notify "firing" again

Hysteresis in value and time means a lag flapping around its threshold fires
once and resolves once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from equeue_spark.console.alarms.rules import Rule
from equeue_spark.console.alarms.sources import Labels, Sample, is_stale, samples
from equeue_spark.console.snapshot import Snapshot

GONE_AFTER_S = 600.0
"""An instance absent this long (group deleted, topic gone) resolves as "gone"."""
METRIC_LABELS = ("alarm", "type", "group", "topic", "broker", "member", "replica")
MAX_METRIC_SERIES = 1000
"""Series of each alarm gauge at most (the rest are counted in
``equeue_alarm_series_dropped``): a cluster-wide backlog must not turn the
console's /metrics into a cardinality problem of its own."""
RECENT_RESOLVED = 50
"""Resolved alarms kept for the console's /alarms page."""
UNITS = {
    "group_lag": "messages",
    "total_unconsumed": "messages",
    "dlq_not_empty": "messages",
    "replica_out_of_sync": "",
    "disk_free": "percent",
    "broker_down": "",
    "transaction_open": "seconds",
    "delayed_overdue": "seconds",
}


@dataclass(frozen=True)
class Transition:
    """One notification-worthy change of one alarm instance."""

    rule: Rule
    labels: Labels
    status: str
    """"firing" or "resolved"."""
    value: float | None
    threshold: float | None
    unit: str
    starts_at: float
    """When it fired (seconds since the epoch)."""
    ends_at: float | None = None
    repeat: int = 0
    """0 for the first "firing", n for the n-th repeat."""
    reason: str = ""
    """"gone" when the instance disappeared while firing."""

    @property
    def summary(self) -> str:
        return summary(self.rule, dict(self.labels), self.value, self.threshold)


@dataclass
class _Instance:
    labels: Labels
    state: str = "inactive"
    since: float = 0.0
    """Entered pending / fired at."""
    clear_since: float = 0.0
    notified_at: float = 0.0
    repeat: int = 0
    value: float | None = None
    threshold: float | None = None
    seen_at: float = 0.0


@dataclass
class _RuleState:
    rule: Rule
    instances: dict[Labels, _Instance] = field(default_factory=dict)


class AlarmEngine:
    def __init__(self, rules: Iterable[Rule]) -> None:
        self._rules = [_RuleState(r) for r in rules]
        self.resolved: deque[Transition] = deque(maxlen=RECENT_RESOLVED)
        """The latest "resolved" transitions, newest last."""

    def step(self, snap: Snapshot, now: float) -> list[Transition]:
        """Evaluate every rule on ``snap`` at ``now`` (seconds since the epoch)."""
        out: list[Transition] = []
        for rs in self._rules:
            seen: set[Labels] = set()
            for sample in samples(rs.rule, snap, now):
                seen.add(sample.labels)
                inst = rs.instances.setdefault(sample.labels, _Instance(sample.labels))
                inst.seen_at = now
                if sample.value is not None:
                    out.extend(_advance(rs.rule, inst, sample, now))
                if inst.state == "inactive":  # only alarms that are on take memory
                    del rs.instances[sample.labels]
            if not is_stale(rs.rule, snap):  # a stale section says nothing of absence
                out.extend(_expire(rs, seen, now))
        self.resolved.extend(t for t in out if t.status == "resolved")
        return out

    def views(self) -> list[dict[str, object]]:
        """Pending, firing and resolving instances, for the console's /alarms."""
        return [
            {
                "alarm": rs.rule.name,
                "type": rs.rule.type,
                "labels": dict(inst.labels),
                "state": inst.state,
                "since_ms": _ms(inst.since),
                "value": inst.value,
                "threshold": inst.threshold,
                "unit": UNITS[rs.rule.type],
                "repeat": inst.repeat,
                "notified_ms": _ms(inst.notified_at) if inst.state != "pending" else None,
                "summary": summary(rs.rule, dict(inst.labels), inst.value, inst.threshold),
            }
            for rs in self._rules
            for inst in rs.instances.values()
            if inst.state != "inactive"
        ]

    def recently_resolved(self) -> list[dict[str, object]]:
        """The latest resolved alarms, newest first, for the console's /alarms."""
        return [
            {
                "alarm": t.rule.name,
                "type": t.rule.type,
                "labels": dict(t.labels),
                "state": "resolved",
                "since_ms": _ms(t.starts_at),
                "ended_ms": _ms(t.ends_at or 0.0),
                "value": t.value,
                "threshold": t.threshold,
                "unit": t.unit,
                "reason": t.reason,
                "summary": t.summary,
            }
            for t in reversed(self.resolved)
        ]

    def metrics(self) -> list[str]:
        """``equeue_alarm_firing`` / ``equeue_alarm_pending`` in the text
        exposition format; one fixed label set, absent labels empty; at most
        ``MAX_METRIC_SERIES`` series each."""
        lines: list[str] = []
        dropped = 0
        for name, states, what in (
            ("equeue_alarm_firing", ("firing", "resolving"), "firing"),
            ("equeue_alarm_pending", ("pending",), "pending"),
        ):
            lines.append(f"# HELP {name} 1 per {what} alarm instance")
            lines.append(f"# TYPE {name} gauge")
            active = [
                (rs.rule, inst.labels)
                for rs in self._rules
                for inst in rs.instances.values()
                if inst.state in states
            ]
            dropped += max(0, len(active) - MAX_METRIC_SERIES)
            for rule, labels in active[:MAX_METRIC_SERIES]:
                lines.append(f"{name}{{{_metric_labels(rule, labels)}}} 1")
        lines.append(
            "# HELP equeue_alarm_series_dropped alarm instances left out of the two gauges "
            f"(over {MAX_METRIC_SERIES} each)"
        )
        lines.append("# TYPE equeue_alarm_series_dropped gauge")
        lines.append(f"equeue_alarm_series_dropped {dropped}")
        return lines


def _advance(rule: Rule, inst: _Instance, sample: Sample, now: float) -> list[Transition]:
    breach, clear, value, threshold = judge(rule, sample)
    inst.value, inst.threshold = value, threshold
    if inst.state == "inactive" and breach:
        inst.state, inst.since = "pending", now
    if inst.state == "pending":
        if not breach:
            inst.state = "inactive"
        elif now - inst.since >= rule.for_s:
            inst.state, inst.since, inst.notified_at, inst.repeat = "firing", now, now, 0
            return [_transition(rule, inst, "firing")]
        return []
    if inst.state == "resolving":
        if not clear:  # back over the threshold or in the band: the same alarm
            inst.state = "firing"
        elif now - inst.clear_since >= rule.resolve_for_s:
            inst.state = "inactive"
            return [_transition(rule, inst, "resolved", ends_at=now)]
        return []
    if inst.state == "firing":
        if clear:
            inst.state, inst.clear_since = "resolving", now
            if rule.resolve_for_s <= 0:
                inst.state = "inactive"
                return [_transition(rule, inst, "resolved", ends_at=now)]
        elif rule.repeat_s > 0 and now - inst.notified_at >= rule.repeat_s:
            inst.notified_at, inst.repeat = now, inst.repeat + 1
            return [_transition(rule, inst, "firing")]
    return []


def _expire(rs: _RuleState, seen: set[Labels], now: float) -> list[Transition]:
    out: list[Transition] = []
    for key, inst in list(rs.instances.items()):
        if key in seen or now - inst.seen_at < GONE_AFTER_S:
            continue
        if inst.state in ("firing", "resolving"):
            out.append(_transition(rs.rule, inst, "resolved", ends_at=now, reason="gone"))
        del rs.instances[key]
    return out


def judge(rule: Rule, sample: Sample) -> tuple[bool, bool, float | None, float | None]:
    """(breach, cleared, value, threshold) of one sample; "cleared" is past
    the hysteresis band, so between the two the state does not change."""
    v, h = sample.value, rule.hysteresis
    assert v is not None
    if rule.binary:
        return v >= 1, v < 1, v, None
    if rule.type == "group_lag":
        return _judge_lag(rule, v, sample.age_s or 0.0)
    if rule.fires_below:
        t = rule.percent or 0.0
        return v < t, v >= t * (1 + h), v, t
    if rule.type == "dlq_not_empty":
        t = float(rule.min or 1)
        return v >= t, v < t * (1 - h), v, t
    t = float(rule.messages if rule.messages is not None else rule.seconds or 0.0)
    return v > t, v <= t * (1 - h), v, t


def _judge_lag(rule: Rule, lag: float, age: float) -> tuple[bool, bool, float, float | None]:
    h = rule.hysteresis
    by_count = rule.messages is not None and lag > rule.messages
    by_age = rule.seconds is not None and age > rule.seconds
    clear = (rule.messages is None or lag <= rule.messages * (1 - h)) and (
        rule.seconds is None or age <= rule.seconds * (1 - h)
    )
    if rule.messages is None or (by_age and not by_count):
        return by_count or by_age, clear, age, rule.seconds
    return by_count or by_age, clear, lag, float(rule.messages)


def _ms(seconds: float) -> int:
    """Times in the console's JSON are ms since the epoch, as everywhere there."""
    return round(seconds * 1000)


def _transition(
    rule: Rule, inst: _Instance, status: str, ends_at: float | None = None, reason: str = ""
) -> Transition:
    return Transition(
        rule=rule,
        labels=inst.labels,
        status=status,
        value=inst.value,
        threshold=inst.threshold,
        unit=UNITS[rule.type],
        starts_at=inst.since,
        ends_at=ends_at,
        repeat=inst.repeat,
        reason=reason,
    )


def _metric_labels(rule: Rule, labels: Labels) -> str:
    values = {"alarm": rule.name, "type": rule.type, **dict(labels)}
    return ",".join(f'{k}="{_escape(values.get(k, ""))}"' for k in METRIC_LABELS)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def summary(rule: Rule, lab: dict[str, str], value: float | None, threshold: float | None) -> str:
    """One line for a notification's subject / annotation."""
    v, t = _number(value), _number(threshold)
    held = f"for {rule.for_s:g}s"
    match rule.type:
        case "group_lag":
            unit = "messages" if threshold == rule.messages else "seconds"
            return (
                f"group {lab.get('group')} lags {v} {unit} on {lab.get('topic')} (over {t} {held})"
            )
        case "total_unconsumed":
            where = f"broker {lab['broker']}" if "broker" in lab else "the cluster"
            return f"{where} has {v} unconsumed messages (over {t} {held})"
        case "dlq_not_empty":
            return f"group {lab.get('group')} has {v} dead letters (at least {t})"
        case "replica_out_of_sync":
            return f"replica {lab.get('replica')} of broker {lab.get('broker')} is out of sync"
        case "disk_free":
            member = f"member {lab.get('member')} of broker {lab.get('broker')}"
            return f"{member} has {v}% disk free (under {t}%)"
        case "broker_down":
            return f"member {lab.get('member')} of broker {lab.get('broker')} is down"
        case "transaction_open":
            return f"broker {lab.get('broker')} has a transaction open for {v}s (over {t}s)"
        case _:
            return f"broker {lab.get('broker')}'s delayed messages are {v}s overdue (over {t}s)"


def _number(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:,.0f}" if x == int(x) or abs(x) >= 100 else f"{x:,.1f}"
