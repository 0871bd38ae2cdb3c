"""The console's view of the cluster after one poll round: an immutable
``Snapshot`` of JSON-ready rows, built from the client's replies by pure
functions (no RPC here: poller.py asks, this shapes). The shapes are the
JSON API's (docs/console.md): handlers serve them as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from equeue_proto.retry_topics import DLQ_PREFIX, RESENT_PREFIX, RETRY_PREFIX
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.admin import MemberStats

Row = dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """One round's figures; published by one attribute assignment, never changed."""

    round: int
    """Rounds completed before this one (0 for the first)."""
    at_ms: int
    """When the round started (ms since the epoch)."""
    members: tuple[Row, ...] = ()
    topics: tuple[Row, ...] = ()
    groups: tuple[Row, ...] = ()
    transactions: tuple[Row, ...] = ()
    namesrvs: tuple[Row, ...] = ()
    """Each name server: ``address``, ``state`` ("up" or "down"), ``brokers``
    (members it lists), ``error``; empty for one broker."""
    errors: tuple[str, ...] = ()
    """What failed in this round (a figure from the round before is kept then)."""
    poll_seconds: float = 0.0
    stale: frozenset[str] = field(default_factory=frozenset)
    """Sections ("members", "topics", "groups", "transactions") carried over
    from an earlier round because this round could not get them."""

    def topic(self, name: str) -> Row | None:
        return next((t for t in self.topics if t["name"] == name), None)

    def group(self, name: str) -> Row | None:
        return next((g for g in self.groups if g["group"] == name), None)


EMPTY = Snapshot(round=-1, at_ms=0)
"""Before the first round."""


def member_row(member: MemberStats, in_rate: float | None, out_rate: float | None) -> Row:
    """A member of the cluster (the cluster page's row)."""
    entry, stats = member.entry, member.stats
    row: Row = {
        "broker": entry.broker_name,
        "address": entry.address,
        "cluster": entry.cluster,
        "instance_id": entry.instance_id,
        "role": (stats.role if stats else "") or entry.role or "master",
        "epoch": stats.epoch if stats else entry.epoch,
        "state": member.state,
        "routed_master": entry.routed_master,
        "silent_ms": entry.silent_ms,
        "error": member.error,
        "in_rate": in_rate,
        "out_rate": out_rate,
    }
    if stats is None:
        row.update(stats=None, replicas=[])
        return row
    row["stats"] = {
        "broker_id": stats.broker_id,
        "uptime_s": stats.uptime_s,
        "topics": stats.topics,
        "queues": stats.queues,
        "groups": stats.groups,
        "total_backlog": stats.total_backlog,
        "produced_total": stats.produced_total,
        "consumed_total": stats.consumed_total,
        "disk_used_bytes": stats.bytes_on_disk,
        "disk_free_bytes": stats.data_dir_free_bytes,
        "disk_size_bytes": stats.data_dir_size_bytes,
        "open_transactions": stats.open_transactions,
        "staged_bytes": stats.staged_bytes,
        "delayed_pending": stats.delayed_pending,
        "delayed_next_due_ms": stats.delayed_next_due_ms,
        "master": stats.master,
        "replication": stats.replication,
        "log_end_position": stats.log_end_position,
        "high_watermark": stats.high_watermark,
        "in_sync": list(stats.in_sync),
        "retention_max_age_ms": stats.retention_max_age_ms,
        "retention_max_bytes": stats.retention_max_bytes,
        "flush_mode": stats.flush_mode,
        "features": list(stats.features),
    }
    row["replicas"] = [replica_row(r) for r in stats.replicas]
    return row


def replica_row(replica: pb.ReplicaStatus) -> Row:
    return {
        "address": replica.address,
        "replica_id": replica.replica_id,
        "lag_bytes": replica.lag_bytes,
        "in_sync": replica.in_sync,
        "connected": replica.connected,
        "last_seen_s": replica.last_seen_s,
    }


