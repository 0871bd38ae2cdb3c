"""``equeue groups``: list, describe, reset and delete consumer groups."""

from __future__ import annotations

import argparse
from typing import Any

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli.common import CliError, admin_client
from equeue_spark.cli.formatting import (
    Output,
    format_pairs,
    format_partial,
    format_table,
    format_time,
    proto_dict,
)
from equeue_spark.client.admin import Admin
from equeue_spark.client.errors import EqueueError, NotFoundError, PreconditionError


def _show_group(
    ui: Output, info: pb.GroupInfo, headline: str | None = None, why: dict[str, str] | None = None
) -> None:
    if ui.json:
        ui.document(proto_dict(info))
        return
    if headline:
        ui.line(headline)
    ui.line(f"group {info.group}")
    brokers = any(q.broker for q in info.queues)
    rows = [
        (
            *((q.broker,) if brokers else ()),
            q.topic,
            q.queue_id,
            None if q.committed_offset < 0 else q.committed_offset,
            q.end_offset,
            q.lag,
            lag_seconds(q.lag, q.lag_ms),
            q.consumer_id or None,
        )
        for q in info.queues
    ]
    headers = ("TOPIC", "QUEUE", "COMMITTED", "END", "LAG", "LAG_S", "CONSUMER")
    ui.line(format_table((*(("BROKER",) if brokers else ()), *headers), rows))
    ui.line()
    consumers = ", ".join(info.consumer_ids) or "none"
    ui.line(format_pairs([
        ("total lag", info.total_lag),
        ("max lag (s)", lag_seconds(info.total_lag, info.max_lag_ms)),
        ("live consumers", consumers),
    ]))  # fmt: skip
    if info.unreachable_brokers:
        what = "the group's queues there and their lag are not counted"
        ui.line(format_partial(info.unreachable_brokers, why or {}, what))


def lag_seconds(lag: int, lag_ms: int) -> float | None:
    """LAG_S: how old the first unconsumed message is, in seconds; 0 without
    lag; None (shown "-") for a lag without an age, which a broker without the
    "lag_ms" feature (BrokerStats.features) sends."""
    if lag <= 0:
        return 0.0
    return lag_ms / 1000 if lag_ms > 0 else None


def cmd_groups_list(args: argparse.Namespace, ui: Output) -> None:
    rows: list[dict[str, Any]] = []
    missing: set[str] = set()
    with admin_client(args) as admin:
        for group in admin.list_groups():
            try:
                info = admin.describe_group(group)
            except EqueueError:  # deleted meanwhile, or its offsets just expired
                rows.append({"group": group, "topics": [], "total_lag": None, "consumers": None})
                continue
            missing.update(info.unreachable_brokers)
            topics = sorted({q.topic for q in info.queues})
            consumers = len(info.consumer_ids)
            rows.append(
                {
                    "group": group,
                    "topics": topics,
                    "total_lag": info.total_lag,
                    "consumers": consumers,
                }
            )
        why = admin.down_brokers() if missing else {}
    if ui.json:
        unreachable = [{"broker": b, "why": why.get(b, "not answering")} for b in sorted(missing)]
        ui.document({"groups": rows, "unreachable_brokers": unreachable})
        return
    if not rows:
        ui.line("no groups")
    else:
        table = [
            (r["group"], ", ".join(r["topics"]) or None, r["total_lag"], r["consumers"])
            for r in rows
        ]
        ui.line(format_table(("GROUP", "TOPICS", "TOTAL LAG", "CONSUMERS"), table))
    if missing:
        what = "groups and lag there are not counted"
        ui.line(format_partial(sorted(missing), why, what))


def cmd_groups_describe(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        info = admin.describe_group(args.group)
        why = admin.down_brokers() if info.unreachable_brokers else {}
    _show_group(ui, info, why=why)


def _refuse_live_members(admin: Admin, args: argparse.Namespace, action: str) -> None:
    """Without ``--force``, refuse to change a group that has live members:
    they would go on committing their own positions over the change."""
    if args.force:
        return
    try:
        members = list(admin.describe_group(args.group).consumer_ids)
    except NotFoundError:  # no such group yet: nobody to disturb
        return
    except PreconditionError:
        # The broker lost the group's committed offsets (damaged offsets.json) and
        # refuses to describe it until it is reset: the reset is what is asked for.
        # A live member still cannot be overridden: the broker refuses a reset of
        # a queue a member holds.
        return
    if members:
        count = f"{len(members)} live member{'s' if len(members) != 1 else ''}"
        raise CliError(
            f"group {args.group} has {count} ({', '.join(sorted(members))}); stop them "
            f"first, or give --force to {action} anyway (they may commit over it)"
        )


def cmd_groups_reset(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        _refuse_live_members(admin, args, "reset it")
        if args.to_earliest:
            info = admin.reset_offsets(args.group, args.topic, to="earliest")
            where = "the earliest offsets"
        elif args.to_latest:
            info = admin.reset_offsets(args.group, args.topic, to="latest")
            where = "the latest offsets"
        elif args.to_timestamp is not None:
            info = admin.reset_offsets(args.group, args.topic, timestamp_ms=args.to_timestamp)
            where = f"timestamp {format_time(args.to_timestamp)}"
        else:
            offsets = dict(args.to_offset)
            info = admin.reset_offsets(
                args.group, args.topic, offsets=offsets, broker=args.on_broker or ""
            )
            where = ", ".join(f"queue {q} offset {o}" for q, o in sorted(offsets.items()))
    _show_group(ui, info, f"reset group {args.group} on topic {args.topic} to {where}")


def cmd_groups_delete(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        _refuse_live_members(admin, args, "delete it")
        admin.delete_group(args.group)
    if ui.json:
        ui.document({"group": args.group, "deleted": True})
    else:
        ui.line(f"deleted group {args.group}")
