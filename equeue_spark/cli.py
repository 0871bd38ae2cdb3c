"""``equeue``: the command-line tool for an equeue broker.

::

    equeue [--broker HOST:PORT] [--timeout-s S] [--retries N] [--json]
           [--token-file PATH] [--tls] [--tls-ca PATH] [--tls-cert PATH --tls-key PATH]
           COMMAND ...

    topics   create | list | describe | delete | add-queue | set-visibility | delete-queue
    produce  TOPIC            lines of stdin (or --file) as messages
    consume  TOPIC            print messages (--group, --from, --max, --timeout, --tags)
    groups   list | describe | reset | delete
    message  get ID           one message, by id or by --topic/--queue/--offset
    stats                     broker-wide statistics

The common options are accepted before the command or after it. ``--broker``
defaults to ``$EQUEUE_BROKER``, else 127.0.0.1:5000. Output is aligned tables
for people, or with ``--json`` one JSON document (JSON lines for ``consume``)
whose field names are the ``.proto``'s. Broker errors print ``equeue: <message>``
on stderr and exit 1; usage errors exit 2.

Only the standard library and the equeue client: importing this module never
imports pyspark.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, BinaryIO

from google.protobuf.message import Message as ProtoMessage

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark import __version__
from equeue_spark.client.admin import Admin
from equeue_spark.client.connection import ClientConfig, default_broker
from equeue_spark.client.consumer import Consumer, Start
from equeue_spark.client.errors import EqueueError, InvalidRequest
from equeue_spark.client.producer import Producer, SendResult
from equeue_spark.client.records import Message

PROG = "equeue"
DEFAULT_TIMEOUT_S = 10.0
"""Deadline of each call to the broker (``--timeout-s``)."""
DEFAULT_RETRIES = 2
"""Extra attempts on UNAVAILABLE / DEADLINE_EXCEEDED: few, so a dead broker fails fast."""
DEFAULT_BATCH = 1000
"""Messages per produce request (``--batch-size``)."""
MAX_BATCH_BYTES = 16 << 20
"""A produce request is sent early once its values and keys reach this size."""
DEFAULT_CONSUME_TIMEOUT_S = 10.0
"""``consume --max N`` without ``--timeout`` stops after this long without a message."""
POLL_SLICE_S = 1.0
"""Longest single poll; the idle timeout is checked between polls."""
PROGRESS_INTERVAL_S = 0.1

Handler = Callable[[argparse.Namespace, "Output"], None]


class CliError(Exception):
    """A failure to report as ``equeue: <message>`` with exit code 1."""


class UsageError(Exception):
    """Arguments argparse accepted but that do not go together (exit code 2)."""


# ---------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns padded to their widest cell, two spaces apart; numbers right-aligned.

    ``None`` prints as ``-``; a column is numeric when all its other cells are
    ints or floats (bools are not numbers here).
    """
    raw = [list(row) for row in rows]
    numeric = []
    for i in range(len(headers)):
        present = [row[i] for row in raw if row[i] is not None]
        numeric.append(bool(present) and all(_is_number(v) for v in present))
    cells = [[_cell(value) for value in row] for row in raw]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *cells]:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def format_pairs(pairs: Iterable[tuple[str, object]]) -> str:
    """``label  value`` lines with the values aligned."""
    items = [(label, _cell(value)) for label, value in pairs]
    width = max((len(label) for label, _ in items), default=0)
    return "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in items)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def text_of(data: bytes) -> str:
    """Bytes as text: UTF-8, with undecodable bytes escaped as ``\\xNN``."""
    return data.decode("utf-8", errors="backslashreplace")


def one_line(data: bytes) -> str:
    """``text_of`` with line breaks escaped, so a message prints on one line."""
    return text_of(data).replace("\r", "\\r").replace("\n", "\\n")


