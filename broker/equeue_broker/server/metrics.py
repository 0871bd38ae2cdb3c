"""The broker's Prometheus metrics: ``METRICS`` and ``BrokerCollector``.

Figures are read at scrape time from what the broker keeps anyway (the
``Counters`` of stats.py, the store, the role, the budgets, the RPC timers of
metrics_hot.py): nothing here runs per message or per RPC. ``collect`` runs
on the HTTP listener's metrics thread (http.py), never on the event loop;
its storage reads take the store lock per queue, briefly, like ``GetStats``
and ``DescribeGroup``.

Group lag, topic sizes, dead letters, delayed and transactions come from
masters only: a replica holds a byte copy of its master's log and offsets,
and exporting them twice would double every ``sum by (group)``.

Cardinality (docs/metrics.md): at most ``metrics_max_topics`` topic label
values and ``metrics_max_groups`` group values, by name order (stable between
scrapes), the rest summed into ``%other``; ``%RETRY%``/``%DLQ%``/``%RESENT%``
topics are ``%reserved`` in the topic families (the group families report
them). Per-queue and per-(group, topic) series together stop at
``metrics_max_series``, whole topics at a time.

``METRICS`` is the one list of names, types, labels and help texts:
docs/metrics.md is checked against it, and the console's alarms and the
Grafana dashboard use these names.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from equeue_broker.replication.role import RoleView
from equeue_broker.server.budgets import ByteBudget
from equeue_broker.server.disk_usage import filesystem
from equeue_broker.server.group_view import group_queues
from equeue_broker.server.metrics_hot import RPC_TIMES, STREAM_TIMES
from equeue_broker.server.tokens import Principal
from equeue_broker.storage import NotFound
from equeue_proto import __version__
from equeue_proto.retry_topics import DLQ_PREFIX, RESENT_PREFIX, RESERVED, RETRY_PREFIX

if TYPE_CHECKING:
    from equeue_broker.server.service_base import BrokerState

OTHER = "%other"
"""The label value of the topics or groups past the limits."""
RESERVED_LABEL = "%reserved"
"""The topic label of %RETRY%, %DLQ% and %RESENT% topics in the topic families."""


class Spec(NamedTuple):
    name: str
    """As exposed (counters end in ``_total``)."""
    type: str
    """counter, gauge or histogram."""
    labels: tuple[str, ...]
    help: str


B = ("broker",)
BT = ("broker", "topic")
BG = ("broker", "group")
BGT = ("broker", "group", "topic")
BQ = ("broker", "topic", "queue")
BGQ = ("broker", "group", "topic", "queue")
BR = ("broker", "replica")
BB = ("broker", "budget")
BMC = ("broker", "method", "code")

METRICS: tuple[Spec, ...] = (
    Spec(
        "equeue_broker_info",
        "gauge",
        ("broker", "instance_id", "cluster", "version", "flush_mode", "replication", "failover"),
        "Always 1: the broker's identity and settings",
    ),
    Spec(
        "equeue_broker_role",
        "gauge",
        ("broker", "role"),
        "1 for the broker's role now (master or replica), 0 for the other",
    ),
    Spec("equeue_broker_epoch", "gauge", B, "The newest group epoch the broker has seen"),
    Spec(
        "equeue_broker_role_changes_total",
        "counter",
        B,
        "Times the broker changed between master and replica since it started",
    ),
    Spec(
        "equeue_broker_role_since_timestamp_seconds",
        "gauge",
        B,
        "When the broker took its current role (Unix time)",
    ),
    Spec(
        "equeue_messages_in_total",
        "counter",
        BT,
        "Messages appended per topic since the broker started",
    ),
    Spec(
        "equeue_bytes_in_total",
        "counter",
        BT,
        "Stored bytes appended per topic since the broker started",
    ),
    Spec(
        "equeue_messages_out_total",
        "counter",
        BT,
        "Messages sent in pull replies per topic since the broker started",
    ),
    Spec(
        "equeue_bytes_out_total",
        "counter",
        BT,
        "Stored bytes sent in pull replies per topic since the broker started",
    ),
    Spec(
        "equeue_messages_filtered_total",
        "counter",
        BT,
        "Messages a pull's tags or filter left out, per topic",
    ),
    Spec(
        "equeue_broker_messages_in_total",
        "counter",
        B,
        "Messages appended since the broker started (deleted topics included)",
    ),
    Spec(
        "equeue_broker_messages_out_total",
        "counter",
        B,
        "Messages sent in pull replies since the broker started",
    ),
    Spec("equeue_topic_queues", "gauge", BT, "Queues of the topic (masters)"),
    Spec(
        "equeue_topic_messages",
        "gauge",
        BT,
        "Messages stored (end - earliest over the queues; masters)",
    ),
    Spec(
        "equeue_topic_backlog_messages",
        "gauge",
        BT,
        "Messages not consumed by every group yet (end - min committed; masters)",
    ),
    Spec(
        "equeue_queue_end_offset", "gauge", BQ, "The queue's end offset (masters; per-queue tier)"
    ),
    Spec(
        "equeue_queue_earliest_offset",
        "gauge",
        BQ,
        "The queue's earliest retained offset (masters; per-queue tier)",
    ),
    Spec(
        "equeue_delayed_pending_messages",
        "gauge",
        BT,
        "Delayed messages not due yet, per topic (masters)",
    ),
    Spec(
        "equeue_delayed_next_due_timestamp_seconds",
        "gauge",
        B,
        "When the next delayed message is due (Unix time; absent when none)",
    ),
    Spec(
        "equeue_unconsumed_messages",
        "gauge",
        B,
        "Every topic's backlog on this broker together (masters)",
    ),
    Spec(
        "equeue_group_lag_messages",
        "gauge",
        BGQ,
        "Messages the group has not consumed, per queue (masters; per-queue tier)",
    ),
    Spec(
        "equeue_group_topic_lag_messages",
        "gauge",
        BGT,
        "Messages the group has not consumed on the topic (masters)",
    ),
    Spec(
        "equeue_group_lag_seconds",
        "gauge",
        BGQ,
        "Age of the group's oldest unconsumed message, per queue; 0 without lag "
        "(masters; per-queue tier)",
    ),
    Spec(
        "equeue_group_topic_lag_seconds",
        "gauge",
        BGT,
        "Age of the group's oldest unconsumed message on the topic (masters)",
    ),
    Spec("equeue_group_members", "gauge", BG, "Live consumers of the group on this broker"),
    Spec(
        "equeue_group_retry_messages", "gauge", BG, "The group's lag on its %RETRY% topic (masters)"
    ),
    Spec(
        "equeue_group_dlq_messages",
        "gauge",
        BG,
        "Messages stored in the group's %DLQ% topic (masters)",
    ),
    Spec(
        "equeue_group_dlq_resent_messages",
        "gauge",
        BG,
        "Dead letters of the group resent (records of %RESENT%; masters)",
    ),
    Spec("equeue_consumer_groups_live", "gauge", B, "Consumer groups with live members"),
    Spec("equeue_consumers_live", "gauge", B, "Live consumers of every group together"),
    Spec("equeue_transactions_open", "gauge", B, "Open transactions (masters)"),
    Spec(
        "equeue_transactions_staged_bytes",
        "gauge",
        B,
        "Bytes staged by open transactions (masters)",
    ),
    Spec(
        "equeue_transaction_oldest_age_seconds",
        "gauge",
        B,
        "Age of the oldest open transaction (masters; 0 when none)",
    ),
    Spec(
        "equeue_transaction_checks_sent_total",
        "counter",
        B,
        "Transaction checks sent to producer groups",
    ),
    Spec(
        "equeue_transaction_checks_answered_total",
        "counter",
        B,
        "Transaction checks answered by producers",
    ),
    Spec(
        "equeue_transaction_check_streams", "gauge", B, "Producers' TransactionChecks streams open"
    ),
    Spec("equeue_idempotent_producers", "gauge", B, "Idempotent producers the broker tracks"),
    Spec("equeue_log_end_position_bytes", "gauge", B, "The log's write position"),
    Spec("equeue_log_durable_position_bytes", "gauge", B, "The log's durable (fsynced) position"),
    Spec("equeue_high_watermark_bytes", "gauge", B, "The log position consumers may read up to"),
    Spec("equeue_replica_lag_bytes", "gauge", BR, "Log bytes a replica is behind this master"),
    Spec("equeue_replica_in_sync", "gauge", BR, "1 if the replica is in the in-sync set"),
    Spec("equeue_replica_connected", "gauge", BR, "1 if the replica's replication stream is open"),
    Spec(
        "equeue_replica_last_seen_seconds",
        "gauge",
        BR,
        "Seconds since the replica last reported its position",
    ),
    Spec("equeue_in_sync_replicas", "gauge", B, "Replicas in the in-sync set (masters)"),
    Spec("equeue_min_insync_replicas", "gauge", B, "The min_insync_replicas setting"),
    Spec(
        "equeue_data_dir_used_bytes",
        "gauge",
        B,
        "Bytes the data directory's files use (measured at most every 30 s)",
    ),
    Spec(
        "equeue_filesystem_free_bytes",
        "gauge",
        B,
        "Bytes a non-root writer may still use on the data directory's file system",
    ),
    Spec("equeue_filesystem_size_bytes", "gauge", B, "Size of the data directory's file system"),
    Spec("equeue_log_chunks", "gauge", B, "Chunks of the message log"),
    Spec("equeue_quarantined_chunks", "gauge", B, "Log chunks found damaged and not served"),
    Spec("equeue_damaged_metadata_files", "gauge", B, "Metadata files found damaged at open"),
    Spec("equeue_fsyncs_total", "counter", B, "fsyncs of the message log"),
    Spec("equeue_fsync_duration_seconds", "histogram", B, "How long the message log's fsyncs took"),
    Spec(
        "equeue_rpc_duration_seconds",
        "histogram",
        BMC,
        "Unary RPC durations by method and status (a parked long-poll Pull counts its "
        "wait; per process)",
    ),
    Spec(
        "equeue_rpc_stream_duration_seconds",
        "histogram",
        BMC,
        "Streaming RPCs' whole durations by method and status (per process)",
    ),
    Spec("equeue_budget_used_bytes", "gauge", BB, "Bytes of the budget in use"),
    Spec("equeue_budget_limit_bytes", "gauge", BB, "The budget's limit"),
    Spec(
        "equeue_budget_refused_total",
        "counter",
        BB,
        "Requests refused (RESOURCE_EXHAUSTED) after waiting for the budget",
    ),
    Spec("equeue_budget_waits_total", "counter", BB, "Requests that had to wait for the budget"),
    Spec("equeue_replication_waits", "gauge", B, "Writes waiting for in-sync replicas"),
    Spec("equeue_replication_waits_limit", "gauge", B, "The max_replication_waits setting"),
    Spec("equeue_parked_pulls", "gauge", B, "Long-poll pulls parked now"),
    Spec("equeue_parked_pulls_limit", "gauge", B, "The max_parked_pulls setting"),
    Spec(
        "equeue_metrics_folded_label_values",
        "gauge",
        ("broker", "label"),
        "Topic or group names folded into %other by the metrics_max_* limits",
    ),
    Spec(
        "equeue_metrics_dropped_series",
        "gauge",
        ("broker", "family"),
        "Per-queue or per-(group, topic) series left out by metrics_max_series",
    ),
    Spec(
        "equeue_metrics_collect_seconds",
        "gauge",
        B,
        "How long collecting this scrape's figures took",
    ),
)
"""Every family the broker exports (besides prometheus_client's process_* and python_*)."""

SPECS = {s.name: s for s in METRICS}


def _family(spec: Spec) -> Metric:
    labels = list(spec.labels)
    if spec.type == "counter":
        return CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=labels)
    if spec.type == "histogram":
        return HistogramMetricFamily(spec.name, spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels)


