"""The ``equeue`` Spark data source: batch and streaming reads and writes.

Spark's Python Data Source API calls these classes; the work is done by the
pyspark-free modules beside this one (options, planning, read_task,
write_task). Process model (see docs/spark.md): the stream reader's planning
methods run in one long-lived Python process on the driver, so the reader may
keep a broker connection there; ``read`` and ``write`` run in executor
workers and must rebuild everything from their (pickled) arguments.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from typing import Any, ParamSpec, TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from equeue_spark.client.cluster import connect, target
from equeue_spark.client.errors import BrokerUnavailable, DeadlineExceeded, EqueueError
from equeue_spark.spark.arrow import arrow_schema, read_schema
from equeue_spark.spark.decode import SchemaSource, driver_plan, read_decoded
from equeue_spark.spark.encode import encoded_parts, prepare_write
from equeue_spark.spark.errors import BrokerUnreachable, InvalidOption
from equeue_spark.spark.formats import DecodePlan, read_struct
from equeue_spark.spark.offsets import (
    Offsets,
    backlog,
    from_json,
    incarnations,
    rate_limit,
    recreated_topics,
    split_budget,
    to_json,
)
from equeue_spark.spark.options import BATCH_ONLY, ReadOptions, WriteOptions, headers_requested
from equeue_spark.spark.planning import Listing, Planner, Queues
from equeue_spark.spark.pushdown import Pushdown, push, pushdown_planner
from equeue_spark.spark.read_task import QueueRange, read_range
from equeue_spark.spark.workers import warn_about_worker_python
from equeue_spark.spark.write_task import (
    WriteSummary,
    abort_on_brokers,
    check_schema,
    commit_on_brokers,
    transaction_id,
    transaction_prefix,
    write_batches,
)

log = logging.getLogger("equeue.spark")

P = ParamSpec("P")
R = TypeVar("R")


def _standalone(exc: EqueueError, options: ReadOptions | WriteOptions) -> EqueueError:
    """``exc`` as the one line a user needs: a broker that does not answer is
    named with the address and ``timeoutMs``; other errors keep their message."""
    if not isinstance(exc, BrokerUnavailable | DeadlineExceeded):
        return exc.with_traceback(None)
    where, option = target(options.client)
    return BrokerUnreachable(
        f"{where} did not answer within timeoutMs={options.timeout_ms} ({exc}): check that "
        f"it runs at that address (option {option}), or raise timeoutMs",
        exc.code,
    )


def _one_line(method: Callable[P, R]) -> Callable[P, R]:
    """For the methods Spark calls on the driver: an ``EqueueError`` leaves
    without the call chain under it (``from None``), so Spark's rendering of
    the Python traceback is a few lines that end in the message, and a broker
    that does not answer says which and within what (``_standalone``). The
    first argument is the reader or writer (its ``options``)."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except EqueueError as exc:
            raise _standalone(exc, args[0].options) from None  # type: ignore[attr-defined]

    return wrapper


def _plain_errors(
    batches: Iterator[pa.RecordBatch], options: ReadOptions
) -> Iterator[pa.RecordBatch]:
    """A read task's batches, with ``_one_line``'s errors."""
    try:
        yield from batches
    except EqueueError as exc:
        raise _standalone(exc, options) from None


