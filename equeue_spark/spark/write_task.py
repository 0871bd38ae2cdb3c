"""What a Spark write task does: turn Arrow batches into produce requests.

Columns (any others are ignored, so a DataFrame read from a topic can be
written to another as is):

    value      binary or string, required, never null
    key        binary or string, optional (null = no key; routes by hash)
    topic      string, required unless the ``topic`` option is set (it wins)
    queue      int or long, optional (null = route by key / round robin)
    tag        string, optional (null = untagged)
    headers    array<struct<key: string, value: binary or string>>, optional
    timestamp  timestamp, optional (the message's timestamp; null = broker time)
    broker     string, optional; over a cluster (option ``namesrv``) the broker
               name of the ``queue`` column's queue (required beside it); ignored
               on a single broker
    deliver_at timestamp, optional: delayed delivery (nobody reads the row's
               message before then; null = at once); needs
               ``delivery=at_least_once`` (a transaction cannot hold a delayed
               message)

Over a cluster rows route like the producer's (``Producer.send_request``):
a key over the topic's ordered (broker, queue) list, keyless rows round robin.
Exactly-once over a cluster: a task stages its rows in a transaction of the
same id on each broker they route to (keyless rows of a task all to the queue
its partition number picks, so a replayed batch routes the same way), and its
summary counts the rows per broker; the driver commits each broker's part
with the same sink and batch id (``commit_on_brokers``).

The value and key columns go into the request as Arrow's own buffers (one
blob plus lengths), so the common case does no per-row Python work; tags and
headers, when present, are converted row by row. Requests are pipelined on one
``ProduceStream`` per task. Pyspark-free.

Exactly-once delivery (the default): a task stages its rows in one broker
transaction whose id names the write, the partition and the attempt (see
``transaction_id``); the driver commits the transactions of the successful
attempts together and aborts the rest by id prefix (see source.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from equeue_proto.protocol import BROKER_TIME
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.admin import Admin
from equeue_spark.client.batches import header_section
from equeue_spark.client.errors import EqueueError, InvalidRequest
from equeue_spark.client.producer import Producer
from equeue_spark.client.transactions import (
    CommitOutcome,
    abort_transactions,
    commit_transactions,
)
from equeue_spark.spark.encode import encode_batch
from equeue_spark.spark.options import WriteOptions

log = logging.getLogger("equeue.spark")


@dataclass
class WriteSummary:
    """What one task wrote."""

    rows: int = 0
    transaction: str = ""
    """The transaction holding the rows (exactly-once), else empty."""
    sink: str = ""
    """The sink the transaction belongs to (streaming exactly-once)."""
    brokers: dict[str, int] = field(default_factory=dict)
    """Exactly-once: rows staged per broker group (``""``: one broker; the
    transaction has the same id on each)."""


def transaction_id(write: str, partition: int, attempt: int) -> str:
    """A task attempt's transaction: ``<write>:<partition>:<attempt>``, where
    ``write`` is ``transaction_prefix(...)`` without its final colon."""
    return f"{write}:{partition}:{attempt}"


def transaction_prefix(sink: str, batch_id: int | None = None) -> str:
    """What every transaction of a batch job (``batch_id`` None) or of one
    streaming micro-batch starts with; commits abort leftovers by it."""
    return f"{sink}:" if batch_id is None else f"{sink}:{batch_id}:"


def write_batches(
    options: WriteOptions, batches: Iterator[pa.RecordBatch], txn_id: str = "", seed: int = 0
) -> WriteSummary:
    """Produce every row of ``batches`` - staged in transaction ``txn_id`` if
    given (aborted where it staged rows if the task fails); return what was
    written. ``seed`` (the partition) places keyless rows of an exactly-once
    write over a cluster."""
    summary = WriteSummary(transaction=txn_id)
    with Producer(config=options.client, enable_idempotence=options.enable_idempotence) as producer:
        requests = _requests(options, batches)
        if not txn_id:
            for results in producer.send_routed(requests):
                summary.rows += len(results)
            return summary
        for staged in producer.stage_requests(requests, txn_id, seed):
            for broker, rows in staged.items():
                summary.brokers[broker] = summary.brokers.get(broker, 0) + rows
                summary.rows += rows
    return summary


def _requests(
    options: WriteOptions, batches: Iterator[pa.RecordBatch]
) -> Iterator[tuple[pb.ProduceRequest, list[str | None] | None]]:
    """Each request with the broker column beside its queue column, if both."""
    size = options.batch_size
    for given in batches:
        _check_values(given)
        batch = encode_batch(given, options.formats) if options.formats.decodes else given
        for start in range(0, batch.num_rows, size):
            piece = batch.slice(start, size)
            for topic, rows in _by_topic(options, piece):
                names = rows.schema.names
                brokers = None
                if "queue" in names and "broker" in names:
                    brokers = rows.column("broker").to_pylist()
                yield build_produce(topic, rows), brokers


def commit_on_brokers(
    options: WriteOptions,
    summaries: list[WriteSummary],
    *,
    sink: str = "",
    batch_id: int = -1,
    abort_prefix: str = "",
    before: Callable[[str], None] | None = None,
) -> dict[str, CommitOutcome]:
    """Commit an exactly-once write's transactions on each broker group that
    holds some of its rows (one broker: its one group, ``""``), by name, each with the same ``sink``
    and ``batch_id``; then abort ``abort_prefix`` leftovers on the other live
    brokers (best effort). Each broker's commit is idempotent per sink and
    batch: if the driver dies between two brokers' commits, the replay of the
    batch commits the missing parts and the others answer "already committed".
    ``before(broker)`` runs before each broker's commit (tests use it)."""
    by_broker: dict[str, list[tuple[str, int]]] = {}
    for summary in summaries:
        for broker, rows in summary.brokers.items():
            if rows:
                by_broker.setdefault(broker, []).append((summary.transaction, rows))
    outcomes: dict[str, CommitOutcome] = {}
    with Admin(config=options.client) as admin:
        cluster = admin.routes
        for broker in sorted(by_broker):
            if before is not None:
                before(broker)
            conn = cluster.connection(cluster.broker_address(broker))
            outcomes[broker] = commit_transactions(
                conn, by_broker[broker], sink=sink, batch_id=batch_id, abort_prefix=abort_prefix
            )
        if abort_prefix:
            for entry in cluster.brokers():
                if entry.broker_name in by_broker or entry.replica_id:
                    continue
                try:
                    abort_transactions(cluster.connection(entry.address), prefix=abort_prefix)
                except EqueueError as exc:
                    log.warning(
                        "could not abort %s* on %s: %s", abort_prefix, entry.broker_name, exc
                    )
    return outcomes