class Families:
    """The families of one scrape, filled by name."""

    def __init__(self, broker: str) -> None:
        self.broker = broker
        self._families: dict[str, Metric] = {}

    def _get(self, name: str) -> Metric:
        found = self._families.get(name)
        if found is None:
            found = self._families[name] = _family(SPECS[name])
        return found

    def add(self, name: str, value: float, *labels: str) -> None:
        family = self._get(name)
        family.add_metric([self.broker, *labels], value)  # type: ignore[attr-defined]

    def histogram(
        self,
        name: str,
        rows: Iterable[tuple[tuple[str, ...], list[int], float]],
        bounds: tuple[float, ...],
    ) -> None:
        family = self._get(name)
        for labels, counts, total in rows:
            cumulative: list[tuple[str, float]] = []
            running = 0
            for bound, count in zip((*bounds, float("inf")), counts, strict=True):
                running += count
                cumulative.append((_bound(bound), running))
            family.add_metric([self.broker, *labels], cumulative, total)  # type: ignore[attr-defined]

    def all(self) -> Iterator[Metric]:
        yield from self._families.values()


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _reserved(name: str) -> bool:
    return name.startswith(RESERVED)


class Limiter:
    """The first ``limit`` names (sorted) keep their label; the rest ``%other``."""

    def __init__(self, names: Iterable[str], limit: int) -> None:
        ordered = sorted(set(names))
        self.kept = set(ordered[:limit])
        self.folded = len(ordered) - len(self.kept)

    def __call__(self, name: str) -> str:
        return name if name in self.kept else OTHER