def format_time(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC (``-`` for 0)."""
    if ms <= 0:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_duration(seconds: float) -> str:
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    parts.append(f"{secs}s")
    return " ".join(parts)


def proto_dict(message: ProtoMessage) -> dict[str, Any]:
    """A reply as a JSON-ready dict keyed by the ``.proto`` field names
    (int64 stays a number, unlike ``json_format``; unset sub-messages are null)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            out[field.name] = {k: _json_value(v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_json_value(v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _json_value(value)
    return out


def _json_value(value: object) -> object:
    if isinstance(value, ProtoMessage):
        return proto_dict(value)
    if isinstance(value, bytes):
        return text_of(value)
    return value


def message_dict(m: Message) -> dict[str, Any]:
    """A message as JSON: key/value/headers as text (undecodable bytes escaped)."""
    return {
        "message_id": m.message_id,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "offset": m.offset,
        "key": None if m.key is None else text_of(m.key),
        "tag": m.tag,
        "headers": [[name, text_of(value)] for name, value in m.headers],
        "timestamp_ms": m.timestamp_ms,
        "store_timestamp_ms": m.store_timestamp_ms,
        "value": text_of(m.value),
    }


def message_line(m: Message) -> str:
    """One message on one line: ``queue=Q offset=O [key=K] [tag=T] value=V``."""
    parts = [f"queue={m.queue_id}", f"offset={m.offset}"]
    if m.key is not None:
        parts.append(f"key={one_line(m.key)}")
    if m.tag:
        parts.append(f"tag={m.tag}")
    parts.append(f"value={one_line(m.value)}")
    return " ".join(parts)


class Output:
    """Where a command writes: a table/pairs/text for people, one document with ``--json``."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    @property
    def out(self) -> IO[str]:
        return sys.stdout  # looked up per call, so redirection (and capsys) works

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def document(self, doc: object) -> None:
        self.out.write(json.dumps(doc, indent=2) + "\n")

    def json_line(self, doc: object) -> None:
        self.out.write(json.dumps(doc, separators=(",", ":")) + "\n")


# ---------------------------------------------------------------------------------
# topics
# ---------------------------------------------------------------------------------


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(config=_config(args))


def _config(args: argparse.Namespace) -> ClientConfig:
    token = None  # None: the client falls back to $EQUEUE_TOKEN
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file: {exc.strerror}") from None
    config = ClientConfig(
        broker=args.broker or default_broker(),
        timeout_s=args.timeout_s or DEFAULT_TIMEOUT_S,
        retries=DEFAULT_RETRIES if args.retries is None else args.retries,
        token=token,
        tls=True if args.tls else None,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    try:
        config.credentials()  # unreadable TLS files: a usage error, not a traceback
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def _show_topic(ui: Output, info: pb.TopicInfo, headline: str | None = None) -> None:
    if ui.json:
        ui.document(proto_dict(info))
        return
    if headline:
        ui.line(headline)
    ui.line(f"topic {info.name}  created {format_time(info.created_ms)}  queues {len(info.queues)}")
    rows = [
        (
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
    headers = ("QUEUE", "EARLIEST", "END", "MIN COMMITTED", "BACKLOG", "PRODUCER", "CONSUMER")
    ui.line(format_table(headers, rows))


def cmd_topics_create(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
        info = admin.create_topic(args.name, queues=args.queues)
    _show_topic(ui, info, f"created topic {info.name} with {len(info.queues)} queues")


def cmd_topics_list(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
        topics = admin.list_topics()
    if ui.json:
        ui.document({"topics": [proto_dict(t) for t in topics]})
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


def cmd_topics_describe(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
        info = admin.describe_topic(args.name)
    _show_topic(ui, info)


def cmd_topics_delete(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
        admin.delete_topic(args.name)
    if ui.json:
        ui.document({"topic": args.name, "deleted": True})
    else:
        ui.line(f"deleted topic {args.name}")


def cmd_topics_add_queue(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
        info = admin.add_queues(args.name, args.count)
    _show_topic(ui, info, f"added {args.count} queue(s) to topic {info.name}")


def cmd_topics_set_visibility(args: argparse.Namespace, ui: Output) -> None:
    if args.producer is None and args.consumer is None:
        raise UsageError("give --producer on|off and/or --consumer on|off")
    with _admin(args) as admin:
        info = admin.set_queue_visibility(
            args.name, args.queue, producer=args.producer, consumer=args.consumer
        )
    _show_topic(ui, info, f"set visibility of queue {args.queue} of topic {info.name}")


def cmd_topics_delete_queue(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
        info = admin.delete_queue(args.name, args.queue)
    _show_topic(ui, info, f"deleted queue {args.queue} of topic {info.name}")


# ---------------------------------------------------------------------------------
# produce
# ---------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a stream, redrawn in place with ``\\r``."""

    WIDTH = 30

    def __init__(self, stream: IO[str], total: int) -> None:
        self.stream = stream
        self.total = total
        self._last_draw = 0.0
        self._last_len = 0

    def update(self, done: int, messages: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < PROGRESS_INTERVAL_S:
            return
        self._last_draw = now
        fraction = min(1.0, done / self.total) if self.total > 0 else 1.0
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        text = (
            f"[{bar}] {fraction * 100:5.1f}%  {format_bytes(done)} / {format_bytes(self.total)}"
            f"  {messages:,} messages"
        )
        padding = " " * max(0, self._last_len - len(text))
        self.stream.write("\r" + text + padding)
        self.stream.flush()
        self._last_len = len(text)

    def finish(self, done: int, messages: int) -> None:
        self.update(done, messages, force=True)
        self.stream.write("\n")
        self.stream.flush()


def _lines(stream: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """(line without its ``\\n`` or ``\\r\\n``, bytes it took in the input)."""
    for raw in stream:
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        yield line, len(raw)


def _batches(
    lines: Iterable[tuple[bytes, int]], size: int, max_bytes: int
) -> Iterator[tuple[list[bytes], int]]:
    """(values, input bytes they took), ``size`` values or ``max_bytes`` at most."""
    values: list[bytes] = []
    nbytes = consumed = 0
    for value, taken in lines:
        values.append(value)
        nbytes += len(value)
        consumed += taken
        if len(values) >= size or nbytes >= max_bytes:
            yield values, consumed
            values, nbytes, consumed = [], 0, 0
    if values:
        yield values, consumed


def cmd_produce(args: argparse.Namespace, ui: Output) -> None:
    if args.file is None:
        _produce_from(args, ui, sys.stdin.buffer, total=None)
        return
    try:
        stream = open(args.file, "rb")  # noqa: SIM115 (closed below, after the sends)
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    with stream:
        _produce_from(args, ui, stream, total=os.fstat(stream.fileno()).st_size)


def _produce_from(
    args: argparse.Namespace, ui: Output, stream: BinaryIO, total: int | None
) -> None:
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    progress = Progress(sys.stderr, total) if show and total is not None else None
    key = None if args.key is None else args.key.encode()
    per_queue: Counter[int] = Counter()
    first: SendResult | None = None
    last: SendResult | None = None
    sent = done = 0
    with Producer(config=_config(args)) as producer:
        try:
            for values, taken in _batches(_lines(stream), args.batch_size, MAX_BATCH_BYTES):
                n = len(values)
                results = producer.send_batch(
                    args.topic,
                    values,
                    keys=None if key is None else [key] * n,
                    tags=None if not args.tag else [args.tag] * n,
                    queue_ids=None if args.queue is None else [args.queue] * n,
                )
                first = first or results[0]
                last = results[-1]
                per_queue.update(r.queue_id for r in results)
                sent += n
                done += taken
                if progress is not None:
                    progress.update(done, sent)
        except EqueueError as exc:
            if progress is not None:
                progress.finish(done, sent)
            raise CliError(f"{exc}; {sent} message(s) were sent before the error") from exc
    if progress is not None:
        progress.finish(done, sent)
    queues = [{"queue_id": q, "messages": per_queue[q]} for q in sorted(per_queue)]
    if ui.json:
        ui.document(
            {
                "topic": args.topic,
                "messages": sent,
                "queues": queues,
                "first_message_id": first.message_id if first else None,
                "last_message_id": last.message_id if last else None,
            }
        )
        return
    used = ", ".join(f"{q['queue_id']} ({q['messages']})" for q in queues)
    ui.line(
        format_pairs(
            [
                ("topic", args.topic),
                ("messages", sent),
                ("queues", used or None),
                ("first id", first.message_id if first else None),
                ("last id", last.message_id if last else None),
            ]
        )
    )


# ---------------------------------------------------------------------------------
# consume
# ---------------------------------------------------------------------------------


def cmd_consume(args: argparse.Namespace, ui: Output) -> None:
    start: Start = args.start or ("group" if args.group else "earliest")
    if start == "group" and not args.group:
        raise UsageError("--from group needs --group")
    if args.idle_timeout is not None:
        idle_s: float = args.idle_timeout
    else:
        idle_s = float("inf") if args.max is None else DEFAULT_CONSUME_TIMEOUT_S
    tags = [t for t in args.tags.split("|") if t] if args.tags else []
    config = _config(args)
    with Admin(config=config) as admin:
        info = admin.describe_topic(args.topic)  # NOT_FOUND early; the queues to assign
    earliest = {q.queue_id: q.earliest_offset for q in info.queues}
    consumer = Consumer(
        config=config,
        group=args.group,
        topics=[args.topic] if args.group else (),
        start=start,
        max_messages=min(DEFAULT_BATCH, args.max or DEFAULT_BATCH),
        tags=tags,
        consumer_id=args.consumer_id,
    )
    count = 0
    with consumer:
        if not args.group:
            consumer.assign(args.topic, sorted(earliest))
        if start == "earliest":  # skip what retention deleted, without a warning
            for topic, queue_id in consumer.assignment():
                consumer.seek(topic, queue_id, earliest.get(queue_id, 0))
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
                if ui.json:
                    ui.json_line(message_dict(m))
                else:
                    ui.line(message_line(m))
            ui.out.flush()
            count += len(wanted)
            last_message = time.monotonic()
            _rewind(consumer, messages[len(wanted) :])
            if args.group:
                consumer.commit()
    if not ui.json:
        sys.stderr.write(f"consumed {count} message(s)\n")


def _rewind(consumer: Consumer, unprinted: Sequence[Message]) -> None:
    """Put the queues back at the first message not printed (``--max`` cut a poll)."""
    first: dict[tuple[str, int], int] = {}
    for m in unprinted:
        key = (m.topic, m.queue_id)
        first[key] = min(first.get(key, m.offset), m.offset)
    for (topic, queue_id), offset in first.items():
        try:
            consumer.seek(topic, queue_id, offset)
        except InvalidRequest:  # a rebalance took the queue meanwhile
            continue


# ---------------------------------------------------------------------------------
# groups
# ---------------------------------------------------------------------------------


def _show_group(ui: Output, info: pb.GroupInfo, headline: str | None = None) -> None:
    if ui.json:
        ui.document(proto_dict(info))
        return
    if headline:
        ui.line(headline)
    ui.line(f"group {info.group}")
    rows = [
        (
            q.topic,
            q.queue_id,
            None if q.committed_offset < 0 else q.committed_offset,
            q.end_offset,
            q.lag,
            q.consumer_id or None,
        )
        for q in info.queues
    ]
    ui.line(format_table(("TOPIC", "QUEUE", "COMMITTED", "END", "LAG", "CONSUMER"), rows))
    ui.line()
    consumers = ", ".join(info.consumer_ids) or "none"
    ui.line(format_pairs([("total lag", info.total_lag), ("live consumers", consumers)]))


def cmd_groups_list(args: argparse.Namespace, ui: Output) -> None:
    rows: list[dict[str, Any]] = []
    with _admin(args) as admin:
        for group in admin.list_groups():
            try:
                info = admin.describe_group(group)
            except EqueueError:  # deleted meanwhile, or its offsets just expired
                rows.append({"group": group, "topics": [], "total_lag": None, "consumers": None})
                continue
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
    if ui.json:
        ui.document({"groups": rows})
    elif not rows:
        ui.line("no groups")
    else:
        table = [
            (r["group"], ", ".join(r["topics"]) or None, r["total_lag"], r["consumers"])
            for r in rows
        ]
        ui.line(format_table(("GROUP", "TOPICS", "TOTAL LAG", "CONSUMERS"), table))


def cmd_groups_describe(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
        info = admin.describe_group(args.group)
    _show_group(ui, info)


def cmd_groups_reset(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
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
            info = admin.reset_offsets(args.group, args.topic, offsets=offsets)
            where = ", ".join(f"queue {q} offset {o}" for q, o in sorted(offsets.items()))
    _show_group(ui, info, f"reset group {args.group} on topic {args.topic} to {where}")


def cmd_groups_delete(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
        admin.delete_group(args.group)
    if ui.json:
        ui.document({"group": args.group, "deleted": True})
    else:
        ui.line(f"deleted group {args.group}")


# ---------------------------------------------------------------------------------
# transactions
# ---------------------------------------------------------------------------------


def cmd_transactions_list(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
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
    with _admin(args) as admin:
        aborted = admin.abort_transactions(args.ids, args.prefix or "")
    if ui.json:
        ui.document({"aborted": aborted})
    else:
        ui.line(f"aborted {aborted} transaction{'' if aborted == 1 else 's'}")


# ---------------------------------------------------------------------------------
# message, stats
# ---------------------------------------------------------------------------------


def cmd_message_get(args: argparse.Namespace, ui: Output) -> None:
    address = (args.topic, args.queue, args.offset)
    if args.id is not None and any(a is not None for a in address):
        raise UsageError("give a message ID or --topic/--queue/--offset, not both")
    if args.id is None and any(a is None for a in address):
        raise UsageError("give a message ID, or all of --topic, --queue and --offset")
    with _admin(args) as admin:
        if args.id is not None:
            m = admin.get_message(args.id)
        else:
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


def cmd_stats(args: argparse.Namespace, ui: Output) -> None:
    with _admin(args) as admin:
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
            ]
        )
    )


# ---------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be positive, got 0")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _on_off(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("on", "true", "yes", "1"):
        return True
    if lowered in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def _queue_offset(text: str) -> tuple[int, int]:
    queue, sep, offset = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected QUEUE=OFFSET, got {text!r}")
    return _non_negative_int(queue), _non_negative_int(offset)


def _add_common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes. On the subcommands they default to
    SUPPRESS, so a value given before the command is not overwritten."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--broker",
        metavar="HOST:PORT",
        default=default(None),
        help="broker address (default: $EQUEUE_BROKER, else 127.0.0.1:5000)",
    )
    parser.add_argument(
        "--timeout-s",
        type=_positive_float,
        metavar="S",
        default=default(None),
        help=f"deadline of each call to the broker, seconds (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--retries",
        type=_non_negative_int,
        metavar="N",
        default=default(None),
        help=f"extra attempts when the broker is unavailable (default {DEFAULT_RETRIES})",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        default=default(None),
        help="file holding the access token (default: $EQUEUE_TOKEN; never on the command line)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=default(False),
        help="connect with TLS, trusting the system's CAs (implied by --tls-ca)",
    )
    for flag, env, what in (
        ("--tls-ca", "EQUEUE_TLS_CA", "PEM CA that signed the broker's certificate"),
        ("--tls-cert", "EQUEUE_TLS_CERT", "PEM client certificate, for mutual TLS"),
        ("--tls-key", "EQUEUE_TLS_KEY", "PEM key of --tls-cert"),
    ):
        parser.add_argument(
            flag, metavar="PATH", default=default(None), help=f"{what} (default: ${env})"
        )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="machine-readable output: one JSON document (JSON lines for consume)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Administer an equeue broker, and produce and consume messages.",
        epilog="Run 'equeue COMMAND --help' for a command's options.",
        allow_abbrev=False,
    )
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {__version__}")
    _add_common(parser, top=True)
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_common(common, top=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def leaf(
        group: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        help_: str,
        handler: Handler,
        description: str | None = None,
    ) -> argparse.ArgumentParser:
        sub = group.add_parser(
            name,
            help=help_,
            description=description or help_,
            parents=[common],
            allow_abbrev=False,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler, leaf=sub)
        return sub

    def branch(name: str, help_: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        sub = commands.add_parser(name, help=help_, description=help_, allow_abbrev=False)
        return sub.add_subparsers(dest="action", metavar="ACTION", required=True)

    # topics
    topics = branch("topics", "create, list, describe and delete topics and their queues")
    p = leaf(topics, "create", "create a topic", cmd_topics_create)
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--queues", type=_positive_int, default=0, metavar="N",
        help="number of queues (default: the broker's default)",
    )  # fmt: skip
    leaf(topics, "list", "list topics", cmd_topics_list)
    p = leaf(
        topics, "describe", "show a topic's queues", cmd_topics_describe,
        "Per queue: id, earliest and end offsets, lowest committed offset of any group,\n"
        "backlog, and whether producers and consumers see it.",
    )  # fmt: skip
    p.add_argument("name", metavar="NAME")
    p = leaf(topics, "delete", "delete a topic, its messages and its offsets", cmd_topics_delete)
    p.add_argument("name", metavar="NAME")
    p = leaf(topics, "add-queue", "add queues to a topic", cmd_topics_add_queue)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--count", type=_positive_int, default=1, metavar="N", help="default 1")
    p = leaf(
        topics, "set-visibility", "hide a queue from producers and/or consumers, or show it",
        cmd_topics_set_visibility,
    )  # fmt: skip
    p.add_argument("name", metavar="NAME")
    p.add_argument("queue", type=_non_negative_int, metavar="QUEUE")
    p.add_argument("--producer", type=_on_off, metavar="on|off")
    p.add_argument("--consumer", type=_on_off, metavar="on|off")
    p = leaf(
        topics, "delete-queue", "delete a queue (hidden from both sides, fully consumed)",
        cmd_topics_delete_queue,
    )  # fmt: skip
    p.add_argument("name", metavar="NAME")
    p.add_argument("queue", type=_non_negative_int, metavar="QUEUE")

    # produce
    p = leaf(
        commands, "produce", "send lines of stdin or a file as messages", cmd_produce,
        "Send each input line as one message (the line break, \\n or \\r\\n, is not\n"
        "part of it). Messages go in batches of --batch-size, and at the end of the\n"
        "input; use --batch-size 1 to send each line as soon as it is read.",
    )  # fmt: skip
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--file", metavar="PATH", help="read this file instead of stdin")
    p.add_argument("--key", help="key of every message (routes them all to one queue)")
    p.add_argument("--tag", help="tag of every message")
    p.add_argument("--queue", type=_non_negative_int, metavar="N", help="send to this queue")
    p.add_argument(
        "--batch-size", type=_positive_int, default=DEFAULT_BATCH, metavar="N",
        help=f"messages per request (default {DEFAULT_BATCH})",
    )  # fmt: skip
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress bar on stderr for --file (default: when stderr is a terminal)",
    )  # fmt: skip

    # consume
    p = leaf(
        commands, "consume", "print a topic's messages", cmd_consume,
        "Print messages, one per line (JSON lines with --json), then a count on stderr.\n"
        "Without --group every queue of the topic is read; with --group the consumer\n"
        "joins the group, reads the queues the group gives it and commits after each\n"
        "batch of printed messages.\n\n"
        "Stops after --max messages, or after --timeout seconds without a message.\n"
        f"Default timeout: none (wait for messages until Ctrl-C) without --max;\n"
        f"{DEFAULT_CONSUME_TIMEOUT_S:g} s with --max. '--timeout 0' prints what is there now;\n"
        "'--timeout inf' waits forever.",
    )  # fmt: skip
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--group", metavar="G", help="consume as a member of this consumer group")
    p.add_argument(
        "--from", dest="start", choices=["earliest", "latest", "group"],
        help="where to start: the group's committed offsets (default with --group, "
        "falling back to earliest), the earliest (default without) or the latest",
    )  # fmt: skip
    p.add_argument("--max", type=_positive_int, metavar="N", help="stop after N messages")
    p.add_argument(
        "--timeout", dest="idle_timeout", type=_non_negative_float, metavar="SECONDS",
        help="stop after this long without a message",
    )  # fmt: skip
    p.add_argument("--tags", metavar="A|B", help="only messages with one of these tags")
    p.add_argument(
        "--consumer-id", metavar="ID",
        help="member id in the group (default: host-pid-random). A run leaves the group "
        "when it ends; a run that was killed stays a member until the broker's consumer "
        "timeout (30 s by default) unless a new run reuses its id",
    )  # fmt: skip

    # groups
    groups = branch("groups", "list, describe, reset and delete consumer groups")
    leaf(groups, "list", "list consumer groups with their lag", cmd_groups_list)
    p = leaf(groups, "describe", "show a group's offsets, lag and consumers", cmd_groups_describe)
    p.add_argument("group", metavar="G")
    p = leaf(groups, "reset", "move a group's committed offsets on a topic", cmd_groups_reset)
    p.add_argument("group", metavar="G")
    p.add_argument("--topic", required=True, metavar="T")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true", help="earliest retained offsets")
    where.add_argument("--to-latest", action="store_true", help="end of every queue")
    where.add_argument(
        "--to-timestamp", type=_non_negative_int, metavar="MS",
        help="first message stored at or after this time (ms since the epoch)",
    )  # fmt: skip
    where.add_argument(
        "--to-offset", type=_queue_offset, nargs="+", action="extend", metavar="QUEUE=OFFSET",
        help="explicit next offsets (queues not given are unchanged)",
    )  # fmt: skip
    p = leaf(groups, "delete", "forget a group's committed offsets", cmd_groups_delete)
    p.add_argument("group", metavar="G")

    # transactions
    txns = branch("transactions", "list and abort open (staged, uncommitted) transactions")
    p = leaf(
        txns, "list", "open transactions and every sink's last committed batch",
        cmd_transactions_list,
    )  # fmt: skip
    p.add_argument("--prefix", metavar="P", help="only transactions whose id starts with P")
    p = leaf(txns, "abort", "discard open transactions", cmd_transactions_abort)
    p.add_argument("ids", nargs="*", metavar="ID", help="transaction ids")
    p.add_argument("--prefix", metavar="P", help="also every transaction whose id starts with P")

    # message
    message = branch("message", "fetch one message")
    p = leaf(message, "get", "fetch a message by id or by queue address", cmd_message_get)
    p.add_argument("id", nargs="?", metavar="ID", help="message id, as printed by produce")
    p.add_argument("--topic", metavar="T")
    p.add_argument("--queue", type=_non_negative_int, metavar="Q")
    p.add_argument("--offset", type=_non_negative_int, metavar="O")
    p.add_argument("--raw", action="store_true", help="write only the value's bytes")

    # stats
    leaf(commands, "stats", "broker-wide statistics", cmd_stats)
    return parser


# ---------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run one command; return the exit code (0 ok, 1 failed, 2 usage, 130 interrupted)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    ui = Output(as_json=args.json)
    try:
        args.handler(args, ui)
    except UsageError as exc:
        leaf: argparse.ArgumentParser = args.leaf
        leaf.print_usage(sys.stderr)
        sys.stderr.write(f"{leaf.prog}: error: {exc}\n")
        return 2
    except (EqueueError, CliError) as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 1
    except BrokenPipeError:  # e.g. `equeue consume T | head`
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    return 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (e.g. captured in tests)
        pass


if __name__ == "__main__":
    raise SystemExit(main())
