"""``equeue consume``: print a topic's messages, on their own or as a member of
a consumer group (committing after each printed batch), until ``--max``
messages or ``--timeout`` seconds without one."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from equeue_proto.protocol import consumer_id_problem
from equeue_spark.cli.common import (
    DEFAULT_BATCH,
    DEFAULT_CONSUME_TIMEOUT_S,
    UsageError,
    client_config,
)
from equeue_spark.cli.formatting import Output, message_dict, message_line
from equeue_spark.client.admin import Admin
from equeue_spark.client.cluster import with_replica_reads
from equeue_spark.client.consumer import Consumer, Start
from equeue_spark.client.errors import InvalidRequest
from equeue_spark.client.filters import check_filter
from equeue_spark.client.records import Message

POLL_SLICE_S = 1.0
"""Longest single poll; the idle timeout is checked between polls."""


def cmd_consume(args: argparse.Namespace, ui: Output) -> None:
    start: Start = args.start or ("group" if args.group else "earliest")
    if start == "group" and not args.group:
        raise UsageError("--from group needs --group")
    problem = consumer_id_problem(args.consumer_id) if args.consumer_id else None
    if problem is not None:  # the broker would refuse it: say so before connecting
        raise UsageError(f"--consumer-id: {problem}")
    if args.idle_timeout is not None:
        idle_s: float = args.idle_timeout
    else:
        idle_s = float("inf") if args.max is None else DEFAULT_CONSUME_TIMEOUT_S
    tags = [t for t in args.tags.split("|") if t] if args.tags else []
    try:  # a bad expression: exit 2 with the parser's message, before connecting
        expression = check_filter(args.filter)
    except InvalidRequest as exc:
        raise UsageError(f"--filter: {exc}") from None
    config = client_config(args)
    if args.read_from_replicas:
        try:
            config = with_replica_reads(config)
        except ValueError:
            raise UsageError(
                "--read-from-replicas needs --namesrv (one broker has no replicas)"
            ) from None
    with Admin(config=config) as admin:
        info = admin.describe_topic(args.topic)  # NOT_FOUND early; the queues to assign
    earliest = {(q.broker, q.queue_id): q.earliest_offset for q in info.queues}
    consumer = Consumer(
        config=config,
        group=args.group,
        topics=[args.topic] if args.group else (),
        start=start,
        max_messages=min(DEFAULT_BATCH, args.max or DEFAULT_BATCH),
        tags=tags,
        filter=expression,
        consumer_id=args.consumer_id,
    )
    with consumer:
        if not args.group:
            for broker in sorted({b for b, _ in earliest}):
                consumer.assign(args.topic, sorted(q for b, q in earliest if b == broker), broker)
        if start == "earliest":  # skip what retention deleted, without a warning
            for broker, topic, queue_id in consumer.assignments():
                consumer.seek(topic, queue_id, earliest.get((broker, queue_id), 0), broker)
        count = _print_messages(args, ui, consumer, idle_s)
    if not ui.json:
        sys.stderr.write(f"consumed {count} message(s)\n")


def _print_messages(args: argparse.Namespace, ui: Output, consumer: Consumer, idle_s: float) -> int:
    """Poll and print until ``--max`` messages or ``idle_s`` without one; return the count."""
    count = 0
    last_message = time.monotonic()
    while args.max is None or count < args.max:
        idle_left = idle_s - (time.monotonic() - last_message)
        wait_s = min(POLL_SLICE_S, max(0.0, idle_left))
        began = time.monotonic()
        messages = consumer.poll(timeout_s=wait_s)
        if not messages:
            if time.monotonic() - last_message >= idle_s:
                break
            # A poll that failed fast (broker unreachable) must not spin.
            time.sleep(max(0.0, wait_s - (time.monotonic() - began)))
            continue
        wanted = messages if args.max is None else messages[: args.max - count]
        for m in wanted:
            broker = consumer.routes.shown_group(m.broker_id)
            if ui.json:
                ui.json_line(message_dict(m, broker))
            else:
                ui.line(message_line(m, broker))
        ui.out.flush()
        count += len(wanted)
        last_message = time.monotonic()
        _rewind(consumer, messages[len(wanted) :])
        if args.group:
            consumer.commit()
    return count


def _rewind(consumer: Consumer, unprinted: Sequence[Message]) -> None:
    """Put the queues back at the first message not printed (``--max`` cut a poll)."""
    first: dict[tuple[str, str, int], int] = {}
    for m in unprinted:
        key = (consumer.routes.message_group(m.broker_id), m.topic, m.queue_id)
        first[key] = min(first.get(key, m.offset), m.offset)
    for (broker, topic, queue_id), offset in first.items():
        try:
            consumer.seek(topic, queue_id, offset, broker)
        except InvalidRequest:  # a rebalance took the queue meanwhile
            continue
