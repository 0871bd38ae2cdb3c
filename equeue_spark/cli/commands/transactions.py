"""``equeue transactions``: list and abort open (staged, uncommitted) transactions."""

from __future__ import annotations

import argparse

from equeue_spark.cli.common import UsageError, admin_client
from equeue_spark.cli.formatting import Output, format_bytes, format_table, format_time, proto_dict


def cmd_transactions_list(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args, per_broker="transactions list") as admin:
        listing = admin.list_transactions(args.prefix or "")
    if ui.json:
        ui.document(proto_dict(listing))
        return
    rows = [
        (
            t.transaction_id,
            t.messages,
            format_bytes(t.bytes),
            ", ".join(f"{q.topic}/{q.queue_id}" for q in t.queues),
            format_time(t.created_ms),
            format_time(t.last_write_ms),
            "committing" if t.committing else "open",
        )
        for t in listing.transactions
    ]
    if rows:
        headers = ("TRANSACTION", "MESSAGES", "BYTES", "QUEUES", "CREATED", "LAST WRITE", "STATE")
        ui.line(format_table(headers, rows))
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
