"""``equeue message get|query`` and ``equeue stats``: messages, and the broker's statistics."""

from __future__ import annotations

import argparse
import sys
import time

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli.commands.cluster import probe_timeout, state_text
from equeue_spark.cli.common import CliError, UsageError, admin_client
from equeue_spark.cli.formatting import (
    Output,
    format_bytes,
    format_duration,
    format_pairs,
    format_table,
    format_time,
    message_dict,
    message_line,
    one_line,
    proto_dict,
)
from equeue_spark.client.admin import MemberStats
from equeue_spark.client.errors import InvalidRequest

MESSAGE_AT_NEEDS_BROKER = (
    "with --namesrv, get a message by its id (it names its broker), "
    "or give --broker for --topic/--queue/--offset"
)


def cmd_message_get(args: argparse.Namespace, ui: Output) -> None:
    address = (args.topic, args.queue, args.offset)
    if args.id is not None and any(a is not None for a in address):
        raise UsageError("give a message ID or --topic/--queue/--offset, not both")
    if args.id is None and any(a is None for a in address):
        raise UsageError("give a message ID, or all of --topic, --queue and --offset")
    with admin_client(args) as admin:
        if args.id is not None:
            m = admin.get_message(args.id)
        else:
            try:  # a queue of a cluster is (broker, queue id), and this has no broker
                admin.routes.group("", MESSAGE_AT_NEEDS_BROKER)
            except InvalidRequest as exc:
                raise UsageError(str(exc)) from None
            m = admin.get_message_at(args.topic, args.queue, args.offset)
    if args.raw:
        sys.stdout.flush()
        sys.stdout.buffer.write(m.value)
        sys.stdout.buffer.flush()
    elif ui.json:
        ui.document(message_dict(m))
    else:
        headers = ", ".join(f"{name}={one_line(value)}" for name, value in m.headers)
        ui.line(
            format_pairs(
                [
                    ("message id", m.message_id),
                    ("topic", m.topic),
                    ("queue", m.queue_id),
                    ("offset", m.offset),
                    ("key", None if m.key is None else one_line(m.key)),
                    ("tag", m.tag or None),
                    ("timestamp", f"{format_time(m.timestamp_ms)} ({m.timestamp_ms} ms)"),
                    ("stored", f"{format_time(m.store_timestamp_ms)} ({m.store_timestamp_ms} ms)"),
                    ("headers", headers or None),
                    ("size", f"{len(m.value)} bytes"),
                    ("value", one_line(m.value)),
                ]
            )
        )


def cmd_message_query(args: argparse.Namespace, ui: Output) -> None:
    """``message query TOPIC --key K [--since D | --from T --to T] [--limit N]``:
    newest first, one line each (a JSON line each with --json)."""
    if args.since is not None and (args.from_ms is not None or args.to_ms is not None):
        raise UsageError("give --since or --from/--to, not both")
    if args.key is None and args.since is None and args.from_ms is None and args.to_ms is None:
        raise UsageError("give --key, a time range (--since, --from/--to), or both")
    start, end = args.from_ms, args.to_ms
    if args.since is not None:
        start = int((time.time() - args.since) * 1000)
    if start is not None and end is not None and start >= end:
        raise UsageError(f"--from {start} is not before --to {end}: an empty range")
    with admin_client(args) as admin:
        shown_group = admin.routes.shown_group
        try:
            found = admin.query_messages(args.topic, args.key, start, end, args.limit)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    for m in found:
        broker = shown_group(m.broker_id)
        if ui.json:
            ui.json_line(message_dict(m, broker))
        else:
            ui.line(f"{m.message_id} {format_time(m.store_timestamp_ms)} {message_line(m, broker)}")
    if found.truncated:
        sys.stderr.write(
            f"equeue: {len(found)} shown; more may match: narrow the time range or raise --limit\n"
        )


def _replication(s: pb.BrokerStats) -> str:
    """``sync, min 2 in sync; in sync: a, b`` (a replica shows the mode alone)."""
    said = f"{s.replication or 'async'}, min {s.min_insync_replicas or 1} in sync"
    return said + (f"; in sync: {', '.join(s.in_sync)}" if s.in_sync else "")


