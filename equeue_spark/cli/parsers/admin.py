"""Arguments of ``equeue message get|query|cancel`` and ``equeue stats``."""

from __future__ import annotations

import argparse

from equeue_spark.cli.arguments import Commands, iso_time_ms, non_negative_int
from equeue_spark.cli.commands.admin import (
    cmd_message_cancel,
    cmd_message_get,
    cmd_message_query,
    cmd_stats,
)
from equeue_spark.client.delays import parse_duration_s
from equeue_spark.client.queries import MAX_QUERY_LIMIT


def add_message(commands: Commands) -> None:
    message = commands.group(
        "message", "fetch one message, find messages by key or time, or cancel a delayed one"
    )
    get_help = "fetch a message by id or by queue address"
    p = message.command("get", get_help, cmd_message_get)
    p.add_argument("id", nargs="?", metavar="ID", help="message id, as printed by produce")
    p.add_argument("--topic", metavar="T")
    p.add_argument("--queue", type=non_negative_int, metavar="Q")
    p.add_argument("--offset", type=non_negative_int, metavar="O")
    p.add_argument("--raw", action="store_true", help="write only the value's bytes")
    query_help = "messages of a topic by key (its key or extra keys) and/or store time"
    p = message.command("query", query_help, cmd_message_query)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--key", metavar="K", help="the key (compared byte for byte, UTF-8)")
    p.add_argument("--since", type=since_s, metavar="D", help="stored in the last D (1h, 30m)")
    p.add_argument("--from", dest="from_ms", type=time_ms, metavar="T",
                   help="stored at or after T (ISO 8601, or ms since 1970)")  # fmt: skip
    p.add_argument("--to", dest="to_ms", type=time_ms, metavar="T", help="stored before T")
    limit_help = f"at most N messages, newest first (default 32, max {MAX_QUERY_LIMIT})"
    p.add_argument("--limit", type=limit, default=32, metavar="N", help=limit_help)
    cancel_help = "cancel a delayed message still pending (it is never delivered)"
    p = message.command("cancel", cancel_help, cmd_message_cancel)
    p.add_argument("id", metavar="ID", help="message id, as printed by produce --delay")


def add_stats(commands: Commands) -> None:
    commands.command("stats", "broker-wide statistics", cmd_stats)


def since_s(text: str) -> float:
    """``--since``: a duration (``30s``, ``15m``, ``2h``, ``7d``)."""
    try:
        seconds = parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive duration like 1h")
    return seconds


def time_ms(text: str) -> int:
    """``--from``/``--to``: an ISO 8601 time (no zone: UTC) or ms since the epoch."""
    return int(text) if text.strip().isdigit() else iso_time_ms(text)


def limit(text: str) -> int:
    value = non_negative_int(text)
    if not 1 <= value <= MAX_QUERY_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 to {MAX_QUERY_LIMIT}")
    return value
