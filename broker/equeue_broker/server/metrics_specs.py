"""The broker's metric families: names, types, labels and help texts.

``METRICS`` is the one list: docs/metrics.md is checked against it
(tests/project/test_metrics_doc.py), ``metrics.py``'s collector fills only
these families, and the console's alarms and the Grafana dashboard use these
names. Kept apart from the collector so that either stays readable.
"""

from __future__ import annotations

from typing import NamedTuple


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
        "equeue_connections",
        "gauge",
        B,
        "Established client connections to the gRPC port (read from /proc/net/tcp; "
        "absent without it)",
    ),
    Spec(
        "equeue_connections_limit",
        "gauge",
        B,
        "Connections the gRPC port admits at once (max_connections, enforced by gRPC)",
    ),
    Spec("equeue_calls_in_flight", "gauge", B, "gRPC calls being handled now, streams included"),
    Spec(
        "equeue_connection_calls_max",
        "gauge",
        B,
        "The most calls in flight on one connection now",
    ),
    Spec(
        "equeue_connection_calls_limit",
        "gauge",
        B,
        "Calls one connection may have in flight (max_streams_per_connection)",
    ),
    Spec(
        "equeue_streams",
        "gauge",
        ("broker", "kind"),
        "PullStream (kind=pull) or ProduceStream (kind=produce) calls open now",
    ),
    Spec(
        "equeue_streams_limit",
        "gauge",
        ("broker", "kind"),
        "The max_pull_streams or max_produce_streams setting",
    ),
    Spec(
        "equeue_fetch_connections",
        "gauge",
        B,
        "Connections open on the fetch port (absent when it does not listen)",
    ),
    Spec(
        "equeue_fetch_connections_limit",
        "gauge",
        B,
        "Connections the fetch port admits at once (max_connections)",
    ),
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
