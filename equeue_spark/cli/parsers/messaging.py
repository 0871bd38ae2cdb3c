"""Arguments of ``equeue produce`` and ``equeue consume``."""

from __future__ import annotations

import argparse

from equeue_spark.cli.arguments import (
    Commands,
    duration_s,
    iso_time_ms,
    non_negative_float,
    non_negative_int,
    positive_int,
)
from equeue_spark.cli.commands.consume import cmd_consume
from equeue_spark.cli.commands.produce import cmd_produce
from equeue_spark.cli.common import DEFAULT_BATCH, DEFAULT_CONSUME_TIMEOUT_S

PRODUCE_DESCRIPTION = (
    "Send each input line as one message (the line break, \\n or \\r\\n, is not\n"
    "part of it). Messages go in batches of --batch-size, and at the end of the\n"
    "input; use --batch-size 1 to send each line as soon as it is read."
)
CONSUME_DESCRIPTION = (
    "Print messages, one per line (JSON lines with --json), then a count on stderr.\n"
    "Without --group every queue of the topic is read; with --group the consumer\n"
    "joins the group, reads the queues the group gives it and commits after each\n"
    "batch of printed messages.\n\n"
    "Stops after --max messages, or after --timeout seconds without a message.\n"
    "Default timeout: none (wait for messages until Ctrl-C) without --max;\n"
    f"{DEFAULT_CONSUME_TIMEOUT_S:g} s with --max. '--timeout 0' prints what is there now;\n"
    "'--timeout inf' waits forever."
)
FROM_HELP = (
    "where to start: the group's committed offsets (default with --group, "
    "falling back to earliest), the earliest (default without) or the latest"
)
CONSUMER_ID_HELP = (
    "member id in the group: 1-128 ASCII letters, digits and . _ : @ / - "
    "(default: host-pid-random). A run leaves the group "
    "when it ends; a run that was killed stays a member until the broker's consumer "
    "timeout (30 s by default) unless a new run reuses its id"
)


def add_produce(commands: Commands) -> None:
    help_ = "send lines of stdin or a file as messages"
    p = commands.command("produce", help_, cmd_produce, PRODUCE_DESCRIPTION)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--file", metavar="PATH", help="read this file instead of stdin")
    p.add_argument("--key", help="key of every message (routes them all to one queue)")
    p.add_argument("--tag", help="tag of every message")
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header of every message (repeatable; filters read headers: "
        "equeue consume --filter \"region = 'eu'\")",
    )
    p.add_argument(
        "--extra-key",
        action="append",
        default=[],
        metavar="K",
        help="an extra key of every message, besides --key (repeatable; at most 32, "
        "no spaces): sent in the 'keys' header, which --header must not also set",
    )
    p.add_argument("--queue", type=non_negative_int, metavar="N", help="send to this queue")
    p.add_argument("--on-broker", metavar="NAME", help="with --namesrv and --queue: its broker")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"messages per request (default {DEFAULT_BATCH})",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr for --file (default: when stderr is a terminal)",
    )
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--delay",
        type=duration_s,
        metavar="DURATION",
        help="deliver the messages this long from now (30s, 500ms, 15m, 2h, 7d; a bare "
        "number is seconds); nobody reads them before",
    )
    when.add_argument(
        "--deliver-at",
        type=iso_time_ms,
        metavar="TIME",
        help="deliver the messages at this ISO 8601 time (2027-01-31T09:00:00Z; without a "
        "zone: UTC)",
    )
    p.add_argument(
        "--idempotence",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="retries append no batch twice (default); --no-idempotence for brokers "
        "without InitProducer",
    )


def add_consume(commands: Commands) -> None:
    p = commands.command("consume", "print a topic's messages", cmd_consume, CONSUME_DESCRIPTION)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--group", metavar="G", help="consume as a member of this consumer group")
    starts = ["earliest", "latest", "group"]
    p.add_argument("--from", dest="start", choices=starts, help=FROM_HELP)
    p.add_argument("--max", type=positive_int, metavar="N", help="stop after N messages")
    p.add_argument(
        "--timeout",
        dest="idle_timeout",
        type=non_negative_float,
        metavar="SECONDS",
        help="stop after this long without a message",
    )
    p.add_argument("--tags", metavar="A|B", help="only messages with one of these tags")
    p.add_argument(
        "--filter",
        metavar="EXPR",
        default="",
        help="only messages for which this expression is true, applied by the broker "
        "(\"region = 'eu' AND amount > 100\"; grammar: docs/client.md, Filters)",
    )
    p.add_argument("--consumer-id", metavar="ID", help=CONSUMER_ID_HELP)
    p.add_argument(
        "--read-from-replicas",
        action="store_true",
        help="with --namesrv: read each broker group from a replica (the master if none is "
        "live); commits still go to the master",
    )
