"""``equeue cluster``: the brokers and topic routes the name servers know."""

from __future__ import annotations

import argparse
from typing import Any

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli.common import admin_client
from equeue_spark.cli.formatting import Output, format_table, format_time, proto_dict
from equeue_spark.client.admin import PROBE_TIMEOUT_S, MemberStats


def cmd_cluster_list(args: argparse.Namespace, ui: Output) -> None:
    """Every member the name servers know, each probed at once (GetStats, a
    short deadline): a member that does not answer shows as unreachable at
    once, before its registration is late (suspect) or expires (down)."""
    with admin_client(args, cluster_view="equeue cluster list") as admin:
        members = admin.cluster_stats(args.cluster, probe_timeout(args))
    if ui.json:
        ui.document({"brokers": [_member_dict(m) for m in members]})
        return
    if not members:
        ui.line("no live brokers")
        return
    rows = [
        (m.entry.broker_name, m.entry.cluster, _role(m.entry), m.entry.epoch, m.entry.address,
         state_text(m), m.entry.topics, format_time(m.entry.last_registration_ms))
        for m in members
    ]  # fmt: skip
    headers = (
        "BROKER", "CLUSTER", "ROLE", "EPOCH", "ADDRESS", "STATE", "TOPICS", "LAST REGISTRATION"
    )  # fmt: skip
    ui.line(format_table(headers, rows))


def probe_timeout(args: argparse.Namespace) -> float:
    """How long a member has to answer a probe: ``--timeout-s``, at most 2 s."""
    return min(args.timeout_s or PROBE_TIMEOUT_S, PROBE_TIMEOUT_S)


def state_text(m: MemberStats) -> str:
    """``live``; ``suspect (silent 7 s)``; ``unreachable``; ``down (silent 40 s)``."""
    if m.state in ("suspect", "down"):
        return f"{m.state} (silent {m.entry.silent_ms / 1000:.0f} s)"
    return m.state


def _member_dict(m: MemberStats) -> dict[str, Any]:
    """A member as JSON: its ``BrokerEntry`` with ``state`` as the client saw it
    (``unreachable`` when the probe failed) and ``error``."""
    out = proto_dict(m.entry)
    del out["topic_names"]
    out["state"] = m.state
    out["error"] = m.error or None
    return out


def _role(entry: pb.BrokerEntry) -> str:
    """The registered role; a master routes leave out says so."""
    if entry.role == "master" and not entry.routed_master:
        return "master (not routed)"
    return entry.role or "master"


def _schema_versions(entry: pb.BrokerRoute) -> str | None:
    """``v3`` (value), ``v3 key v1``: the latest schema versions the group registered."""
    parts = [f"v{entry.value_schema_version}"] if entry.value_schema_version else []
    if entry.key_schema_version:
        parts.append(f"key v{entry.key_schema_version}")
    return " ".join(parts) or None


def cmd_cluster_routes(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args, cluster_view="equeue cluster routes") as admin:
        route = admin.route(args.topic)
    if ui.json:
        ui.document(
            {
                "topic": route.topic,
                "brokers": [proto_dict(b) for b in route.brokers],
                "queues": [list(q) for q in route.queues()],
                "down_brokers": list(route.down),
            }
        )
        return
    ui.line(f"topic {route.topic}  brokers {len(route.brokers)}  queues {len(route.queues())}")
    if route.down:
        ui.line(f"down: {', '.join(route.down)} (hosted the topic; registrations expired)")
    groups = [
        (b.broker_name, b.address or None, b.epoch, ", ".join(b.replica_addresses) or None,
         _schema_versions(b))
        for b in route.brokers
    ]  # fmt: skip
    ui.line(format_table(("BROKER", "MASTER", "EPOCH", "REPLICAS", "SCHEMA"), groups))
    rows = [
        (b.broker_name, b.address or None, q.queue_id, q.writable, q.readable)
        for b in route.brokers
        for q in b.queues
    ]
    ui.line(format_table(("BROKER", "ADDRESS", "QUEUE", "WRITABLE", "READABLE"), rows))