class EqueueDataSource(DataSource):
    """``format("equeue")``: read topics as rows, write rows into topics.

    Batch and streaming reads (``spark.read``, ``spark.readStream``) and writes
    (``df.write``, ``df.writeStream``) against an equeue broker. Spark finds the
    source without registration through the top-level module ``pyspark_equeue``;
    ``spark.dataSource.register(EqueueDataSource)`` works too. Spark's Python
    workers must run an interpreter that has ``equeue-mq`` installed
    (``PYSPARK_PYTHON``).

    Name: ``equeue``

    Read schema: ``key binary, value binary, topic string, queue int, offset long,
    timestamp timestamp, tag string, message_id string, broker string, timestampType int,
    storeTimestamp timestamp``, plus ``headers array<struct<key:string,value:binary>>``
    with ``includeHeaders``. ``timestamp`` is the producer's time (``timestampType`` 0,
    Kafka's CreateTime); ``storeTimestamp`` the broker's store time (LogAppendTime),
    which ``startingTimestamp``/``endingTimestamp`` compare. With ``valueFormat``
    ``avro``/``json``, ``value`` is a struct and ``valueSchemaVersion int`` follows
    ``storeTimestamp`` (docs/spark-formats.md). Write columns:
    ``value`` (binary or string, required), ``key``, ``topic``, ``queue``, ``tag``,
    ``headers``, ``timestamp``; other columns are ignored.

    Options
    -------
    broker : str, default ``$EQUEUE_BROKER``, else ``127.0.0.1:5000``
        Broker address, ``host:port``. Reads and writes.
    namesrv : str
        A cluster's name servers, ``host:port[,host:port...]``, instead of
        ``broker``: partitions per (broker, queue), offsets name queues
        ``"BROKER/QUEUE"``, writes route like the producer. Reads and writes.
    topic : str
        Reads: one topic or a comma list (exactly one of ``topic`` and
        ``topicPattern``); a batch read fails naming one that does not exist.
        Writes: the topic of every row (overrides the column).
    topicPattern : str
        Reads only. Regex matched against whole topic names before every
        micro-batch; new topics and queues start at their earliest offset.
    group : str
        Reads only. Consumer group whose progress the query commits on the broker;
        a new query starts at its committed offsets unless ``startingOffsets`` says.
    startingOffsets : str, default ``group`` with a group, else ``latest``/``earliest``
        Reads only (``latest`` streaming, ``earliest`` batch). ``earliest``,
        ``latest``, ``group``, or JSON ``{"topic": {"0": 12, "1": -2}}``
        (-2 earliest, -1 latest). A restarted
        query resumes from its checkpoint instead.
    groupFallback : str, default ``earliest``
        Reads only. With ``startingOffsets=group``: where queues the group never
        committed start (``earliest`` or ``latest``), so a new group reads the topic.
    startingTimestamp : int
        Reads only. Ms since the epoch: start every queue at its first record
        stored at or after it (instead of ``startingOffsets``). Compared with
        the broker's store time (``storeTimestamp``), not the producer's
        ``timestamp``.
    endingOffsets : str, default ``latest``
        Batch reads only. ``latest`` or JSON as above (-1 latest); exclusive.
    endingTimestamp : int
        Batch reads only. Stop every queue before its first record stored at or
        after this time (ms since the epoch; the broker's store time, as above).
    maxOffsetsPerTrigger : int, default none
        Reads only. At most this many offsets per micro-batch, split over queues
        by backlog.
    minOffsetsPerTrigger : int, default none
        Reads only. Wait for this many new offsets before a micro-batch ...
    maxTriggerDelay : str, default ``15m``
        Reads only. ... but not longer than this (``500ms``, ``30s``, ``1h``, ``1d``).
    maxBytesPerTrigger : int, default none
        Reads only. At most about this many stored bytes per micro-batch.
    maxRecordsPerPartition : int, default none
        Reads only. Split a queue's range into tasks of at most this many offsets
        (default: one task per queue).
    subscribe : str
        Reads only. Kafka's name for ``topic``.
    subscribePattern : str
        Reads only. Kafka's name for ``topicPattern``.
    assign : str
        Reads only. JSON ``{"orders":[0,1]}`` (cluster ``{"orders":["a/0"]}``):
        exactly these queues, instead of ``topic``/``topicPattern``.
    startingOffsetsByTimestamp : str
        Reads only. JSON ``{"orders":{"0":1767225600000}}``: each named queue
        starts at its first record stored at or after its time.
    endingOffsetsByTimestamp : str
        Batch reads only. JSON as above: each named queue stops before its
        first record stored at or after its time.
    startingOffsetsByTimestampStrategy : str, default ``latest``
        Reads only. A queue with no record at or after its starting time:
        ``latest`` starts it at its end, ``error`` fails naming it.
    minPartitions : int, default none
        Reads only. At least about this many tasks: the largest ranges are split.
    valueFormat : str, default ``binary``
        ``binary``, ``string``, ``avro`` or ``json``: ``value`` becomes a struct
        decoded with (writes: encoded with) the topic's schema. Reads and writes.
    keyFormat : str, default ``binary``
        The same for ``key`` with the topic's key schema. Reads and writes.
    valueSchemaVersion : str, default ``latest``
        The schema version to read with or write with. Reads and writes.
    keySchemaVersion : str, default ``latest``
        The same for keys. Reads and writes.
    valueSchema : str
        Reads only. An explicit reader schema (Avro or JSON Schema text).
    keySchema : str
        Reads only. The same for keys.
    mode : str, default ``FAILFAST``
        Reads only. A record that does not decode: ``FAILFAST`` fails naming
        topic, queue and offset; ``PERMISSIVE`` keeps it in the corrupt-record
        column; ``DROPMALFORMED`` drops it.
    columnNameOfCorruptRecord : str, default ``_corrupt_record``
        Reads only. The corrupt-record column of ``mode=PERMISSIVE``.
    schemaEvolutionMode : str, default ``none``
        Reads only. ``restart``: a record of a newer schema version stops the
        query (restart it to read with that version).
    tags : str, default all
        Reads only. Tag filter applied on the broker, ``a|b``.
    filter : str
        Reads only. Filter expression applied on the broker, e.g.
        ``region = 'eu' AND amount > 100``; parsed at ``load()``.
    pushFilters : bool, default ``true``
        Batch reads only. ``false`` takes none of Spark's filters (with
        ``spark.sql.python.filterPushdown.enabled`` on, queue, offset,
        timestamp, tag and key conditions are applied by the source).
    includeHeaders : bool, default ``false``
        Reads only. Add the ``headers`` column.
    readFromReplicas : bool, default ``false``
        Reads only, with ``namesrv``. List offsets and read records on a replica
        of each broker group (the master when none is live); without it a
        replica serves only while the master is unreachable. Commits go to
        masters.
    failOnDataLoss : bool, default ``true``
        Reads only. Fail when records still to read are gone (retention, a
        recreated topic); ``false`` skips them and logs how many, and reads a
        recreated topic (a new incarnation) from its earliest offset.
    timeoutMs : int, default ``30000``
        Deadline of every broker call, its retries included, on the driver and
        in tasks: a dead broker fails the query within it. Reads and writes.
    batchSize : int, default ``5000``
        Writes only. Rows per produce request (1 to 10,000).
    delivery : str, default ``exactly_once``
        Writes only. ``exactly_once`` (broker transactions) or ``at_least_once``.
    enableIdempotence : bool, default ``true``
        Writes only. ``at_least_once`` writes through an idempotent producer
        (its retries append nothing twice); ``false`` for older brokers.
    transactionalId : str, default the query id
        Writes only. Streaming exactly-once: the sink identity the broker keys
        replays by.
    token : str, default ``$EQUEUE_TOKEN``
        Access token for a broker with authentication (redacted by Spark).
        Reads and writes.
    tlsCa : str, default ``$EQUEUE_TLS_CA``
        PEM CA file of the broker's certificate (turns TLS on), readable on the
        driver and every executor. Reads and writes.
    tlsCert : str, default ``$EQUEUE_TLS_CERT``
        PEM client certificate for mutual TLS, with ``tlsKey``. Reads and writes.
    tlsKey : str, default ``$EQUEUE_TLS_KEY``
        PEM private key of ``tlsCert``. Reads and writes.

    Notes
    -----
    Every option is checked when the query starts: an unknown option or a bad
    value fails it with ``InvalidOption`` naming the option and the value.
    docs/spark.md is the full reference (offsets, group progress, delivery).

    Examples
    --------
    Batch read of everything in a topic:

    >>> df = (
    ...     spark.read.format("equeue")
    ...     .option("broker", "127.0.0.1:5000")
    ...     .option("topic", "orders")
    ...     .load()
    ... )

    Streaming read, at most 100,000 records per micro-batch, progress committed
    to consumer group ``etl``:

    >>> stream = (
    ...     spark.readStream.format("equeue")
    ...     .option("broker", "127.0.0.1:5000")
    ...     .option("topic", "orders")
    ...     .option("group", "etl")
    ...     .option("maxOffsetsPerTrigger", 100_000)
    ...     .load()
    ... )

    Write, batch and streaming (exactly-once by default):

    >>> df.write.format("equeue").mode("append").option("topic", "orders-copy").save()
    >>> query = (
    ...     stream.writeStream.format("equeue")
    ...     .option("topic", "orders-copy")
    ...     .option("checkpointLocation", "/tmp/ck/orders-copy")
    ...     .start()
    ... )
    """

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        warn_about_worker_python()  # once per process; tasks would fail far from the cause

    @classmethod
    def name(cls) -> str:
        return "equeue"

    def schema(self) -> str | StructType:
        # Spark asks for the schema at load() (reads only; writes never call it):
        # validating the read options here reports a bad option at load(), for
        # streams too, instead of at start().
        options = _check_read_options(self.options)
        # Spark pickles this instance after schema() and builds the reader
        # from that copy: the reader schema resolved now is the query's.
        self._plan = _decode_plan(options)
        if self._plan is None:
            return read_schema(headers_requested(self.options))
        return read_struct(self._plan)

    def _decode(self, options: ReadOptions) -> DecodePlan | None:
        """The plan of schema() (None without one: a schema given by the user)."""
        return self._plan if hasattr(self, "_plan") else _decode_plan(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        # Spark fails every read of a reader that defines pushFilters while
        # pushdown is off (DATA_SOURCE_PUSHDOWN_DISABLED), and says which it
        # is only by the planner it runs: the pushdown reader only there.
        options = ReadOptions.parse(self.options, streaming=False)
        plan = self._decode(options)
        if options.push_filters and pushdown_planner():
            return EqueuePushdownReader(options, schema, plan)
        return EqueueBatchReader(options, schema, plan)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = ReadOptions.parse(self.options, streaming=True)
        return EqueueStreamReader(options, schema, self._decode(options))

    def writer(self, schema: StructType, overwrite: bool) -> EqueueWriter:
        if overwrite:
            raise InvalidOption("save mode overwrite: topics are append-only; use mode('append')")
        return EqueueWriter(_write_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> EqueueStreamWriter:
        return EqueueStreamWriter(_write_options(self.options, schema))


def _check_read_options(raw: Any) -> ReadOptions:
    """``InvalidOption`` for any option a read of either kind rejects; the
    batch/stream-specific checks (an ending offset in a stream) wait for the
    reader, which knows which it is."""
    batch_only = any(k.lower() in BATCH_ONLY for k in raw)
    return ReadOptions.parse(raw, streaming=not batch_only)


def _decode_plan(options: ReadOptions) -> DecodePlan | None:
    """How ``value``/``key`` are decoded (formats.py); reader schemas fetched now."""
    try:
        return driver_plan(options.formats, options.topics, options.client, options.include_headers)
    except EqueueError as exc:
        raise _standalone(exc, options) from None


def _write_options(raw: Any, schema: StructType) -> WriteOptions:
    options = WriteOptions.parse(raw)
    fields = {f.name: f.dataType.simpleString() for f in schema.fields}
    routes = connect(options.client)
    try:  # a queue column alone: which broker group (a cluster's needs the broker column)
        check_schema(fields, options.topic, routes.group, exactly_once=options.exactly_once,
                     encoded=encoded_parts(options.formats))  # fmt: skip
    finally:
        routes.close()
    if options.formats.decodes:  # the struct checked against the topic's schema, now
        schemas = SchemaSource(options.client)
        try:
            options = prepare_write(options, arrow_schema(schema), schemas.fetch)
        finally:
            schemas.close()
    return options


class EqueuePartition(InputPartition):
    """A Spark input partition holding one ``QueueRange`` (its ``value``)."""

    def __init__(self, queue_range: QueueRange) -> None:
        super().__init__(queue_range)


def _read(
    partition: InputPartition, schema: StructType, options: ReadOptions, plan: DecodePlan | None
) -> Iterator[pa.RecordBatch]:
    if partition.value is None:
        # Spark runs one task with InputPartition(None) when partitions() is
        # empty (nothing to read): it reads nothing.
        return iter(())
    if plan is None:
        return _plain_errors(read_range(partition.value, arrow_schema(schema)), options)
    decoded = read_decoded(partition.value, arrow_schema(schema), options.client, plan)
    return _plain_errors(decoded, options)


# -- batch reads -------------------------------------------------------------------


class EqueueBatchReader(DataSourceReader):
    """``spark.read``: the records between startingOffsets and endingOffsets."""

    def __init__(
        self, options: ReadOptions, schema: StructType, plan: DecodePlan | None = None
    ) -> None:
        self.options = options
        self.schema = schema
        self.plan = plan
        self.pushdown: Pushdown | None = None
        """Set by ``EqueuePushdownReader.pushFilters``, before ``partitions``."""

    @_one_line
    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        if self.pushdown is not None and self.pushdown.empty:
            return []  # a pushed filter no row passes
        planner = Planner(o)
        try:
            starts = planner.resolve(o.starting, o.starting_timestamp_ms, end=False)
            ends = planner.resolve(o.ending, o.ending_timestamp_ms, end=True)
            # An end before the start is an empty range, not data loss.
            ends = {k: max(e, starts.get(k, e)) for k, e in ends.items()}
            ranges = planner.ranges(starts, ends, pushdown=self.pushdown)
        finally:
            planner.close()
        return [EqueuePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.schema, self.options, self.plan)


class EqueuePushdownReader(EqueueBatchReader):
    """A batch reader that takes Spark's filters (``pushdown.push``): the only
    class defining ``pushFilters``, made only while Spark plans with pushdown
    on (``spark.sql.python.filterPushdown.enabled``)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.pushdown, remaining = push(filters, self.options)
        if self.pushdown.pushed:
            log.info("equeue read pushed %s; Spark evaluates %d more filters",
                     ", ".join(self.pushdown.pushed), len(remaining))  # fmt: skip
        return remaining


# -- streaming reads -----------------------------------------------------------------


class EqueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches over growing queues, with admission
    control, Trigger.AvailableNow, and the query's progress committed to its
    consumer group on the broker."""

    def __init__(
        self, options: ReadOptions, schema: StructType, plan: DecodePlan | None = None
    ) -> None:
        self.options = options
        self.schema = schema
        self.plan = plan
        """The decode plan fixed at load() (formats.py): it travels to tasks."""
        self._planner: Planner | None = None
        self._target: Offsets | None = None
        self._last_batch = time.monotonic()
        self._listed: Listing | None = None
        """The queues as latestOffset listed them; Spark calls reportLatestOffset
        and partitions right after it, and they reuse it (one listing per trigger)."""

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options and schema, never the driver's connection.
        return {"options": self.options, "schema": self.schema, "plan": self.plan}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"], state["schema"], state["plan"])  # type: ignore[misc]

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.options)
        return self._planner

    @_one_line
    def initialOffset(self) -> dict[str, Any]:
        o = self.options
        listing = self.planner.listing(o.starting_timestamp_ms)
        offsets = self.planner.resolve(
            o.starting, o.starting_timestamp_ms, end=False, listing=listing
        )
        return to_json(offsets, listing.incarnations)

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_offsets_per_trigger:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.max_bytes_per_trigger:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_offsets_per_trigger:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    @_one_line
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: q.end_offset for k, q in self.planner.queues().items()}

    @_one_line
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        listing = self._listed = self.planner.listing()
        queues = listing.queues
        # A topic recreated since ``start`` fails the query here (failOnDataLoss),
        # before Spark logs a batch; else it is read from its earliest offset
        # (partitions() warns), so its old offsets are neither limits nor progress.
        recreated = self.planner.recreated(incarnations(start), listing.incarnations)
        starts = {k: o for k, o in self.planner.offsets(start).items() if k[0] not in recreated}
        # ``start`` is the end of the last completed batch: committing it here,
        # not only in commit() (which Spark calls one batch late, and never for
        # an AvailableNow run's last batch), keeps the group's lag current.
        self.planner.commit(starts)
        ends = {k: q.end_offset for k, q in queues.items()}
        if self._target is not None:  # AvailableNow: nothing that arrived later
            ends = {k: min(e, self._target[k]) for k, e in ends.items() if k in self._target}
        # A cluster's broker that does not answer now: its queues stay where they were.
        ends.update({k: o for k, o in starts.items() if k[0] in listing.unreachable})
        full = {k: starts[k] if k in starts else queues[k].earliest_offset for k in ends}
        if not isinstance(limit, ReadAllAvailable):
            admitted = self._admit(full, ends, limit, queues)
            if admitted is None:
                return start
            ends = admitted
        if ends != starts:
            self._last_batch = time.monotonic()
        return to_json(ends, listing.incarnations)

    def _admit(
        self, starts: Offsets, ends: Offsets, limit: ReadLimit, queues: Queues
    ) -> Offsets | None:
        """Apply the option limits and the engine's: None means "wait"."""
        o = self.options
        max_rows = _smallest(o.max_offsets_per_trigger, getattr(limit, "max_rows", None))
        max_bytes = _smallest(o.max_bytes_per_trigger, getattr(limit, "max_bytes", None))
        min_rows = o.min_offsets_per_trigger or getattr(limit, "min_rows", None)
        if min_rows and self._target is None:  # AvailableNow must not wait
            waited_ms = (time.monotonic() - self._last_batch) * 1000
            if backlog(starts, ends) < min_rows and waited_ms < o.max_trigger_delay_ms:
                return None
        if max_rows:
            ends = rate_limit(max_rows, starts, ends)
        if max_bytes:
            ends = self._bytes_limit(max_bytes, starts, ends, queues)
        return ends

    def _bytes_limit(self, budget: int, starts: Offsets, ends: Offsets, queues: Queues) -> Offsets:
        capped = dict(ends)
        for key, share in split_budget(budget, starts, ends).items():
            q = queues.get(key)
            if q is None:
                continue
            begin = max(starts[key], q.earliest_offset)
            capped[key], _ = self.planner.offset_for_bytes(key, begin, ends[key], share)
        return capped

    @_one_line
    def reportLatestOffset(self) -> dict[str, Any]:
        listing = self.planner.listing() if self._listed is None else self._listed
        return to_json({k: q.end_offset for k, q in listing.queues.items()}, listing.incarnations)

    @_one_line
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        # A restarted query's first partitions() (a batch replayed from the
        # checkpoint) comes before any latestOffset: then the planner lists.
        ranges = self.planner.ranges(
            self.planner.offsets(start),
            self.planner.offsets(end),
            self._listed,
            (incarnations(start), incarnations(end)),
        )
        return [EqueuePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.schema, self.options, self.plan)

    @_one_line
    def commit(self, end: dict[str, Any]) -> None:
        offsets = from_json(end)
        if self._listed is not None:  # Spark commits one batch late: the topic may be new
            stale = recreated_topics(incarnations(end), self._listed.incarnations)
            offsets = {k: o for k, o in offsets.items() if k[0] not in stale}
        self.planner.commit(offsets)

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()


