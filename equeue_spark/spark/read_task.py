"""What a Spark read task does: stream one queue range and yield Arrow batches.

Runs on an executor, in a Python worker that shares nothing with the driver:
everything it needs travels in the picklable ``QueueRange``; it opens its own
channel and closes it when the range is read. Replies of the server-streaming
``PullStream`` RPC are gathered into batches of about ``ROWS_PER_BATCH`` records
and decoded in one C call each. When the broker has a fetch port (plain TCP,
``client/fetch.py``) and the range has no tags, filter or TLS, the same replies
come over it instead, for about a third less CPU per GB (the broker has it off
by default: docs/benchmarks.md); PullStream takes over if it fails.

Over a cluster a range names its broker group's members in the order to read
them (``broker``, then ``fallbacks``: the master and its replicas, replicas
first with readFromReplicas): a member that stops answering mid-range
(UNAVAILABLE, deadline) hands the rest of the range to the next one, from
the offset reached; records are at the same offsets on every member.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

import pyarrow as pa

from equeue_proto.allocator import tune_malloc
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.columns import decode_columns
from equeue_spark.client.connection import Connection
from equeue_spark.client.errors import EqueueError
from equeue_spark.client.fetch import FetchUnavailable, FetchWrongBroker, fetch_replies
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.routing import members_in_turn
from equeue_spark.client.wire import PullReply
from equeue_spark.spark.arrow import to_record_batch
from equeue_spark.spark.errors import OffsetsLostError
from equeue_spark.spark.options import Security

log = logging.getLogger("equeue.spark")

ROWS_PER_BATCH = 32_768
BYTES_PER_BATCH = 8 << 20
REPLY_MESSAGES = 2_000
REPLY_BYTES = 1 << 20
"""Small replies stream faster (bench/spark_bench.py: 1.7x over 10k/4 MiB at 1 KiB)."""
MAX_STREAMS = 10_000
"""Bound on PullStream calls for one range (each one makes progress)."""
PREFETCH_REPLIES = 16
"""Replies read ahead of the decoder (at most about 16 MiB: replies are <= REPLY_BYTES
unless one record is larger)."""
READ_TRANSPORT_ENV = "EQUEUE_READ_TRANSPORT"
"""``grpc``: always PullStream; ``auto`` (default): the broker's fetch port when it
has one (fetch.py), PullStream otherwise."""
POLL_S = 0.1
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class QueueRange:
    """One Spark input partition: ``[start, end)`` of one queue."""

    topic: str
    queue_id: int
    start: int
    end: int
    broker: str
    timeout_ms: int
    tags: tuple[str, ...] = ()
    filter: str = ""
    """Broker filter expression (option ``filter`` AND pushed filters); empty: none."""
    fail_on_data_loss: bool = True
    security: Security = field(default_factory=Security)
    broker_name: str = ""
    """The broker group's name in a cluster (option ``namesrv``); empty for
    one broker (a cluster of one group, named ``""``)."""
    fallbacks: tuple[str, ...] = ()
    """The group's other members (none for one broker), read in turn if
    ``broker`` (and each one before) stops answering."""
    spans: tuple[tuple[int, int], ...] = ()
    """Sub-ranges of ``[start, end)`` to read, in order (pushed-down filters
    planned several in one queue); empty: all of ``[start, end)``."""

    def pieces(self) -> list[QueueRange]:
        """The ranges a task reads: itself, or one per span."""
        if not self.spans:
            return [self]
        return [dataclasses.replace(self, start=lo, end=hi, spans=()) for lo, hi in self.spans]

    @property
    def queue(self) -> str:
        """The queue as errors name it: ``BROKER/TOPIC/QUEUE`` in a cluster
        (each broker has a queue 0 of the topic), else ``TOPIC/QUEUE``."""
        prefix = f"{self.broker_name}/" if self.broker_name else ""
        return f"{prefix}{self.topic}/{self.queue_id}"


def read_range(part: QueueRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The records of ``part`` as Arrow batches of ``schema``, in offset order."""
    tune_malloc()  # per-reply megabytes reused instead of mapped afresh (allocator.py)
    want_headers = schema.get_field_index("headers") >= 0
    pending: list[memoryview] = []
    rows = size = 0
    broker_id = ""
    ahead: ReadAhead[PullReply] = ReadAhead(PREFETCH_REPLIES)
    members = Members(part)
    replies = (r for piece in part.pieces() for r in _member_replies(members, piece))
    try:
        for reply in ahead.run(replies):
            broker_id = reply.broker_id
            if not reply.count:
                continue
            pending.append(reply.records)
            rows += reply.count
            size += len(reply.records)
            if rows >= ROWS_PER_BATCH or size >= BYTES_PER_BATCH:
                yield _batch(pending, broker_id, want_headers, schema)
                pending, rows, size = [], 0, 0
    finally:
        members.close()
        ahead.stop()  # after the channels closed: that cancels a stream still running
    if pending:
        yield _batch(pending, broker_id, want_headers, schema)


