"""``equeue transactions``: list and abort open (staged, uncommitted) transactions."""

from __future__ import annotations

import argparse
import time

from equeue_spark.cli.common import UsageError, admin_client
from equeue_spark.cli.formatting import Output, format_bytes, format_table, format_time, proto_dict

HEADERS = (
    "ID", "GROUP", "AGE", "CHECKS", "NEXT CHECK", "MESSAGES", "BYTES", "QUEUES", "STATE",
)  # fmt: skip


def short_duration(ms: int) -> str:
    """``12s``, ``4m``, ``3h``, ``2d``: the largest whole unit."""
    seconds = max(0, ms) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _next_check(next_ms: int, now_ms: int, committing: bool) -> str:
    """When the broker checks (or, after its last check, rolls back) next."""
    if committing or next_ms <= 0:
        return "-"
    return "due" if next_ms <= now_ms else f"in {short_duration(next_ms - now_ms)}"


def cmd_transactions_list(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args, per_broker="transactions list") as admin:
        listing = admin.list_transactions(args.prefix or "")
    if ui.json:
        ui.document(proto_dict(listing))
        return
    now_ms = int(time.time() * 1000)
    rows = [
        (
            t.transaction_id,
            t.group or "-",
            short_duration(now_ms - t.created_ms),
            t.checks,
            _next_check(t.next_check_ms, now_ms, t.committing),
            t.messages,
            format_bytes(t.bytes),
            ", ".join(f"{q.topic}/{q.queue_id}" for q in t.queues),
            "committing" if t.committing else "open",
        )
        for t in listing.transactions
    ]
    if rows:
        ui.line(format_table(HEADERS, rows))
    else:
        ui.line("no open transactions")
    if listing.sinks:
        ui.line()
        sinks = [(s.sink, s.batch_id, format_time(s.updated_ms)) for s in listing.sinks]
        ui.line(format_table(("SINK", "LAST BATCH", "COMMITTED"), sinks))


def cmd_transactions_abort(args: argparse.Namespace, ui: Output) -> None:
    if not args.ids and not args.prefix:
        raise UsageError("give transaction IDs or --prefix")
    with admin_client(args, per_broker="transactions abort") as admin:
        aborted = admin.abort_transactions(args.ids, args.prefix or "")
    if ui.json:
        ui.document({"aborted": aborted})
    else:
        ui.line(f"aborted {aborted} transaction{'' if aborted == 1 else 's'}")