def _smallest(*limits: int | None) -> int | None:
    given = [x for x in limits if x]
    return min(given) if given else None


# -- writes --------------------------------------------------------------------------


class WriteResult(WriterCommitMessage):
    """A task's commit message: what it wrote, and in which transaction."""

    def __init__(self, summary: WriteSummary) -> None:
        self.summary = summary


def _summaries(messages: Sequence[WriterCommitMessage | None]) -> list[WriteSummary]:
    return [m.summary for m in messages if isinstance(m, WriteResult)]


def _task() -> tuple[int, int, TaskContext]:
    """(partition, attempt, context). The attempt is Spark's task attempt id,
    unique in the application: ``attemptNumber`` restarts at 0 when a stage is
    retried, and two attempts must never share a transaction."""
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the equeue writer must run inside a Spark task")
    return context.partitionId(), context.taskAttemptId(), context


class EqueueWriter(DataSourceArrowWriter):
    """``df.write``: append every row to its topic.

    Exactly-once (default): each task attempt stages its rows in its own
    transaction; the job commit commits the successful attempts' transactions
    at once and aborts every other one of this job (failed, speculative).
    """

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.job = f"spark-write-{uuid.uuid4().hex}"
        """Made on the driver, pickled to every task: names this job's transactions."""

    @_one_line
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        txn = ""
        partition = 0
        if self.options.exactly_once:
            partition, attempt, _ = _task()
            txn = transaction_id(self.job, partition, attempt)
        return WriteResult(write_batches(self.options, iterator, txn, partition))

    @_one_line
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        summaries = _summaries(messages)
        rows = sum(s.rows for s in summaries)
        if self.options.exactly_once:  # no sink: a job is never replayed
            outcomes = commit_on_brokers(
                self.options, summaries, abort_prefix=transaction_prefix(self.job)
            )
            log.info(
                "equeue write %s committed: %d rows in %d transactions%s",
                self.job, rows, sum(1 for s in summaries if s.rows), _on(outcomes),
            )  # fmt: skip
            return
        log.info("equeue batch write committed: %d rows from %d tasks", rows, len(messages))

    @_one_line
    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.exactly_once:
            aborted = abort_on_brokers(self.options, transaction_prefix(self.job))
            log.warning("equeue write %s aborted: %d transactions discarded", self.job, aborted)
        else:
            log.warning("equeue batch write aborted; rows already appended stay")


class EqueueStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream``: each micro-batch's rows appended to topics.

    Exactly-once (default): tasks stage; ``commit(batchId)`` commits the
    batch's transactions under the sink id (the query id, or the
    ``transactionalId`` option) and batch id. The broker remembers each sink's
    last batch, so a batch Spark replays after a crash that came after the
    broker commit is not written twice.
    """

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.run = uuid.uuid4().hex[:12]
        """Distinguishes this driver run's transactions from a crashed run's."""

    @_one_line
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        if not self.options.exactly_once:
            return WriteResult(write_batches(self.options, iterator))
        partition, attempt, context = _task()
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        sink = self.options.transactional_id or _query_sink(context)
        if batch is None:
            raise InvalidOption(
                f"delivery=exactly_once: no {BATCH_ID_PROPERTY} in the task; "
                "use delivery=at_least_once outside streaming queries"
            )
        write = transaction_prefix(sink, int(batch)) + self.run
        txn = transaction_id(write, partition, attempt)
        summary = write_batches(self.options, iterator, txn, partition)
        summary.sink = sink
        return WriteResult(summary)

    @_one_line
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        summaries = _summaries(messages)
        rows = sum(s.rows for s in summaries)
        sink = next((s.sink for s in summaries if s.sink), "")
        if not self.options.exactly_once or not sink:
            log.info("equeue batch %d committed: %d rows", batchId, rows)
            return
        outcomes = commit_on_brokers(
            self.options, summaries, sink=sink, batch_id=batchId,
            abort_prefix=transaction_prefix(sink, batchId),
        )  # fmt: skip
        replayed = sorted(b for b, o in outcomes.items() if o.already_committed)
        if replayed:
            log.warning(
                "equeue sink %s: batch %d was committed before%s (a replay); its rows there "
                "were discarded (%d rows in the batch)", sink, batchId, _on(replayed), rows,
            )  # fmt: skip
        else:
            log.info("equeue sink %s batch %d committed: %d rows%s", sink, batchId, rows,
                     _on(outcomes))  # fmt: skip

    @_one_line
    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sink = next((s.sink for s in _summaries(messages) if s.sink), "")
        if not self.options.exactly_once:
            log.warning("equeue batch %d aborted; its retry may duplicate rows", batchId)
            return
        if sink:
            abort_on_brokers(self.options, transaction_prefix(sink, batchId))
        log.warning("equeue batch %d aborted; its staged rows were discarded", batchId)


def _on(groups: Iterable[str]) -> str:
    """`` on brokers a, b`` naming a cluster's broker groups; nothing for one
    broker (its one group has no name)."""
    named = sorted(g for g in groups if g)
    return f" on brokers {', '.join(named)}" if named else ""


BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def _query_sink(context: TaskContext) -> str:
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    if not query_id:
        raise InvalidOption(
            f"delivery=exactly_once: no {QUERY_ID_PROPERTY} in the task; set transactionalId"
        )
    return f"query-{query_id}"
