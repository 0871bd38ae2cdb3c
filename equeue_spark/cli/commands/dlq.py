"""``equeue dlq list|resend|purge``: a consumer group's dead letters."""

from __future__ import annotations

import argparse

from equeue_proto.retry_topics import DLQ_REASON, dlq_topic
from equeue_spark.cli.common import UsageError, admin_client, split_names
from equeue_spark.cli.formatting import Output, format_table, message_dict, one_line
from equeue_spark.client.records import Message


def _row(m: Message) -> tuple[object, ...]:
    origin = m.origin
    where = "-" if origin is None else f"{origin.topic}/{origin.queue_id}@{origin.offset}"
    return (m.message_id, where, m.deliveries, one_line((m.error or "").encode()) or None,
            one_line(m.value))  # fmt: skip


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def cmd_dlq_list(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        letters = admin.dead_letters(args.group, args.max)
        shown_group = admin.routes.shown_group
    if ui.json:
        ui.document(
            {
                "group": args.group,
                "topic": dlq_topic(args.group),
                "messages": [
                    {
                        **message_dict(m, shown_group(m.broker_id)),
                        "origin": None if m.origin is None else m.origin._asdict(),
                        "deliveries": m.deliveries,
                        "error": m.error,
                        "reason": _text(m.header(DLQ_REASON)),
                    }
                    for m in letters
                ],
            }
        )
        return
    if not letters:
        ui.line(f"no dead letters for group {args.group}")
        return
    headers = ("ID", "ORIGIN", "DELIVERIES", "ERROR", "VALUE")
    ui.line(format_table(headers, [_row(m) for m in letters]))


def cmd_dlq_resend(args: argparse.Namespace, ui: Output) -> None:
    ids = split_names(args.ids) or []
    if not args.all and not ids:
        raise UsageError("give --ids ID,... (as 'equeue dlq list' prints them) or --all")
    with admin_client(args) as admin:
        reply = admin.resend_dead_letters(args.group, ids, all=args.all)
    if ui.json:
        ui.document(
            {
                "group": args.group,
                "resent": reply.resent,
                "already_resent": reply.already_resent,
                "not_found": list(reply.not_found),
                "new_message_ids": list(reply.new_message_ids),
            }
        )
        return
    ui.line(f"resent {reply.resent} dead letter(s) of group {args.group} to their topics")
    if reply.already_resent:
        ui.line(f"{reply.already_resent} had been resent before: skipped")
    if reply.not_found:
        ui.line(f"not dead letters of {args.group}: {', '.join(reply.not_found)}")


def cmd_dlq_purge(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        purged = admin.purge_dead_letters(args.group)
    if ui.json:
        ui.document({"group": args.group, "purged": purged})
    else:
        ui.line(f"purged {purged} dead letter(s) of group {args.group}")