def abort_on_brokers(options: WriteOptions, prefix: str) -> int:
    """Abort every transaction starting with ``prefix`` on every live broker (master)."""
    aborted = 0
    with Admin(config=options.client) as admin:
        cluster = admin.routes
        for entry in cluster.brokers():
            if entry.replica_id:
                continue
            try:
                aborted += abort_transactions(cluster.connection(entry.address), prefix=prefix)
            except EqueueError as exc:
                log.warning("could not abort %s* on %s: %s", prefix, entry.broker_name, exc)
    return aborted


def _check_values(batch: pa.RecordBatch) -> None:
    """Refuse null values before anything of ``batch`` is sent, counting them
    over the whole Arrow batch (not one request's slice of it)."""
    if "value" not in batch.schema.names:
        raise InvalidRequest("the DataFrame has no value column")
    nulls = batch.column("value").null_count
    if nulls:
        raise InvalidRequest(
            f"the value column is null in {nulls} of {batch.num_rows} rows; every message "
            "needs a value: drop or fill those rows first, e.g. df.na.drop(subset=['value'])"
        )


def _by_topic(options: WriteOptions, batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
    if options.topic:
        yield options.topic, batch
        return
    if "topic" not in batch.schema.names:
        raise InvalidRequest("no topic: give the topic option or a topic column")
    topics = batch.column("topic")
    if topics.null_count:
        raise InvalidRequest("the topic column is null in some rows; set the topic option")
    for topic in pc.unique(topics).to_pylist():
        yield topic, batch.filter(pc.equal(topics, topic))


def _blob(array: pa.Array) -> tuple[bytes, pa.Array]:
    """The concatenated bytes of a binary/string array and each row's length
    (null for null rows, whose bytes are left out)."""
    array = array.cast(pa.binary()) if array.type != pa.binary() else array
    lengths = pc.binary_length(array)
    if array.null_count:
        array = array.fill_null(b"")
    _, offsets_buf, data = array.buffers()
    offsets = memoryview(offsets_buf).cast("i")[array.offset : array.offset + len(array) + 1]
    blob = b"" if data is None else data.slice(offsets[0], offsets[-1] - offsets[0]).to_pybytes()
    return blob, lengths


def build_produce(topic: str, batch: pa.RecordBatch) -> pb.ProduceRequest:
    """One produce request for the rows of ``batch`` (checked, see the module doc)."""
    names = batch.schema.names
    n = batch.num_rows
    values = batch.column("value")
    if values.null_count:
        raise InvalidRequest(
            f"the value column is null in {values.null_count} of {n} rows for {topic!r}"
        )
    blob, lengths = _blob(values)
    cols = pb.MessageColumns(count=n, values=blob, value_lengths=lengths.to_pylist())
    if "key" in names:
        keys, key_lengths = _blob(batch.column("key"))
        cols.keys = keys
        cols.key_lengths.extend(key_lengths.fill_null(-1).to_pylist())
    if "tag" in names:
        cols.tags.extend(t or "" for t in batch.column("tag").to_pylist())
    if "headers" in names:
        encoded = [_encode_headers(h) for h in batch.column("headers").to_pylist()]
        cols.headers = b"".join(encoded)
        cols.header_lengths.extend(len(h) for h in encoded)
    if "timestamp" in names:
        stamps = batch.column("timestamp")
        if pa.types.is_timestamp(stamps.type):
            stamps = stamps.cast(pa.timestamp("ms", tz=stamps.type.tz)).cast(pa.int64())
        # A null timestamp asks for the broker's store time (BROKER_TIME), not 1970.
        cols.timestamps_ms.extend(stamps.fill_null(BROKER_TIME).to_pylist())
    request = pb.ProduceRequest(topic=topic, messages=cols)
    if "queue" in names:
        request.queue_ids.extend(batch.column("queue").fill_null(-1).to_pylist())
    if "deliver_at" in names:
        request.deliver_at_ms.extend(_deliver_at_ms(batch.column("deliver_at")))
    return request


def _deliver_at_ms(column: pa.Array) -> list[int]:
    """The ``deliver_at`` column as ``ProduceRequest.deliver_at_ms``: one
    time per row (a null row: now, delivered at once); none when every row
    is null (the request is not a delayed one)."""
    if column.null_count == len(column):
        return []
    if pa.types.is_timestamp(column.type):
        # Microseconds cut to ms (a cast that keeps them all would refuse).
        column = column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
    now = int(time.time() * 1000)
    return [int(t) for t in column.fill_null(now).to_pylist()]


def _encode_headers(headers: list[dict[str, object]] | None) -> bytes:
    """One message's headers (a Spark array of key/value structs) in the
    record format; none at all is the empty section."""
    if not headers:
        return b""
    return header_section([(str(h["key"] or ""), _header_value(h["value"])) for h in headers])


def _header_value(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return b""  # a null header value


QUEUE_COLUMN_NEEDS_BROKER = (
    "over a cluster (option namesrv) a queue column needs a broker column beside it"
)


def _by_id_alone(broker: str, missing: str) -> str:
    """A queue id alone names its queue (one broker's routes)."""
    return broker


def check_schema(
    fields: dict[str, str],
    topic_option: str,
    queue_group: Callable[[str, str], str] = _by_id_alone,
    *,
    exactly_once: bool = False,
    encoded: Sequence[str] = (),
) -> None:
    """Reject a DataFrame the sink cannot write, before any task runs.

    ``fields`` maps column name to Spark's simple type string;
    ``queue_group``: the sink's ``Routes.group`` (the broker group of a queue
    column without a broker column, or InvalidRequest where a queue id alone
    names no queue: a cluster's); ``exactly_once``: rows are staged in
    transactions, which cannot hold delayed messages (``deliver_at``);
    ``encoded``: columns the sink encodes with a schema (encode.py checks them).
    """
    if exactly_once and "deliver_at" in fields:
        raise InvalidRequest(
            "a deliver_at column (delayed delivery) needs option delivery=at_least_once: "
            "exactly-once writes stage rows in transactions, which cannot hold delayed messages"
        )
    if "queue" in fields and "broker" not in fields:
        queue_group("", QUEUE_COLUMN_NEEDS_BROKER)
    allowed = {
        "value": ("binary", "string"),
        "key": ("binary", "string"),
        "topic": ("string",),
        "queue": ("int", "bigint", "smallint", "tinyint"),
        "tag": ("string",),
        "timestamp": ("timestamp", "timestamp_ntz", "bigint"),
        "broker": ("string",),
        "deliver_at": ("timestamp", "timestamp_ntz", "bigint"),
    }
    if "value" not in fields:
        raise InvalidRequest(f"the DataFrame has no value column (columns: {sorted(fields)})")
    if not topic_option and "topic" not in fields:
        raise InvalidRequest("no topic: give the topic option or a topic column")
    for name, types in allowed.items():
        if name in fields and name not in encoded and fields[name] not in types:
            raise InvalidRequest(
                f"column {name} has type {fields[name]}; the equeue sink takes {' or '.join(types)}"
            )
    if "headers" in fields and not fields["headers"].startswith("array<struct<key:string,value:"):
        raise InvalidRequest(
            f"column headers has type {fields['headers']}; the equeue sink takes "
            "array<struct<key:string,value:binary>>"
        )
