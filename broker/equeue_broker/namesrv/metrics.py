"""The name server's Prometheus metrics: ``METRICS`` and ``render``.

The route table is soft state owned by the event loop (routes.py), so the
metrics thread does not read it: ``render`` asks the loop for a snapshot
(``RouteTable.brokers``, bounded by ``max_brokers``) and builds the families
from that. Every series carries ``namesrv`` = its ``host:port`` (name
servers have no name); Prometheus adds ``instance`` and ``job``.
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from equeue_broker.namesrv.routes import DOWN, LIVE, SUSPECT, RouteTable
from equeue_broker.server.metrics_specs import Spec
from equeue_proto.v1 import broker_pb2 as pb

if TYPE_CHECKING:
    from equeue_broker.namesrv.counts import Counts

N = ("namesrv",)
METRICS: tuple[Spec, ...] = (
    Spec(
        "equeue_namesrv_members",
        "gauge",
        (*N, "cluster", "state"),
        "Registered brokers by state (live, suspect, down)",
    ),
    Spec(
        "equeue_namesrv_member_up",
        "gauge",
        (*N, "cluster", "broker", "address", "role"),
        "1 while the member is live or suspect, 0 once down",
    ),
    Spec(
        "equeue_namesrv_member_silent_seconds",
        "gauge",
        (*N, "cluster", "broker", "address"),
        "Seconds since the member last registered",
    ),
    Spec(
        "equeue_namesrv_member_epoch",
        "gauge",
        (*N, "cluster", "broker", "address"),
        "The newest group epoch the member registered",
    ),
    Spec(
        "equeue_namesrv_groups_without_master",
        "gauge",
        (*N, "cluster"),
        "Broker groups whose routes name no master",
    ),
    Spec(
        "equeue_namesrv_topics",
        "gauge",
        (*N, "cluster"),
        "Topics registered by the cluster's brokers",
    ),
    Spec(
        "equeue_namesrv_registrations_total",
        "counter",
        (*N, "result"),
        "RegisterBroker calls, accepted or refused",
    ),
    Spec(
        "equeue_namesrv_route_requests_total",
        "counter",
        (*N, "result"),
        "GetRoute calls by result (ok, not_found, denied)",
    ),
    Spec(
        "equeue_namesrv_rpc_duration_seconds",
        "histogram",
        (*N, "method", "code"),
        "The name server's RPC durations by method and status",
    ),
)
"""Every family the name server exports (besides process_* and python_*)."""

SNAPSHOT_TIMEOUT_S = 5.0


class _Snapshot(Collector):
    def __init__(self, name: str, members: list[pb.BrokerEntry], counts: Counts) -> None:
        self.name = name
        self.members = members
        self.registrations = dict(counts.registrations)
        self.routes = dict(counts.routes)
        self.times = counts.times.snapshot()
        self.buckets = counts.times.buckets

    def collect(self) -> Iterable[Metric]:
        fam = {s.name: s for s in METRICS}
        members = GaugeMetricFamily(*_args(fam["equeue_namesrv_members"]))
        up = GaugeMetricFamily(*_args(fam["equeue_namesrv_member_up"]))
        silent = GaugeMetricFamily(*_args(fam["equeue_namesrv_member_silent_seconds"]))
        epoch = GaugeMetricFamily(*_args(fam["equeue_namesrv_member_epoch"]))
        masterless = GaugeMetricFamily(*_args(fam["equeue_namesrv_groups_without_master"]))
        topics = GaugeMetricFamily(*_args(fam["equeue_namesrv_topics"]))
        states: collections.Counter[tuple[str, str]] = collections.Counter()
        names: dict[str, set[str]] = collections.defaultdict(set)
        groups: dict[str, dict[str, bool]] = collections.defaultdict(dict)
        for m in self.members:
            states[(m.cluster, m.state)] += 1
            where = [self.name, m.cluster, m.broker_name, m.address]
            up.add_metric([*where, m.role], 0 if m.state == DOWN else 1)
            silent.add_metric(where, m.silent_ms / 1000)
            epoch.add_metric(where, m.epoch)
            if m.state != DOWN:
                names[m.cluster].update(m.topic_names)
                has = groups[m.cluster].get(m.broker_name, False)
                groups[m.cluster][m.broker_name] = has or m.routed_master
        for cluster in sorted({m.cluster for m in self.members}):
            for state in (LIVE, SUSPECT, DOWN):
                members.add_metric([self.name, cluster, state], states[(cluster, state)])
            masterless.add_metric(
                [self.name, cluster], sum(1 for has in groups[cluster].values() if not has)
            )
            topics.add_metric([self.name, cluster], len(names[cluster]))
        yield from (members, up, silent, epoch, masterless, topics)
        for name, counted, results in (
            ("equeue_namesrv_registrations_total", self.registrations, ("accepted", "refused")),
            ("equeue_namesrv_route_requests_total", self.routes, ("ok", "not_found", "denied")),
        ):
            counter = CounterMetricFamily(*_args(fam[name]))
            for result in results:
                counter.add_metric([self.name, result], counted.get(result, 0))
            yield counter
        spec = fam["equeue_namesrv_rpc_duration_seconds"]
        rpc = HistogramMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for (method, code), (counts, total) in sorted(self.times.items()):
            cumulative: list[tuple[str, float]] = []
            running = 0
            for bound, count in zip((*self.buckets, float("inf")), counts, strict=True):
                running += count
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
            rpc.add_metric([self.name, method, code], cumulative, total)
        yield rpc


def _args(spec: Spec) -> tuple[str, str, None, list[str]]:
    """(name, help, value, labels) as the metric families take them."""
    return spec.name.removesuffix("_total"), spec.help, None, list(spec.labels)


def render(loop: asyncio.AbstractEventLoop, name: str, table: RouteTable, counts: Counts) -> bytes:
    """The exposition (on the metrics thread; the snapshot is taken on the loop)."""

    async def snapshot() -> _Snapshot:
        members = table.brokers(include_down=True, with_topic_names=True)
        return _Snapshot(name, members, counts)

    taken = asyncio.run_coroutine_threadsafe(snapshot(), loop).result(SNAPSHOT_TIMEOUT_S)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(taken)
    ProcessCollector(registry=registry, pid=os.getpid)
    PlatformCollector(registry=registry)
    return generate_latest(registry)
