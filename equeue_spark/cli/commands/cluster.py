"""``equeue cluster``: the brokers and topic routes the name servers know."""

from __future__ import annotations

import argparse

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli.common import admin_client
from equeue_spark.cli.formatting import Output, format_table, format_time, proto_dict


def cmd_cluster_list(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args, cluster_view="equeue cluster list") as admin:
        brokers = admin.cluster_brokers(args.cluster)
    if ui.json:
        ui.document({"brokers": [proto_dict(b) for b in brokers]})
        return
    if not brokers:
        ui.line("no live brokers")
        return
    rows = [
        (b.broker_name, b.cluster, _role(b), b.epoch, b.address, b.topics,
         format_time(b.last_registration_ms))
        for b in brokers
    ]  # fmt: skip
    headers = ("BROKER", "CLUSTER", "ROLE", "EPOCH", "ADDRESS", "TOPICS", "LAST REGISTRATION")
    ui.line(format_table(headers, rows))


def _role(entry: pb.BrokerEntry) -> str:
    """The registered role; a master routes leave out says so."""
    if entry.role == "master" and not entry.routed_master:
        return "master (not routed)"
    return entry.role or "master"


def cmd_cluster_routes(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args, cluster_view="equeue cluster routes") as admin:
        route = admin.route(args.topic)
    if ui.json:
        ui.document(
            {
                "topic": route.topic,
                "brokers": [proto_dict(b) for b in route.brokers],
                "queues": [list(q) for q in route.queues()],
            }
        )
        return
    ui.line(f"topic {route.topic}  brokers {len(route.brokers)}  queues {len(route.queues())}")
    groups = [
        (b.broker_name, b.address or None, b.epoch, ", ".join(b.replica_addresses) or None)
        for b in route.brokers
    ]
    ui.line(format_table(("BROKER", "MASTER", "EPOCH", "REPLICAS"), groups))
    rows = [
        (b.broker_name, b.address or None, q.queue_id, q.writable, q.readable)
        for b in route.brokers
        for q in b.queues
    ]
    ui.line(format_table(("BROKER", "ADDRESS", "QUEUE", "WRITABLE", "READABLE"), rows))