def queue_row(queue: pb.QueueInfo) -> Row:
    return {
        "broker": queue.broker,
        "queue_id": queue.queue_id,
        "earliest_offset": queue.earliest_offset,
        "end_offset": queue.end_offset,
        "stored": queue.end_offset - queue.earliest_offset,
        "min_committed_offset": queue.min_committed_offset,
        "backlog": queue.backlog,
        "producer_visible": queue.producer_visible,
        "consumer_visible": queue.consumer_visible,
    }


def topic_row(info: pb.TopicInfo, rates: Mapping[str, tuple[float | None, float | None]]) -> Row:
    """A topic with its queues; ``rates`` {topic: (in msg/s, out msg/s)}."""
    queues = [queue_row(q) for q in info.queues]
    in_rate, out_rate = rates.get(info.name, (None, None))
    return {
        "name": info.name,
        "internal": info.name.startswith("%"),
        "brokers": sorted({q["broker"] for q in queues}),
        "queue_count": len(queues),
        "stored": sum(q["stored"] for q in queues),
        "end_offset_sum": sum(q["end_offset"] for q in queues),
        "backlog": sum(q["backlog"] for q in queues),
        "in_rate": in_rate,
        "out_rate": out_rate,
        "delayed_pending": info.delayed_pending,
        "delayed_next_due_ms": info.delayed_next_due_ms,
        "created_ms": info.created_ms,
        "unreachable_brokers": list(info.unreachable_brokers),
        "queues": queues,
    }


def group_row(info: pb.GroupInfo, topic_sizes: Mapping[str, int]) -> Row:
    """A group's lag per queue and per topic; retry and DLQ figures from the
    sizes of its ``%RETRY%``/``%DLQ%``/``%RESENT%`` topics (``topic_sizes``:
    stored messages by topic name)."""
    queues: list[Row] = [
        {
            "broker": q.broker,
            "topic": q.topic,
            "queue_id": q.queue_id,
            "committed_offset": q.committed_offset,
            "end_offset": q.end_offset,
            "lag": q.lag,
            "lag_ms": q.lag_ms,
            "consumer_id": q.consumer_id,
        }
        for q in info.queues
    ]
    lag_by_topic: dict[str, int] = {}
    lag_ms_by_topic: dict[str, int] = {}
    for q in queues:
        lag_by_topic[q["topic"]] = lag_by_topic.get(q["topic"], 0) + q["lag"]
        lag_ms_by_topic[q["topic"]] = max(lag_ms_by_topic.get(q["topic"], 0), q["lag_ms"])
    group = info.group
    return {
        "group": group,
        "members": list(info.consumer_ids),
        "total_lag": info.total_lag,
        "max_lag_ms": info.max_lag_ms,
        "topics": [
            {"topic": t, "lag": lag_by_topic[t], "lag_ms": lag_ms_by_topic[t]}
            for t in sorted(lag_by_topic)
        ],
        "retry_messages": topic_sizes.get(RETRY_PREFIX + group, 0),
        "dlq_messages": topic_sizes.get(DLQ_PREFIX + group, 0),
        "dlq_resent": topic_sizes.get(RESENT_PREFIX + group, 0),
        "unreachable_brokers": list(info.unreachable_brokers),
        "queues": queues,
    }


def transaction_rows(broker: str, reply: pb.ListTransactionsReply, now_ms: int) -> list[Row]:
    """A broker group's open transactions."""
    return [
        {
            "broker": broker,
            "transaction_id": t.transaction_id,
            "group": t.group,
            "age_ms": max(0, now_ms - t.created_ms),
            "created_ms": t.created_ms,
            "last_write_ms": t.last_write_ms,
            "messages": t.messages,
            "bytes": t.bytes,
            "committing": t.committing,
            "checks": t.checks,
            "next_check_ms": t.next_check_ms,
        }
        for t in reply.transactions
    ]


def topic_sizes(topics: Iterable[Row]) -> dict[str, int]:
    return {t["name"]: t["stored"] for t in topics}