class Budgets(NamedTuple):
    """Budgets ``create_server`` makes that ``BrokerState`` does not hold."""

    intake: ByteBudget | None
    """The ``IntakeGate``'s (``max_intake_bytes``)."""
    replication_slots: ByteBudget | None
    """The in-sync set's writes waiting at once (``max_replication_waits``)."""
    role_changes: RoleChanges | None = None


class RoleChanges:
    """A role listener counting changes between master and replica (not
    epoch or master address changes); called on the thread that changed it."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, old: RoleView, new: RoleView) -> None:
        if old.role != new.role:
            self.count += 1


class BrokerCollector(Collector):
    """The broker's figures for one principal's scope (None: everything)."""

    def __init__(
        self, state: BrokerState, extra: Budgets | None = None, scope: Principal | None = None
    ) -> None:
        self.state = state
        self.extra = extra or Budgets(None, None)
        self.scope = scope if scope is not None and scope.topics is not None else None

    def describe(self) -> Iterable[Metric]:
        return []  # collected at scrape time only (no registration-time collect)

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        s = self.state
        out = Families(s.broker_id)
        self._identity(out)
        self._throughput(out)
        if s.role.view.is_master:
            self._topics_and_groups(out)
            self._transactions(out)
            self._replicas(out)
        self._storage(out)
        self._rpcs_and_budgets(out)
        out.add("equeue_metrics_collect_seconds", time.perf_counter() - started)
        return list(out.all())

    def _visible(self, topic: str) -> bool:
        return self.scope is None or self.scope.may_use_topic(topic)

    def _identity(self, out: Families) -> None:
        s, config = self.state, self.state.config
        view = s.role.view
        out.add(
            "equeue_broker_info", 1, s.instance_id, config.cluster, __version__,
            config.storage.flush_mode.value, config.replication, s.role_switch.mode,
        )  # fmt: skip
        for role in ("master", "replica"):
            out.add("equeue_broker_role", 1 if view.role == role else 0, role)
        out.add("equeue_broker_epoch", view.epoch)
        if self.extra.role_changes is not None:
            out.add("equeue_broker_role_changes_total", self.extra.role_changes.count)
        out.add("equeue_broker_role_since_timestamp_seconds", s.role.since_ms / 1000)

    def _topic_label(self) -> Limiter:
        names = [n for n, *_ in self.state.counters.per_queue() if not _reserved(n)]
        names += [t.name for t in self.state.store.topic_admin.listing() if not _reserved(t.name)]
        return Limiter(filter(self._visible, names), self.state.config.metrics_max_topics)

    def _throughput(self, out: Families) -> None:
        s = self.state
        label = self._topic_label()
        out.add("equeue_metrics_folded_label_values", label.folded, "topic")
        sums: dict[tuple[str, str], float] = {}
        rows = [
            *((t, q, ("equeue_messages_in_total", p), ("equeue_messages_out_total", c))
              for t, q, p, c in s.counters.per_queue()),
            *((t, q, ("equeue_bytes_in_total", p), ("equeue_bytes_out_total", c))
              for t, q, p, c in s.counters.per_queue_bytes()),
        ]  # fmt: skip
        for topic, _queue, *figures in rows:
            if not self._visible(topic):
                continue
            shown = RESERVED_LABEL if _reserved(topic) else label(topic)
            for name, value in figures:
                sums[(name, shown)] = sums.get((name, shown), 0) + value
        with s.counters._lock:
            filtered = list(s.counters.filtered.items())
        for (topic, _queue), value in filtered:
            if self._visible(topic):
                shown = RESERVED_LABEL if _reserved(topic) else label(topic)
                key = ("equeue_messages_filtered_total", shown)
                sums[key] = sums.get(key, 0) + value
        for (name, shown), total in sorted(sums.items()):
            out.add(name, total, shown)
        if self.scope is None:
            produced, consumed = s.counters.totals()
            out.add("equeue_broker_messages_in_total", produced)
            out.add("equeue_broker_messages_out_total", consumed)

    def _topics_and_groups(self, out: Families) -> None:
        s, store = self.state, self.state.store
        label = self._topic_label()
        budget = s.config.metrics_max_series
        dropped = {"group_lag": 0, "queue_offsets": 0}
        backlog_total = 0
        per_topic: dict[str, dict[str, float]] = {}
        queue_rows: list[tuple[str, list[tuple[str, int, int, int]]]] = []
        for meta in store.topic_admin.listing():
            name = meta.name
            if _reserved(name) or not self._visible(name):
                continue
            sums = per_topic.setdefault(label(name), {})
            rows = []
            for q in meta.queues:
                try:
                    info = store.topic_admin.queue_info(name, q.queue_id)
                except NotFound:
                    continue
                low = store.min_committed(name, q.queue_id)
                first = info.earliest if low is None else max(low, info.earliest)
                backlog_total += info.end - first
                for key, value in (("queues", 1), ("messages", info.end - info.earliest),
                                   ("backlog", info.end - first)):  # fmt: skip
                    sums[key] = sums.get(key, 0) + value
                rows.append((name, q.queue_id, info.end, info.earliest))
            pending, _ = store.delayed_summary(name)
            sums["delayed"] = sums.get("delayed", 0) + pending
            if label(name) != OTHER:  # folded topics have no per-queue series
                queue_rows.append((name, rows))
        for shown, sums in sorted(per_topic.items()):
            out.add("equeue_topic_queues", sums.get("queues", 0), shown)
            out.add("equeue_topic_messages", sums.get("messages", 0), shown)
            out.add("equeue_topic_backlog_messages", sums.get("backlog", 0), shown)
            out.add("equeue_delayed_pending_messages", sums.get("delayed", 0), shown)
        _, next_due = store.delayed_summary()
        if next_due is not None:
            out.add("equeue_delayed_next_due_timestamp_seconds", next_due / 1000)
        if self.scope is None:
            out.add("equeue_unconsumed_messages", backlog_total)
        budget = self._groups(out, label, budget, dropped)
        for _name, rows in queue_rows:  # whole topics, in name order, while they fit
            if 2 * len(rows) > budget:
                dropped["queue_offsets"] += 2 * len(rows)
                continue
            budget -= 2 * len(rows)
            for topic, queue_id, end, earliest in rows:
                out.add("equeue_queue_end_offset", end, topic, str(queue_id))
                out.add("equeue_queue_earliest_offset", earliest, topic, str(queue_id))
        for family, count in dropped.items():
            out.add("equeue_metrics_dropped_series", count, family)

    def _groups(
        self, out: Families, topic_label: Limiter, budget: int, dropped: dict[str, int]
    ) -> int:
        """The group families; returns the series budget left for per-queue topic series."""
        s = self.state
        # A group that only has dead letters or retries (never committed, no
        # live member) is known by its group topics' names.
        by_topics = {
            t.name.removeprefix(prefix)
            for t in s.store.topic_admin.listing()
            for prefix in (RETRY_PREFIX, DLQ_PREFIX, RESENT_PREFIX)
            if t.name.startswith(prefix)
        }
        groups = sorted(set(s.store.groups()) | set(s.consumers.groups()) | by_topics)
        if self.scope is not None:
            groups = [g for g in groups if all(self._visible(t) for t in s.group_topics(g))]
        label = Limiter(groups, s.config.metrics_max_groups)
        out.add("equeue_metrics_folded_label_values", label.folded, "group")
        now_ms = int(time.time() * 1000)
        topic_sums: dict[tuple[str, str], list[float]] = {}
        group_sums: dict[tuple[str, str], float] = {}
        per_queue: list[tuple[str, str, str, int, int]] = []
        for group in groups:
            shown = label(group)
            group_sums[("equeue_group_members", shown)] = group_sums.get(
                ("equeue_group_members", shown), 0
            ) + len(s.consumers.live(group))
            for view in group_queues(s.store, s.consumers, group, now_ms):
                if _reserved(view.topic):
                    if view.topic == RETRY_PREFIX + group:
                        key = ("equeue_group_retry_messages", shown)
                        group_sums[key] = group_sums.get(key, 0) + view.lag
                    continue
                row = topic_sums.setdefault((shown, topic_label(view.topic)), [0, 0])
                row[0] += view.lag
                row[1] = max(row[1], view.lag_ms / 1000)
                if shown != OTHER:
                    per_queue.append((shown, view.topic, str(view.queue_id), view.lag, view.lag_ms))
            for prefix, name in ((DLQ_PREFIX, "equeue_group_dlq_messages"),
                                 (RESENT_PREFIX, "equeue_group_dlq_resent_messages")):  # fmt: skip
                key = (name, shown)
                group_sums[key] = group_sums.get(key, 0) + self._stored(prefix + group)
        for (name, shown), value in sorted(group_sums.items()):
            out.add(name, value, shown)
        for (group, topic), (lag, lag_s) in sorted(topic_sums.items()):
            out.add("equeue_group_topic_lag_messages", lag, group, topic)
            out.add("equeue_group_topic_lag_seconds", lag_s, group, topic)
        budget -= 2 * len(topic_sums)
        by_topic: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
        for group, topic, queue, lag, lag_ms in per_queue:
            by_topic.setdefault((topic, group), []).append((queue, lag, lag_ms))
        for (topic, group), rows in sorted(by_topic.items()):
            if 2 * len(rows) > budget:
                dropped["group_lag"] += 2 * len(rows)
                continue
            budget -= 2 * len(rows)
            for queue, lag, lag_ms in rows:
                out.add("equeue_group_lag_messages", lag, group, topic, queue)
                out.add("equeue_group_lag_seconds", lag_ms / 1000, group, topic, queue)
        if self.scope is None:
            out.add("equeue_consumer_groups_live", len(s.consumers.groups()))
            out.add(
                "equeue_consumers_live", sum(len(s.consumers.live(g)) for g in s.consumers.groups())
            )
        return budget

    def _stored(self, topic: str) -> int:
        """Messages stored in ``topic`` (0 when it does not exist)."""
        store, total = self.state.store, 0
        try:
            meta = store.topic_admin.describe(topic)
        except NotFound:
            return 0
        for q in meta.queues:
            try:
                info = store.topic_admin.queue_info(topic, q.queue_id)
            except NotFound:
                continue
            total += info.end - info.earliest
        return total

    def _transactions(self, out: Families) -> None:
        if self.scope is not None:
            return
        s = self.state
        raw = s.store.stats()
        out.add("equeue_transactions_open", raw.get("open_transactions", 0))
        out.add("equeue_transactions_staged_bytes", raw.get("staged_bytes", 0))
        now_ms = int(time.time() * 1000)
        opened = [t.created_ms for t in s.store.transactions.list_open("")]
        out.add(
            "equeue_transaction_oldest_age_seconds", (now_ms - min(opened)) / 1000 if opened else 0
        )

    def _replicas(self, out: Families) -> None:
        if self.scope is not None:
            return
        s = self.state
        end = s.store.stats()["log_write_position"]
        members = list(s.insync.members)
        now = time.monotonic()
        for v in s.replicas.views():
            replica = v.replica_id or v.address
            out.add("equeue_replica_lag_bytes", max(0, end - v.position), replica)
            out.add(
                "equeue_replica_in_sync", int(v.connected and v.replica_id in members[1:]), replica
            )
            out.add("equeue_replica_connected", int(v.connected), replica)
            out.add("equeue_replica_last_seen_seconds", now - v.last_seen, replica)
        out.add("equeue_in_sync_replicas", max(0, len(members) - 1))

    def _storage(self, out: Families) -> None:
        if self.scope is not None:
            return
        s = self.state
        raw = s.store.stats()
        checks = s.checker.stats()
        for name, value in (
            ("equeue_transaction_checks_sent_total", checks["transaction_checks_sent"]),
            ("equeue_transaction_checks_answered_total", checks["transaction_checks_answered"]),
            ("equeue_transaction_check_streams", checks["check_streams"]),
            ("equeue_idempotent_producers", raw["idempotent_producers"]),
            ("equeue_log_end_position_bytes", raw["log_write_position"]),
            ("equeue_log_durable_position_bytes", raw["durable_position"]),
            ("equeue_high_watermark_bytes", s.store.high_watermark),
            ("equeue_min_insync_replicas", s.config.min_insync_replicas),
            ("equeue_log_chunks", raw["log_chunks"]),
            ("equeue_fsyncs_total", raw["fsyncs"]),
        ):
            out.add(name, value)
        damage = s.store.damage()
        out.add("equeue_quarantined_chunks", len(damage.quarantined_chunks))
        out.add("equeue_damaged_metadata_files", len(damage.metadata()))
        data_dir = s.config.storage.data_dir
        out.add("equeue_data_dir_used_bytes", s.disk.used(data_dir))
        try:
            free, size = filesystem(data_dir)
        except OSError:  # the directory went away: said by the disk alarms, not a failed scrape
            free = size = 0
        out.add("equeue_filesystem_free_bytes", free)
        out.add("equeue_filesystem_size_bytes", size)
        counts, total = s.store.fsync_times.snapshot()
        out.histogram(
            "equeue_fsync_duration_seconds", [((), counts, total)], s.store.fsync_times.buckets
        )

    def _rpcs_and_budgets(self, out: Families) -> None:
        if self.scope is not None:
            return
        s = self.state
        for name, times in (("equeue_rpc_duration_seconds", RPC_TIMES),
                            ("equeue_rpc_stream_duration_seconds", STREAM_TIMES)):  # fmt: skip
            rows = [
                ((m, c), counts, total)
                for (m, c), (counts, total) in sorted(times.snapshot().items())
            ]
            out.histogram(name, rows, times.buckets)
        budgets = {
            "produce": s.produce_bytes, "pull_reply": s.reply_bytes,
            "stream_reply": s.stream_reply_bytes,
        }  # fmt: skip
        if self.extra.intake is not None:
            budgets["intake"] = self.extra.intake
        for budget, b in sorted(budgets.items()):
            out.add("equeue_budget_used_bytes", b.used, budget)
            out.add("equeue_budget_limit_bytes", b.limit, budget)
            out.add("equeue_budget_refused_total", b.refused, budget)
            out.add("equeue_budget_waits_total", b.waited, budget)
        slots = self.extra.replication_slots
        if slots is not None:
            out.add("equeue_replication_waits", slots.used)
            out.add("equeue_replication_waits_limit", slots.limit)
        out.add("equeue_parked_pulls", s.waiters.parked)
        out.add("equeue_parked_pulls_limit", s.config.max_parked_pulls)


def render(state: BrokerState, extra: Budgets, scope: Principal | None) -> bytes:
    """The text exposition for ``scope`` (the HTTP listener's metrics thread)."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(state, extra, scope))
    if scope is None or scope.topics is None:
        from prometheus_client import PlatformCollector, ProcessCollector

        ProcessCollector(registry=registry, pid=os.getpid)
        PlatformCollector(registry=registry)
    return generate_latest(registry)