T = TypeVar("T")


class Members:
    """The channels one range is read over (the first member's, then a
    fallback's after a failure), closed together by the reading task."""

    def __init__(self, part: QueueRange) -> None:
        self.part = part
        self._lock = threading.Lock()
        self._conns: dict[str, Connection] = {}
        self._closed = False

    def open(self, address: str) -> Connection:
        """The channel to ``address`` (one per member, shared by the range's spans)."""
        with self._lock:
            if self._closed:
                raise OffsetsLostError(f"{self.part.queue}: the read was stopped")
            if address not in self._conns:
                self._conns[address] = Connection(
                    self.part.security.client(address, self.part.timeout_ms)
                )
            return self._conns[address]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()


def _member_replies(members: Members, part: QueueRange) -> Iterator[PullReply]:
    """``_replies`` of the range from its first member; when a member stops
    answering, the rest of the range from the next one (``members_in_turn``,
    the client's one loop over a group's members)."""
    addresses = [part.broker, *part.fallbacks]
    reached = part.start

    def attempt(address: str, _last: bool) -> Iterator[PullReply]:
        nonlocal reached
        conn = members.open(address)
        for reply in _transport_replies(conn, dataclasses.replace(part, start=reached)):
            reached = max(reached, reply.next_offset)
            yield reply

    def moved(address: str, exc: EqueueError) -> None:
        following = addresses[addresses.index(address) + 1]
        log.warning("%s: %s does not answer (%s); reading from %d on %s",
                    part.queue, address, exc, reached, following)  # fmt: skip

    return members_in_turn(addresses, attempt, moved)


class ReadAhead(Generic[T]):
    """Runs an iterator (of replies) on its own thread, up to ``depth`` items ahead.

    While the task decodes a batch and Spark ships it to the JVM, the stream
    keeps arriving instead of stalling on HTTP/2 flow control; gRPC waits for
    the network with the GIL released, so the two overlap. Errors of the
    iterator are raised in the consumer, in order. ``stop`` (after closing the
    channel, which ends a blocked stream) joins the thread, bounded.
    """

    _END = object()

    def __init__(self, depth: int) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self, replies: Iterator[T]) -> Iterator[T]:
        self._thread = threading.Thread(
            target=self._pump, args=(replies,), name="equeue-read-ahead", daemon=True
        )
        self._thread.start()
        while True:
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the read-ahead thread ended without a result") from None
                continue
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield cast("T", item)

    def _pump(self, replies: Iterator[T]) -> None:
        item: object = self._END
        try:
            for reply in replies:
                if not self._put(reply):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            item = exc
        self._put(item)

    def _put(self, item: object) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)


def _batch(
    pending: list[memoryview], broker_id: str, headers: bool, schema: pa.Schema
) -> pa.RecordBatch:
    """One Arrow batch from several replies' records, decoded in place (no join)."""
    return to_record_batch(decode_columns(pending, broker_id, headers), schema, broker_id)


def _transport_replies(conn: Connection, part: QueueRange) -> Iterator[PullReply]:
    """``_replies`` over the broker's fetch port when it has one (fetch_address),
    else, or from the offset reached when the fetch port fails, over PullStream."""
    address = fetch_address(conn, part)
    reached = part.start
    if address:
        token = conn.config.resolved_token()
        timeout_s = conn.config.timeout_s
        with _FETCH_LOCK:
            broker_id = _FETCH_BROKER_IDS.get(conn.config.broker, "")

        def fetched(offset: int, end: int) -> Iterator[PullReply]:
            try:
                yield from fetch_replies(
                    address, part.topic, part.queue_id, offset, end, token=token,
                    batch_messages=REPLY_MESSAGES, batch_bytes=REPLY_BYTES, timeout_s=timeout_s,
                    broker_id=broker_id,
                )  # fmt: skip
            except FetchUnavailable:
                raise
            except EqueueError as exc:  # an ERROR frame (a limit, a refusal): PullStream
                # serves the rest, and raises its own error if it has one to raise.
                raise FetchUnavailable(f"fetch port {address}: {exc}") from exc

        try:
            for reply in _replies(fetched, part):
                reached = max(reached, reply.next_offset)
                yield reply
            return
        except FetchUnavailable as exc:
            _fetch_failed(conn.config.broker, address, exc)
        part = dataclasses.replace(part, start=reached)

    def streamed(offset: int, end: int) -> Iterator[PullReply]:
        return stream_replies(
            conn, part.topic, part.queue_id, offset, end,
            batch_messages=REPLY_MESSAGES, batch_bytes=REPLY_BYTES, tags=part.tags,
            filter=part.filter,
        )  # fmt: skip

    yield from _replies(streamed, part)


