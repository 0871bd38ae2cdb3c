"""``equeue cluster``: the brokers and topic routes the name servers know."""

from __future__ import annotations

import argparse

from equeue_spark.cli.common import UsageError, admin_client, is_cluster
from equeue_spark.cli.formatting import Output, format_table, format_time, proto_dict


def _need_namesrv(args: argparse.Namespace) -> None:
    if not is_cluster(args):
        raise UsageError("give the cluster's name servers: --namesrv HOST:PORT[,...]")


def cmd_cluster_list(args: argparse.Namespace, ui: Output) -> None:
    _need_namesrv(args)
    with admin_client(args) as admin:
        brokers = admin.cluster_brokers(args.cluster)
    if ui.json:
        ui.document({"brokers": [proto_dict(b) for b in brokers]})
        return
    if not brokers:
        ui.line("no live brokers")
        return
    rows = [
        (b.broker_name, b.cluster, b.replica_id, b.address, b.topics,
         format_time(b.last_registration_ms))
        for b in brokers
    ]  # fmt: skip
    headers = ("BROKER", "CLUSTER", "REPLICA", "ADDRESS", "TOPICS", "LAST REGISTRATION")
    ui.line(format_table(headers, rows))


def cmd_cluster_routes(args: argparse.Namespace, ui: Output) -> None:
    _need_namesrv(args)
    with admin_client(args) as admin:
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
    rows = [
        (b.broker_name, b.address or None, q.queue_id, q.writable, q.readable)
        for b in route.brokers
        for q in b.queues
    ]
    ui.line(format_table(("BROKER", "ADDRESS", "QUEUE", "WRITABLE", "READABLE"), rows))
