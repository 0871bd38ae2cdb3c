"""``equeue produce``: send the lines of stdin or a file as messages, in batches,
with a progress bar on stderr for a file."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, BinaryIO

from equeue_proto.message_keys import KEYS_HEADER, encode_keys
from equeue_spark.cli.common import CliError, UsageError, client_config
from equeue_spark.cli.formatting import Output, format_bytes, format_pairs, format_time
from equeue_spark.client.batches import SendResult, SendResults
from equeue_spark.client.errors import EqueueError, InvalidRequest
from equeue_spark.client.producer import Producer

MAX_BATCH_BYTES = 16 << 20
"""A produce request is sent early once its values and keys reach this size."""
PROGRESS_INTERVAL_S = 0.1


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


@dataclass
class _Sent:
    """What a run has sent so far: the progress bar and the summary report it."""

    per_queue: Counter[tuple[str, int]] = field(default_factory=Counter)
    """Messages per (broker name, queue id); the broker is "" for one broker."""
    group_of: Callable[[str], str] = str
    """The broker group a result's ``broker_id`` names (``Routes.message_group``)."""
    first: SendResult | None = None
    last: SendResult | None = None
    messages: int = 0
    input_bytes: int = 0
    """Bytes of the input the sent messages took (line breaks included)."""

    def add(self, results: SendResults, taken: int) -> None:
        self.first = self.first or results[0]
        self.last = results[-1]
        groups = (self.group_of(results.broker_of(i)) for i in range(len(results)))
        self.per_queue.update(zip(groups, results.queue_ids, strict=True))
        self.messages += len(results)
        self.input_bytes += taken


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
    key = None if args.key is None else arg_bytes(args.key)
    headers = message_headers(args.header, args.extra_key)
    if args.tag and _SURROGATE.search(args.tag):
        raise UsageError(f"--tag {args.tag!r} is not valid UTF-8: a tag is text")
    config = client_config(args)
    with Producer(config=config, enable_idempotence=args.idempotence) as producer:
        routes = producer.cluster()
        group = args.on_broker  # of --queue (one broker: its one group, whatever is given)
        if args.queue is not None and not group:
            missing = "with --namesrv, --queue needs --on-broker NAME (the queue's broker)"
            try:
                group = routes.group("", missing)
            except InvalidRequest as exc:
                raise UsageError(str(exc)) from None
        sent = _Sent(group_of=routes.message_group)
        try:
            for values, taken in _batches(_lines(stream), args.batch_size, MAX_BATCH_BYTES):
                n = len(values)
                results = producer.send_batch(
                    args.topic,
                    values,
                    keys=None if key is None else [key] * n,
                    tags=None if not args.tag else [args.tag] * n,
                    headers=None if not headers else [headers] * n,
                    queue_ids=None if args.queue is None else [args.queue] * n,
                    brokers=None if args.queue is None else [group] * n,
                    delay_s=args.delay,
                    deliver_at=args.deliver_at,
                )
                sent.add(results, taken)
                if progress is not None:
                    progress.update(sent.input_bytes, sent.messages)
        except EqueueError as exc:
            if progress is not None:
                progress.finish(sent.input_bytes, sent.messages)
            raise CliError(f"{exc}; {sent.messages} message(s) were sent before the error") from exc
    if progress is not None:
        progress.finish(sent.input_bytes, sent.messages)
    _report(ui, args.topic, sent)


_SURROGATE = re.compile("[\ud800-\udfff]")
"""What argv bytes that are not UTF-8 decode to (``surrogateescape``)."""


def arg_bytes(value: str) -> bytes:
    """A command-line value as the bytes given: Python decodes argv with
    ``surrogateescape``, so bytes that are not UTF-8 (``$'\\xff'``) come back as
    they were. Keys and header values are bytes, so they are sent as given."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no argv decoding makes (\ud800-\udc7f)
        raise UsageError(f"{value!r} is not valid text") from None


def message_headers(given: list[str], extra_keys: list[str]) -> list[tuple[str, bytes]]:
    """The headers of every message: ``--header NAME=VALUE``s, then the ``keys``
    header of the ``--extra-key``s (``message_keys.encode_keys``)."""
    headers = []
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--header {item!r}: give NAME=VALUE")
        if _SURROGATE.search(name):
            raise UsageError(f"--header {item!r}: the name is not valid UTF-8 (a name is text)")
        headers.append((name, arg_bytes(value)))
    if extra_keys:
        if any(name == KEYS_HEADER for name, _ in headers):
            raise UsageError(
                f"--extra-key and --header {KEYS_HEADER}=... both set the {KEYS_HEADER!r} "
                "header: use one"
            )
        try:
            headers.append((KEYS_HEADER, encode_keys(arg_bytes(k) for k in extra_keys)))
        except ValueError as exc:
            raise UsageError(f"--extra-key: {exc}") from None
    return headers


def _report(ui: Output, topic: str, sent: _Sent) -> None:
    """The summary of a run: a JSON document, or label/value pairs."""
    first, last, per_queue = sent.first, sent.last, sent.per_queue
    queues = [
        {**({"broker": b} if b else {}), "queue_id": q, "messages": per_queue[(b, q)]}
        for b, q in sorted(per_queue)
    ]
    if ui.json:
        ui.document(
            {
                "topic": topic,
                "messages": sent.messages,
                "queues": queues,
                "first_message_id": first.message_id if first else None,
                "last_message_id": last.message_id if last else None,
                "deliver_at_ms": (first.deliver_at_ms or None) if first else None,
            }
        )
        return
    used = ", ".join(
        f"{b + '/' if b else ''}{q} ({per_queue[(b, q)]})" for b, q in sorted(per_queue)
    )
    ui.line(
        format_pairs(
            [
                ("topic", topic),
                ("messages", sent.messages),
                ("queues", used or None),
                ("first id", first.message_id if first else None),
                ("last id", last.message_id if last else None),
                *_delayed(first),
            ]
        )
    )


def _delayed(first: SendResult | None) -> list[tuple[str, object]]:
    """The delivery time of a delayed run (its messages have no offsets yet)."""
    if first is None or not first.deliver_at_ms:
        return []
    return [("deliver at", f"{format_time(first.deliver_at_ms)} (cancel one with "
             "'equeue message cancel ID')")]  # fmt: skip