_FETCH_ADDRESSES: dict[str, str] = {}
"""Broker address -> its fetch port's address ("": none), learned once per
Python worker process (Spark reuses workers across tasks)."""
_FETCH_BROKER_IDS: dict[str, str] = {}
"""Broker address -> the broker id GetStats reported: replies must carry it."""
_FETCH_FAILED: dict[str, float] = {}
"""Broker address -> when (monotonic) its fetch port may be tried again."""
FETCH_RETRY_S = 30.0
"""How long a worker reads a broker over PullStream after its fetch port failed."""
_FETCH_LOCK = threading.Lock()


def fetch_address(conn: Connection, part: QueueRange) -> str:
    """The fetch port to read ``part`` from, or "" for PullStream: ranges with
    tags or a filter, TLS connections, ``EQUEUE_READ_TRANSPORT=grpc``, and
    brokers that do not report one (older brokers, tokens without ``admin``:
    GetStats is an Admin call) use PullStream."""
    if os.environ.get(READ_TRANSPORT_ENV, "auto").strip().lower() == "grpc":
        return ""
    if part.tags or part.filter:
        return ""
    broker = conn.config.broker
    with _FETCH_LOCK:
        if time.monotonic() < _FETCH_FAILED.get(broker, 0.0):
            return ""
        known = _FETCH_ADDRESSES.get(broker)
    if known is not None:
        return known
    found, broker_id = "", ""
    if conn.config.credentials() is None:  # plain text to the broker: so may the fetch port be
        try:
            stats = conn.call(conn.admin.GetStats, pb.GetStatsRequest(), retry=False)
            found, broker_id = stats.fetch_address, stats.broker_id
        except EqueueError as exc:
            log.info("%s: no fetch port address (%s); reading over PullStream", broker, exc)
    with _FETCH_LOCK:
        _FETCH_ADDRESSES[broker] = found
        _FETCH_BROKER_IDS[broker] = broker_id
    return found


def _fetch_failed(broker: str, address: str, exc: EqueueError) -> None:
    """Read ``broker`` over PullStream for ``FETCH_RETRY_S`` after its fetch port
    failed (saying so once per failure spell); an answer from another broker also
    drops the cached address (learned again from GetStats)."""
    with _FETCH_LOCK:
        failing = time.monotonic() < _FETCH_FAILED.get(broker, 0.0)
        _FETCH_FAILED[broker] = time.monotonic() + FETCH_RETRY_S
        if isinstance(exc, FetchWrongBroker):
            _FETCH_ADDRESSES.pop(broker, None)
            _FETCH_BROKER_IDS.pop(broker, None)
    if not failing:
        log.warning("%s: fetch port %s failed (%s); reading over PullStream for %.0f s",
                    broker, address, exc, FETCH_RETRY_S)  # fmt: skip


def _replies(
    stream: Callable[[int, int], Iterator[PullReply]], part: QueueRange
) -> Iterator[PullReply]:
    """The replies of ``stream(offset, end)`` covering ``[start, end)``,
    streaming again if a stream ends early, and applying the data-loss policy
    when the start is gone."""
    offset = part.start
    for _ in range(MAX_STREAMS):
        if offset >= part.end:
            return
        last = None
        for reply in stream(offset, part.end):
            last = reply
            if reply.status in (pb.PULL_STATUS_OFFSET_TOO_SMALL, pb.PULL_STATUS_OFFSET_TOO_BIG):
                break
            yield reply
        if last is None:
            raise OffsetsLostError(f"{part.queue}: empty reply stream at {offset}")
        if last.status == pb.PULL_STATUS_OFFSET_TOO_SMALL:
            offset = _skip_lost(part, offset, last.earliest_offset)
        elif last.end_offset < part.end and last.next_offset >= last.end_offset:
            _short_queue(part, last.end_offset)
            return
        else:
            offset = last.next_offset
    raise OffsetsLostError(f"{part.queue}: no progress reading [{part.start}, {part.end})")


def _short_queue(part: QueueRange, end: int) -> None:
    """The queue ends before the planned range does: records the query was
    promised are gone (a crash in async flush mode, or a recreated topic)."""
    where = f"{part.queue}: the query planned offsets up to {part.end}"
    if part.fail_on_data_loss:
        raise OffsetsLostError(
            f"{where}, but the queue ends at {end} (the broker lost unflushed data, or the "
            "topic was recreated); set failOnDataLoss=false to go on without them"
        )
    log.warning("%s, but the queue ends at %d: %d records lost", where, end, part.end - end)


def _skip_lost(part: QueueRange, offset: int, earliest: int) -> int:
    where = f"{part.queue} offsets [{offset}, {min(earliest, part.end)})"
    if part.fail_on_data_loss:
        raise OffsetsLostError(
            f"{where} were removed by retention before the query read them; "
            "set failOnDataLoss=false to skip lost records instead of failing"
        )
    log.warning("skipping %s: removed by retention (%d records lost)", where,
                min(earliest, part.end) - offset)  # fmt: skip
    return earliest
