"""``equeue topics``: create, list, describe and delete topics and their queues."""

from __future__ import annotations

import argparse

import grpc

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli.common import UsageError, admin_client, split_names
from equeue_spark.cli.formatting import (
    Output,
    format_partial,
    format_table,
    format_time,
    proto_dict,
)
from equeue_spark.client.admin import Admin
from equeue_spark.client.errors import BrokerError, NotFoundError, PermissionDeniedError
from equeue_spark.client.schema_admin import rule_name, subject, type_name


def _show_topic(
    ui: Output,
    info: pb.TopicInfo,
    headline: str | None = None,
    why: dict[str, str] | None = None,
    schemas: dict[str, pb.SchemaInfo] | None = None,
) -> None:
    if ui.json:
        extra = {f"{s}_schema": proto_dict(i) for s, i in (schemas or {}).items()}
        ui.document({**proto_dict(info), **extra})
        return
    if headline:
        ui.line(headline)
    ui.line(
        f"topic {info.name}  created {format_time(info.created_ms)}  queues {len(info.queues)}"
        f"  incarnation {info.incarnation}"
    )
    brokers = any(q.broker for q in info.queues)
    rows = [
        (
            *((q.broker,) if brokers else ()),
            q.queue_id,
            q.earliest_offset,
            q.end_offset,
            None if q.min_committed_offset < 0 else q.min_committed_offset,
            q.backlog,
            q.producer_visible,
            q.consumer_visible,
        )
        for q in info.queues
    ]
    headers = (
        *(("BROKER",) if brokers else ()),
        "QUEUE",
        "EARLIEST",
        "END",
        "MIN COMMITTED",
        "BACKLOG",
        "PRODUCER",
        "CONSUMER",
    )
    ui.line(format_table(headers, rows))
    if info.delayed_pending:
        ui.line(
            f"delayed: {info.delayed_pending} pending, next due "
            f"{format_time(info.delayed_next_due_ms)}"
        )
    for which, schema in (schemas or {}).items():
        version = schema.versions[-1]
        kind, rule = type_name(version.type), rule_name(schema.compatibility)
        ui.line(f"{which} schema: v{version.version} {kind} {rule}")
    if info.unreachable_brokers:
        ui.line(format_partial(info.unreachable_brokers, why or {}, "its queues are not shown"))


def _schemas(admin: Admin, topic: str) -> dict[str, pb.SchemaInfo]:
    """The topic's latest value and key schemas ({"value": ..., "key": ...},
    those it has); none from a broker without schemas (UNIMPLEMENTED) or for
    a token that may not read them."""
    out = {}
    for key in (False, True):
        try:
            out[subject(key)] = admin.get_schema(topic, key=key)
        except NotFoundError:
            continue
        except PermissionDeniedError:  # a token without the topic's produce/consume role
            break
        except BrokerError as exc:
            if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            break
    return out


def cmd_topics_create(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        info = admin.create_topic(args.name, queues=args.queues, brokers=split_names(args.brokers))
    _show_topic(ui, info, f"created topic {info.name} with {len(info.queues)} queues")


def cmd_topics_list(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        topics = admin.list_topics()
        missing = sorted({b for t in topics for b in t.unreachable_brokers})
        why = admin.down_brokers() if missing else {}
    if ui.json:
        ui.document(
            {
                "topics": [proto_dict(t) for t in topics],
                "unreachable_brokers": [
                    {"broker": b, "why": why.get(b, "not answering")} for b in missing
                ],
            }
        )
        return
    if not topics:
        ui.line("no topics")
        return
    rows = [
        (
            t.name,
            len(t.queues),
            sum(q.end_offset - q.earliest_offset for q in t.queues),
            sum(q.backlog for q in t.queues),
            format_time(t.created_ms),
        )
        for t in topics
    ]
    ui.line(format_table(("TOPIC", "QUEUES", "MESSAGES", "BACKLOG", "CREATED"), rows))
    if missing:
        hit = ", ".join(t.name for t in topics if t.unreachable_brokers)
        ui.line(format_partial(missing, why, f"their queues are not counted (topics {hit})"))


def cmd_topics_describe(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        info = admin.describe_topic(args.name)
        why = admin.down_brokers() if info.unreachable_brokers else {}
        schemas = _schemas(admin, args.name)
    _show_topic(ui, info, why=why, schemas=schemas)


def cmd_topics_delete(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        admin.delete_topic(args.name)
    if ui.json:
        ui.document({"topic": args.name, "deleted": True})
    else:
        ui.line(f"deleted topic {args.name}")


def cmd_topics_add_queue(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        info = admin.add_queues(args.name, args.count, brokers=split_names(args.brokers))
    _show_topic(ui, info, f"added {args.count} queue(s) to topic {info.name}")


def cmd_topics_set_visibility(args: argparse.Namespace, ui: Output) -> None:
    if args.producer is None and args.consumer is None:
        raise UsageError("give --producer on|off and/or --consumer on|off")
    with admin_client(args) as admin:
        info = admin.set_queue_visibility(
            args.name,
            args.queue,
            producer=args.producer,
            consumer=args.consumer,
            broker=args.on_broker or "",
        )
    _show_topic(ui, info, f"set visibility of queue {args.queue} of topic {info.name}")


def cmd_topics_delete_queue(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        info = admin.delete_queue(
            args.name, args.queue, force=args.force, broker=args.on_broker or ""
        )
    _show_topic(ui, info, f"deleted queue {args.queue} of topic {info.name}")