def cmd_stats(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        # Two outputs on purpose, not a routing question (docs/cli.md "stats"):
        # one broker's are its own statistics, every field (--json: its
        # BrokerStats; a broker that does not answer fails the command, with
        # the connection's retries); a cluster's are a table of every member,
        # probed at once, where one that does not answer is a row. Routes
        # that name broker groups are a cluster's.
        if admin.routes.names_groups():
            members = admin.cluster_stats(timeout_s=probe_timeout(args))
            _cluster_stats(ui, members)
            return
        s = admin.stats()
    if ui.json:
        ui.document(proto_dict(s))
        return
    ui.line(
        format_pairs(
            [
                ("broker id", s.broker_id),
                ("topics", s.topics),
                ("queues", s.queues),
                ("groups", s.groups),
                ("total backlog", s.total_backlog),
                ("log chunks", s.chunk_count),
                ("bytes on disk", f"{format_bytes(s.bytes_on_disk)} ({s.bytes_on_disk} bytes)"),
                ("produce rate", f"{s.produce_rate:.1f} msg/s (last minute)"),
                ("consume rate", f"{s.consume_rate:.1f} msg/s (last minute)"),
                ("produced total", s.produced_total),
                ("consumed total", s.consumed_total),
                ("flush mode", s.flush_mode),
                ("uptime", format_duration(s.uptime_s)),
                (
                    "transactions",
                    f"{s.open_transactions} open, {format_bytes(s.staged_bytes)} staged",
                ),
                ("producer ids", s.idempotent_producers),
                ("delayed", _delayed(s.delayed_pending, s.delayed_next_due_ms)),
                ("role", f"{s.role or 'master'}" + (f", following {s.master}" if s.master else "")),
                ("epoch", f"{s.epoch} (failover: {s.failover or 'manual'})"),
                ("role since", _role_since(s)),
                ("log end", s.log_end_position),
                ("replication", _replication(s)),
                ("high watermark", s.high_watermark),
            ]
        )
    )
    for r in s.replicas:  # a master's view of each replica following it
        state = "connected" if r.connected else "disconnected"
        ui.line(
            f"replica {r.address}: at {r.position}, {format_bytes(r.lag_bytes)} behind, "
            f"{state}, last seen {r.last_seen_s:.1f} s ago, "
            f"{'in sync' if r.in_sync else 'not in sync'} (id {r.replica_id or '?'})"
        )
    # Damage is the one thing here an operator must act on: said last, one line each.
    for chunk in s.quarantined_chunks:
        ui.line(
            f"QUARANTINED chunk {chunk.file}: {chunk.reason} (log positions "
            f"[{chunk.start_position}, {chunk.end_position}) answer DATA_LOSS)"
        )
    for damaged in s.damaged_metadata:
        ui.line(f"DAMAGED metadata: {damaged}")


def _delayed(pending: int, next_due_ms: int) -> str:
    """``3 pending, next due 2027-...Z`` (``0 pending``)."""
    if not pending:
        return "0 pending"
    return f"{pending} pending, next due {format_time(next_due_ms)}"


def cmd_message_cancel(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        reply = admin.cancel_delayed(args.id)
    if ui.json:
        ui.document({"message_id": args.id, "cancelled": True, **proto_dict(reply)})
        return
    ui.line(
        f"cancelled {args.id} (was due {format_time(reply.deliver_at_ms)} "
        f"on {reply.topic}/{reply.queue_id})"
    )


def _role_since(s: pb.BrokerStats) -> str:
    """When and why the broker got its role ("-" from a broker that does not say)."""
    if not s.role_since_ms:
        return "-"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.role_since_ms / 1000))
    return f"{when} ({s.role_reason or 'no reason given'})"


def _cluster_stats(ui: Output, members: list[MemberStats]) -> None:
    """``equeue --namesrv ... stats``: one row per member of every broker group
    (role, epoch, state, replication lag as its master reports it, disk,
    rates, backlog), the replicas each master reports, and a line naming the
    members that could not be asked. Exit 1 when none answered."""
    lag = {
        r.address: r for m in members if m.stats is not None for r in m.stats.replicas
    }  # a replica's lag, as its master reports it
    missing = [m for m in members if m.stats is None]
    if ui.json:
        ui.document(
            {
                "brokers": [
                    {
                        "broker": m.entry.broker_name,
                        "address": m.entry.address,
                        "role": (m.stats.role if m.stats else m.entry.role) or "master",
                        "epoch": m.stats.epoch if m.stats else m.entry.epoch,
                        "state": m.state,
                        "error": m.error or None,
                        "stats": proto_dict(m.stats) if m.stats is not None else None,
                    }
                    for m in members
                ],
                "unreachable": [
                    {"broker": m.entry.broker_name, "address": m.entry.address,
                     "state": m.state, "error": m.error}
                    for m in missing
                ],
            }
        )  # fmt: skip
    else:
        rows = []
        for m in members:
            s = m.stats
            behind = lag.get(m.entry.address)
            rows.append(
                (
                    m.entry.broker_name,
                    (s.role if s else m.entry.role) or "master",
                    s.epoch if s else m.entry.epoch,
                    m.entry.address,
                    state_text(m),
                    None
                    if behind is None
                    else format_bytes(behind.lag_bytes)
                    + ("" if behind.in_sync else " (not in sync)"),
                    None if s is None else format_bytes(s.bytes_on_disk),
                    None if s is None else s.produce_rate,
                    None if s is None else s.consume_rate,
                    None if s is None else s.total_backlog,
                    None if s is None else s.delayed_pending,
                )
            )
        headers = ("BROKER", "ROLE", "EPOCH", "ADDRESS", "STATE", "LAG", "DISK",
                   "PRODUCE/S", "CONSUME/S", "BACKLOG", "DELAYED")  # fmt: skip
        ui.line(format_table(headers, rows) if rows else "no brokers")
        for m in missing:
            ui.line(f"no stats from {m.entry.broker_name} ({m.entry.address}): {m.state}: "
                    f"{m.error}")  # fmt: skip
    if members and len(missing) == len(members):
        raise CliError("no broker answered (see above); check the brokers and --namesrv")
