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

``METRICS`` (metrics_specs.py, re-exported here) is the one list of names,
types, labels and help texts: docs/metrics.md is checked against it, and the
console's alarms and the Grafana dashboard use these names.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
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
from equeue_broker.server.connections import CallsPerConnection, connections_by_address
from equeue_broker.server.disk_usage import filesystem
from equeue_broker.server.fetch_port import fetch_server
from equeue_broker.server.group_view import StoreTimes, group_queues
from equeue_broker.server.metrics_hot import RPC_TIMES, STREAM_TIMES
from equeue_broker.server.metrics_specs import METRICS, SPECS, Spec
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

__all__ = ["METRICS", "SPECS", "BrokerCollector", "Budgets", "Spec", "render"]


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
    calls: CallsPerConnection | None = None
    """The per-connection call limit (its counts are the calls in flight)."""
    grpc_port: int = 0
    """The gRPC port bound (its established connections are counted; 0: not)."""
    max_connections: int = 0
    """gRPC's ``grpc.max_allowed_incoming_connections`` (app.max_connections)."""
    store_times: StoreTimes | None = None
    """Store times of first unconsumed offsets, kept between scrapes (group lag seconds)."""


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
        self._connections(out)
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
        times = self.extra.store_times
        if times is not None:
            times = times.in_epoch(s.role.view.epoch)
        topic_sums: dict[tuple[str, str], list[float]] = {}
        group_sums: dict[tuple[str, str], float] = {}
        per_queue: list[tuple[str, str, str, int, int]] = []
        for group in groups:
            shown = label(group)
            group_sums[("equeue_group_members", shown)] = group_sums.get(
                ("equeue_group_members", shown), 0
            ) + len(s.consumers.live(group))
            for view in group_queues(s.store, s.consumers, group, now_ms, times):
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

    def _connections(self, out: Families) -> None:
        """What bounds clients' connections and calls: gRPC's connection cap
        (``max_connections``, enforced by gRPC, which does not say how many it
        holds: counted from /proc/net/tcp, as ``AddressLimit`` does), the
        broker's per-connection call limit, the stream limits, the fetch port's."""
        if self.scope is not None:
            return
        s, extra = self.state, self.extra
        if extra.grpc_port and Path("/proc/net/tcp").exists():
            found = connections_by_address(extra.grpc_port)
            out.add("equeue_connections", sum(len(inodes) for inodes in found.values()))
        if extra.max_connections:
            out.add("equeue_connections_limit", extra.max_connections)
        if extra.calls is not None:
            live = extra.calls.live.copy()  # one C call under the GIL: no torn read
            out.add("equeue_calls_in_flight", sum(live.values()))
            out.add("equeue_connection_calls_max", max(live.values(), default=0))
            out.add("equeue_connection_calls_limit", extra.calls.limit)
        for kind, open_, limit in (
            ("pull", s.pull_streams, s.config.max_pull_streams),
            ("produce", s.produce_streams, s.config.max_produce_streams),
        ):
            out.add("equeue_streams", open_, kind)
            out.add("equeue_streams_limit", limit, kind)
        fetch = fetch_server(s)
        if fetch is not None:
            out.add("equeue_fetch_connections", fetch.open)
            out.add("equeue_fetch_connections_limit", fetch.limit)


def render(state: BrokerState, extra: Budgets, scope: Principal | None) -> bytes:
    """The text exposition for ``scope`` (the HTTP listener's metrics thread)."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from equeue_broker.server.metrics_text import exposition

    # Our families by the fast writer (metrics_text.py: the same bytes), the
    # process and platform ones by prometheus_client, in the order
    # generate_latest would give a registry holding all three.
    ours = exposition(BrokerCollector(state, extra, scope).collect()).encode()
    if scope is not None and scope.topics is not None:
        return ours
    from prometheus_client import PlatformCollector, ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry, pid=os.getpid)
    PlatformCollector(registry=registry)
    return ours + generate_latest(registry)
