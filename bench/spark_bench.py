"""Spark connector benchmark: reads beside a from-memory ceiling, writes beside the client.

Run ``python bench/spark_bench.py`` (about 3 minutes here, 5 with ``--repeat
3``; ``--quick`` for a smoke run of every scenario, about a minute, mostly
Spark's start: 40,000 messages of 100 B, ``--formats binary,avro`` and
``--with-pullstream``, no untimed warm-up; ``--repeat N`` reports medians of
N runs; ``--sizes 100,1024`` picks the value sizes; ``--check`` only builds
the ceiling's batches against the read schema, in seconds, without a broker
or Spark; ``--reads-only`` skips the writes; ``--with-pullstream`` starts the
broker with ``--fetch-port auto`` and also reads the same topics from a
second broker with the fetch port off, i.e. over ``PullStream``, against the
same ceiling runs). It starts one broker (async flush) on
127.0.0.1 in a temporary directory under /tmp and one local Spark session
(``local[2]``, as tests/spark_support.py builds it, plus 4 GB of driver memory
for the cached write input); both are stopped and the directory removed at the
end. Each equeue figure stands beside a baseline measured in the same run, in
the same Spark or the same process, and the ratio is what to read.

Scenarios, per value size (100 B and 1 KiB of random bytes; ``--messages`` at
100 B, default 2,000,000; sizes above 512 B get ``messages * 512 / size``,
so 1,000,000 at 1 KiB):

* streaming read: a topic of 4 queues filled beforehand (10,000-message
  batches on one ``ProduceStream``, queues round robin by batch, 10-byte keys)
  read by ``spark.readStream.format("equeue")`` with
  ``startingOffsets=earliest``, ``maxOffsetsPerTrigger=1,000,000``, into the
  ``noop`` sink with ``Trigger.AvailableNow``; timed from ``start()`` to
  termination, a fresh checkpoint each time. rows/s = messages / seconds.
  Baseline (the ceiling of this Spark): a Python data source defined here
  (``equeue_ceiling``) with the same schema, the same offsets and admission
  (4 partitions of 250,000 rows per 1,000,000-row micro-batch) and the same
  Arrow batches (row count per batch as the real read task yields them,
  measured once; same column widths: 10-byte keys, the values, topic, queue,
  offset, timestamp, empty tag, message ids of the broker's length). Its
  ``read()`` yields slices of one template batch per shape, built with numpy
  and ``Array.from_buffers`` on first use in each (reused) Python worker and
  kept there: no broker fetch, no record decoding, no per-task generation;
  what is left is Spark's own cost of running a Python source (planning,
  Arrow from the worker to the JVM, rows into the sink). Target: read >= 0.9x
  the ceiling at both sizes (issue 29; 0.7x before).
* exactly-once write: the batch write below with ``delivery=exactly_once`` (each
  task stages into a broker transaction, the job commit makes all visible)
  against the same write with ``delivery=at_least_once``, alternating which
  runs first. Target: exactly-once >= 0.7x at-least-once.
* batch write: ``spark.range(N)`` as ``key`` = ``cast(id as string)`` and
  ``value`` = the size in bytes (a hex digest repeated, cast to binary), cached and
  materialized before timing, then ``df.write.format("equeue")`` into a fresh
  topic of 4 queues with ``batchSize=10000`` (2 tasks: ``local[2]``);
  rows/s. Baseline: the client in this process, ``Producer.send_batches`` of
  10,000-message batches of the same sizes with keys (values and keys
  prebuilt), into a fresh topic. Target: write (``delivery=at_least_once``)
  >= 0.5x the produce rate.

Before the timed runs of each size: one small untimed query of each kind and
one small write of each delivery at that size, then one untimed full-size read
of each source. Before every timed step: ``os.sync()`` and a full GC of the
driver JVM. Timed pairs alternate which runs first.

A second table (diagnostics) splits the read path, one process, no Spark: the
read task alone (``read_task.read_range`` over one 250,000-row partition),
the ``PullStream`` transfer alone (replies counted, not decoded), decoding
alone (``decode_columns`` + ``to_record_batch`` over the same replies), the
ceiling's batch generation alone; and, for both Spark queries, the time inside
micro-batches (``triggerExecution``) against the wall clock. A third table
gives the CPU seconds each component used during each timed measurement (the
JVM, the Python workers, the broker, this process; sampled from /proc, Linux
only): on a machine this small, where the time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench`, `tests` as packages

from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bench._measure import CpuMeter, progress, size_label
from bench._spark_ceiling import (
    CeilingRange,
    CeilingSource,
    CeilingSpec,
    ceiling_batches,
    check_template,
    template_batch,
)
from bench._spark_formats import AVRO_TARGET, FORMATS, fill_avro_topic, format_options
from bench._spark_results import Results, Row, diagnostics_table, main_table
from bench._spark_setup import (
    CEILING,
    PRODUCE_BATCH,
    QUEUES,
    RPC_TIMEOUT_S,
    TRIGGER_ROWS,
    WRITE_BATCH,
    client_produce,
    equeue_read_options,
    fill_topic,
    run_query,
    settle,
    spark_session,
    spark_write,
    write_frame,
)
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.columns import decode_columns
from equeue_spark.client.connection import Connection
from equeue_spark.client.fetch import fetch_replies
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.wire import PullReply
from equeue_spark.spark import read_task
from equeue_spark.spark.arrow import arrow_schema, read_schema, to_record_batch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SIZES = (100, 1024)
READ_TARGET = 0.9
"""Issue 29's target for the streaming read, both sizes (0.7 before)."""
WRITE_TARGET = 0.5
EXACTLY_TARGET = 0.7
DELIVERIES = ("exactly_once", "at_least_once")


@dataclass(frozen=True)
class Plan:
    messages: int
    """Messages per size at 100 B (sizes above 512 B: scaled down by size)."""
    warmup: int
    """Rows of the untimed warm-up queries and writes (0: none)."""
    full_size_warmup: bool = True
    """Read each topic once, untimed, before the timed reads (the same queries again);
    the format scenario's topic too."""


FULL = Plan(2_000_000, 80_000)
QUICK = Plan(40_000, 0, full_size_warmup=False)
"""A smoke run of every scenario, about a minute (the test suite runs it): one size, the
smallest topics (one produce batch per queue), the formats and PullStream scenarios
on, no untimed runs (they repeat the timed ones' calls; each Spark query costs
seconds here)."""
QUICK_SIZES = "100"
QUICK_FORMATS = "binary,avro"


def messages_for(size: int, messages: int) -> int:
    """Messages of ``size`` bytes: ``messages``, scaled by 512 / size above 512 B,
    rounded down to whole produce batches per queue."""
    n = messages if size <= 512 else messages * 512 // size
    unit = PRODUCE_BATCH * QUEUES
    return max(unit, n // unit * unit)


# -- read task in isolation ----------------------------------------------------------------------


def measure_read_task(
    address: str, topic: str, size: int, rows: int, results: Results, *, cpu: CpuMeter | None = None
) -> tuple[list[int], str]:
    """Time the read path of one partition (queue 0, ``[0, rows)``) in this
    process, piece by piece; the batch sizes the read task yields and the broker id."""
    schema = arrow_schema(_struct(read_schema(False)))
    part = read_task.QueueRange(topic, 0, 0, rows, address, int(RPC_TIMEOUT_S * 1000))
    start = time.perf_counter()
    batches = list(read_task.read_range(part, schema))
    elapsed = time.perf_counter() - start
    transport = "fetch port" if read_task._FETCH_ADDRESSES.get(address) else "PullStream"
    results.diag(f"read task ({transport} + decode + Arrow)", size, rows, elapsed)
    if sum(b.num_rows for b in batches) != rows:
        raise RuntimeError(f"read task returned {sum(b.num_rows for b in batches)} of {rows}")
    broker_id = str(batches[0].column("message_id")[0].as_py()).rsplit("-", 1)[0]
    sizes = [b.num_rows for b in batches]

    replies = measure_transfers(address, topic, size, rows, results, cpu=cpu)
    start = time.perf_counter()
    pending: list[memoryview] = []
    count = nbytes = 0
    for n, records in replies:
        pending.append(records)
        count += n
        nbytes += len(records)
        if count >= read_task.ROWS_PER_BATCH or nbytes >= read_task.BYTES_PER_BATCH:
            to_record_batch(decode_columns(pending, broker_id, False), schema)
            pending, count, nbytes = [], 0, 0
    if pending:
        to_record_batch(decode_columns(pending, broker_id, False), schema)
    elapsed = time.perf_counter() - start
    results.diag("decode_columns + to_record_batch only", size, rows, elapsed)

    spec = CeilingSpec(rows, QUEUES, size, sizes[0], TRIGGER_ROWS, topic, broker_id)
    start = time.perf_counter()
    template = template_batch(spec, 0, schema)
    results.diag("ceiling: one template batch built", size, sizes[0], time.perf_counter() - start)
    check_template(template, schema)
    check_template(batches[0], schema)
    start = time.perf_counter()
    generated = list(ceiling_batches(CeilingRange(spec, 0, 0, rows), schema))
    elapsed = time.perf_counter() - start
    results.diag("ceiling read() of a partition", size, rows, elapsed, "(first use: builds it)")
    if [b.num_rows for b in generated] != sizes:
        results.notes.append(
            f"{size_label(size)}: ceiling batches {len(generated)} vs read task {len(sizes)}"
        )
    real_bytes = sum(b.nbytes for b in batches)
    fake_bytes = sum(b.nbytes for b in generated)
    results.notes.append(
        f"{size_label(size)}: the read task yields {len(sizes)} batches of {sizes[0]:,} rows "
        f"(last {sizes[-1]:,}) per {rows:,}-row partition; Arrow bytes: read task "
        f"{real_bytes:,}, ceiling {fake_bytes:,}"
    )
    return sizes, broker_id


def measure_transfers(
    address: str, topic: str, size: int, rows: int, results: Results, *, cpu: CpuMeter | None
) -> list[tuple[int, memoryview]]:
    """Time moving one partition's replies (not decoded) over PullStream and, if
    the broker has one, over its fetch port; with ``cpu``, the broker's and this
    process's CPU seconds per GB of records for each. Then the PullStream
    replies, read once more (untimed) for the decoding measurement."""
    config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)
    with Connection(config) as conn:
        # Asked directly: EQUEUE_READ_TRANSPORT=grpc (a "before" run) turns off the
        # read task's use of the fetch port, not this comparison.
        fetch_at = conn.call(conn.admin.GetStats, pb.GetStatsRequest()).fetch_address
        transports: dict[str, Callable[[], Iterator[PullReply]]] = {
            "PullStream": lambda: stream_replies(
                conn,
                topic,
                0,
                0,
                rows,
                batch_messages=read_task.REPLY_MESSAGES,
                batch_bytes=read_task.REPLY_BYTES,
            ),
        }
        if fetch_at:
            transports["fetch port"] = lambda: fetch_replies(
                fetch_at, topic, 0, 0, rows, batch_messages=read_task.REPLY_MESSAGES,
                batch_bytes=read_task.REPLY_BYTES, timeout_s=RPC_TIMEOUT_S,
            )  # fmt: skip
        else:
            results.notes.append(f"{size_label(size)}: the broker reports no fetch port")
        for name, replies in transports.items():
            what = f"{name} transfer of one partition (not decoded)"
            meter = cpu.measure(what, size, poll=False) if cpu else contextlib.nullcontext()
            nbytes = 0
            with meter:
                start = time.perf_counter()
                for reply in replies():  # dropped at once, as a read task's decoded ones
                    nbytes += len(reply.records)
                elapsed = time.perf_counter() - start
            results.diag(f"{name} transfer only (not decoded)", size, rows, elapsed)
            if cpu is not None and nbytes:
                use = cpu.rows[(what, size)].uses[-1]
                gb = nbytes / 1e9
                broker, client = use["broker"] / gb, use["bench process"] / gb
                results.notes.append(
                    f"{size_label(size)}: {name} CPU per GB of records: broker {broker:.2f} s "
                    f"+ client {client:.2f} s = {broker + client:.2f} s ({nbytes:,} bytes)"
                )
        kept = [(r.count, r.records) for r in transports["PullStream"]() if r.count]
    return kept


def _struct(ddl: str) -> StructType:
    parsed = StructType.fromDDL(ddl)  # needs the running Spark session's JVM
    assert isinstance(parsed, StructType)
    return parsed


SIMPLE_TYPES: dict[str, type[DataType]] = {
    "binary": BinaryType,
    "string": StringType,
    "int": IntegerType,
    "long": LongType,
    "timestamp": TimestampType,
}


def simple_struct(ddl: str) -> StructType:
    """``StructType.fromDDL`` without a session, for DDL of flat ``name type`` columns
    of the types in ``SIMPLE_TYPES`` (the read schema without headers); anything else
    is refused, naming it, so ``--check`` cannot pass over a column it did not parse."""
    fields = []
    for column in ddl.split(","):
        name, _, kind = column.strip().partition(" ")
        if kind.strip() not in SIMPLE_TYPES:
            raise ValueError(f"--check cannot parse column {column.strip()!r} of {ddl!r}")
        fields.append(StructField(name, SIMPLE_TYPES[kind.strip()]()))
    return StructType(fields)


def check(sizes: list[int]) -> None:
    """``--check``: one ceiling template per size against the read schema (no broker,
    no Spark session): catches a read schema the ceiling no longer matches."""
    schema = arrow_schema(simple_struct(read_schema(False)))
    for size in sizes:
        spec = CeilingSpec(1_000, QUEUES, size, read_task.ROWS_PER_BATCH, TRIGGER_ROWS, "t", "b")
        template = template_batch(spec, 0, schema)
        check_template(template, schema)
        progress(f"{size_label(size)}: ceiling template of {template.num_rows:,} rows, "
                 f"{template.num_columns} columns = the read schema")  # fmt: skip


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Bench:
    """What every scenario uses: the session, the broker and its clients."""

    spark: SparkSession
    admin: Admin
    producer: Producer
    address: str
    root: Path
    results: Results
    cpu: CpuMeter
    reads_only: bool = False
    pull: PullBroker | None = None
    """``--with-pullstream``: the second broker (fetch port off) and its clients."""


@dataclass
class PullBroker:
    """A second broker with ``--fetch-port off``, holding the same read topics:
    the read over PullStream (the path before the fetch port), in the same run."""

    admin: Admin
    producer: Producer
    address: str
    pid: int


PULLSTREAM = "equeue-pullstream"
"""The query name of the read from the PullStream broker (format ``equeue``)."""


def warm_up(b: Bench, rows: int, size: int) -> None:
    """One small query of each kind at ``size``, untimed: JIT for rows of this
    width, Python workers, first connections. Per size, because the first query
    at a new width was the slow one of every benchmark (its JIT and buffers)."""
    began = time.perf_counter()
    topic = f"warmup-{size}"
    fill_topic(b.admin, b.producer, topic, size, rows)
    options = equeue_read_options(b.address, topic)
    run_query(b.spark, "equeue", options, b.root / f"ck-warmup-equeue-{size}")
    spec = CeilingSpec(
        rows // QUEUES, QUEUES, size, read_task.ROWS_PER_BATCH, TRIGGER_ROWS, topic, topic
    )
    run_query(b.spark, CEILING, spec.options(), b.root / f"ck-warmup-ceiling-{size}")
    if not b.reads_only:
        df = write_frame(b.spark, size, rows)
        for delivery in DELIVERIES:
            spark_write(b.admin, df, b.address, f"{topic}-{delivery}", rows, delivery=delivery)
        df.unpersist()
    progress(f"{size_label(size)}: warm-up done in {time.perf_counter() - began:.1f} s")


def run_size(b: Bench, size: int, count: int, repeat: int, plan: Plan) -> None:
    label = size_label(size)
    if plan.warmup:
        warm_up(b, plan.warmup, size)
    topic = f"read-{size}"
    seconds = fill_topic(b.admin, b.producer, topic, size, count)
    progress(f"{label}: {count:,} messages produced in {seconds:.1f} s ({count / seconds:,.0f}/s)")
    if b.pull is not None:
        fill_topic(b.pull.admin, b.pull.producer, topic, size, count)
    per_queue = count // QUEUES
    partition_rows = min(per_queue, TRIGGER_ROWS // QUEUES)
    settle(b.spark)
    sizes, broker_id = measure_read_task(
        b.address, topic, size, partition_rows, b.results, cpu=b.cpu
    )
    spec = CeilingSpec(per_queue, QUEUES, size, sizes[0], TRIGGER_ROWS, topic, broker_id)
    rows = {"equeue": b.results.add("streaming read", size, count, READ_TARGET)}
    queries = ["equeue", CEILING]
    if b.pull is not None:
        rows[PULLSTREAM] = b.results.add(
            "streaming read over PullStream (fetch port off)", size, count, READ_TARGET
        )
        queries.append(PULLSTREAM)
    # Untimed, at full size: the first full-size query of a run was the slow one
    # of every benchmark (0.51-0.57x at 1 KiB; its JVM used 5.2-5.5 CPU seconds,
    # 1.4-1.9 in the same query later), even after the small warm-up.
    for fmt in queries if plan.full_size_warmup else []:
        settle(b.spark)
        began = time.perf_counter()
        run_query(
            b.spark, _format(fmt), source_options(b, fmt, spec), b.root / f"ck-{size}-warm-{fmt}"
        )
        progress(f"{label}: untimed full-size read {fmt} in {time.perf_counter() - began:.1f} s")
    for run in range(repeat):
        # Each run in another order: the ceiling's rows are every query's baseline.
        order = queries[run % len(queries) :] + queries[: run % len(queries)]
        for fmt in order:
            settle(b.spark)
            read_query(b, fmt, size=size, count=count, run=run, spec=spec, rows=rows)
    if not b.reads_only:
        run_writes(b, size, count, repeat)


def run_writes(b: Bench, size: int, count: int, repeat: int) -> None:
    """The write scenarios at ``size``: Spark at-least-once and exactly-once, the client."""
    label = size_label(size)
    write = b.results.add("batch write (at-least-once)", size, count, WRITE_TARGET)
    exactly = b.results.add("exactly-once write vs at-least-once", size, count, EXACTLY_TARGET)
    df = write_frame(b.spark, size, count)
    for run in range(repeat):
        rates = {}
        for delivery in DELIVERIES if run % 2 == 0 else DELIVERIES[::-1]:
            settle(b.spark)
            with b.cpu.measure(f"batch write, Spark {delivery}", size):
                topic = f"spark-write-{delivery}-{size}-{run}"
                rates[delivery] = spark_write(
                    b.admin, df, b.address, topic, count, delivery=delivery
                )
        settle(b.spark)
        with b.cpu.measure("batch write, client send_batches", size, poll=False):
            base = client_produce(b.admin, b.producer, f"client-write-{size}-{run}", size, count)
        write.ours.append(rates["at_least_once"])
        write.base.append(base)
        exactly.ours.append(rates["exactly_once"])
        exactly.base.append(rates["at_least_once"])
        progress(
            f"{label} run {run + 1}: write Spark exactly-once {rates['exactly_once']:12,.0f}, "
            f"at-least-once {rates['at_least_once']:12,.0f}, client {base:12,.0f} rows/s"
        )
    df.unpersist()


AVRO_SIZE = 30
"""About the size of one Avro value of the format scenario (the row label)."""


def run_formats(b: Bench, formats: list[str], count: int, repeat: int, plan: Plan) -> None:
    """``--formats``: the same topic of Avro records read with each value format;
    each non-binary read against the binary read of the same run."""
    topic = "formats-avro"
    seconds = fill_avro_topic(b.admin, b.producer, topic, count)
    progress(f"formats: {count:,} Avro records produced in {seconds:.1f} s")
    rows = {
        fmt: b.results.add(
            f"streaming read, valueFormat={fmt} vs binary (same topic)",
            AVRO_SIZE, count, AVRO_TARGET,
        )
        for fmt in formats
        if fmt != "binary"
    }  # fmt: skip
    queries = ["binary", *rows]
    for fmt in queries if plan.full_size_warmup else []:  # untimed: workers, JIT, the decoder
        options = {**equeue_read_options(b.address, topic), **format_options(fmt)}
        run_query(b.spark, "equeue", options, b.root / f"ck-formats-warm-{fmt}")
    for run in range(repeat):
        order = queries[run % len(queries) :] + queries[: run % len(queries)]
        for fmt in order:
            settle(b.spark)
            options = {**equeue_read_options(b.address, topic), **format_options(fmt)}
            with b.cpu.measure(f"streaming read, valueFormat={fmt}", AVRO_SIZE):
                q = run_query(b.spark, "equeue", options, b.root / f"ck-formats-{run}-{fmt}")
            if q.rows != count // PRODUCE_BATCH * PRODUCE_BATCH:
                raise RuntimeError(f"valueFormat={fmt} read {q.rows} of {count} rows")
            rate = q.rows / q.seconds
            if fmt == "binary":
                for row in rows.values():
                    row.base.append(rate)
            else:
                rows[fmt].ours.append(rate)
            progress(f"formats run {run + 1}: valueFormat={fmt:8} {rate:12,.0f} rows/s")


def source_options(b: Bench, fmt: str, spec: CeilingSpec) -> dict[str, str]:
    """The read options of ``fmt`` (equeue, PULLSTREAM or the ceiling) over the
    topic ``spec`` describes."""
    if fmt == PULLSTREAM:
        assert b.pull is not None
        return equeue_read_options(b.pull.address, spec.topic)
    return equeue_read_options(b.address, spec.topic) if fmt == "equeue" else spec.options()


def _format(fmt: str) -> str:
    """The Spark format name of a query (PULLSTREAM reads with ``equeue``)."""
    return "equeue" if fmt == PULLSTREAM else fmt


def read_query(
    b: Bench, fmt: str, *, size: int, count: int, run: int, spec: CeilingSpec, rows: dict[str, Row]
) -> None:
    """One timed streaming read, recorded in ``rows[fmt]`` (the ceiling: in every row)."""
    checkpoint = b.root / f"ck-{size}-{run}-{fmt}"
    options = source_options(b, fmt, spec)
    what = {"equeue": "Spark query, equeue", PULLSTREAM: "Spark query, equeue over PullStream"}.get(
        fmt, "Spark query, ceiling"
    )
    main_pid = b.cpu.broker_pid
    if fmt == PULLSTREAM and b.pull is not None:
        b.cpu.broker_pid = b.pull.pid  # the CPU table's broker column: the one read
    try:
        with b.cpu.measure(f"streaming read, {fmt}", size):
            q = run_query(b.spark, _format(fmt), options, checkpoint)
    finally:
        b.cpu.broker_pid = main_pid
    if q.rows != count:
        raise RuntimeError(f"{fmt} query read {q.rows} of {count} rows")
    if fmt == CEILING:
        for row in rows.values():
            row.base.append(count / q.seconds)
    else:
        rows[fmt].ours.append(count / q.seconds)
    b.results.diag(f"{what}: wall clock", size, count, q.seconds, f"({q.batches} micro-batches)")
    b.results.diag(
        f"{what}: inside micro-batches",
        size,
        count,
        q.batch_ms / 1000,
        "(wall - batches = {:.2f} s)",
        aside=q.seconds - q.batch_ms / 1000,
    )
    progress(
        f"{size_label(size)} run {run + 1}: read {fmt:15} {count / q.seconds:12,.0f} rows/s "
        f"({q.seconds:.2f} s; CPU s {b.cpu.last(f'streaming read, {fmt}', size)})"
    )


# -- report ------------------------------------------------------------------------------------


def versions() -> str:
    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    from equeue_spark.client.columns import DECODER

    return (
        f"Python {sys.version.split()[0]}, pyspark {dist('pyspark')}, pyarrow {dist('pyarrow')}, "
        f"grpcio {dist('grpcio')}, column decoder {DECODER}; Spark local[2]; "
        f"{os.cpu_count()} CPUs"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run of every scenario: 40,000 messages, 100 B only (unless --sizes), "
        "--formats binary,avro (unless --formats), --with-pullstream, no warm-up",
    )
    parser.add_argument("--repeat", type=int, default=1, help="report the median of N runs")
    parser.add_argument(
        "--sizes", default=None, help="value sizes in bytes (100,1024; --quick 100)"
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=None,
        help="messages at 100 B (default 2,000,000; --quick 40,000); sizes above 512 B "
        "get messages * 512 / size",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check that the ceiling's batches match the read schema (seconds, "
        "no broker, no Spark)",
    )
    parser.add_argument(
        "--with-pullstream",
        action="store_true",
        help="also read the same topics from a second broker with --fetch-port off "
        "(the read over PullStream), beside the same ceiling runs",
    )
    parser.add_argument("--reads-only", action="store_true", help="skip the write scenarios")
    parser.add_argument(
        "--formats",
        default=None,
        help="value formats of the format scenario, e.g. binary,avro (binary alone, the "
        "default: none; --quick: binary,avro)",
    )
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else "100,1024"
    if args.formats is None:
        args.formats = QUICK_FORMATS if args.quick else "binary"
    args.with_pullstream = args.with_pullstream or args.quick
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not sizes or min(sizes) < 1:
        parser.error("--sizes: give positive sizes")
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not set(formats) <= set(FORMATS):
        parser.error(f"--formats: give some of {', '.join(FORMATS)}, not {args.formats!r}")
    if args.check:
        check(sizes)
        return
    plan = QUICK if args.quick else FULL
    messages = args.messages or plan.messages

    results = Results()
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="equeue-spark-bench-", dir="/tmp"))
    # With --with-pullstream the main broker serves the fetch port (off by default).
    fetch = ["--fetch-port", "auto"] if args.with_pullstream else []
    broker = BrokerProcess(root / "broker", "--flush", "async", *fetch)
    pull_broker = BrokerProcess(root / "pull-broker", "--flush", "async", "--fetch-port", "off")
    spark: SparkSession | None = None
    meter: CpuMeter | None = None
    try:
        address = broker.start()
        progress(f"broker on {address}, data in {root}")
        spark = spark_session()
        # The ceiling source by reference (bench._spark_ceiling, a module of its own), so
        # Python workers import it instead of unpickling a copy of __main__'s classes.
        spark.dataSource.register(CeilingSource)
        config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)
        with contextlib.ExitStack() as stack:
            admin = stack.enter_context(Admin(config=config))
            producer = stack.enter_context(Producer(config=config))
            assert broker.process is not None
            meter = CpuMeter(broker.process.pid)
            bench = Bench(spark, admin, producer, address, root, results, meter, args.reads_only)
            if args.with_pullstream:
                pull_address = pull_broker.start()
                assert pull_broker.process is not None
                pull_config = ClientConfig(broker=pull_address, timeout_s=RPC_TIMEOUT_S)
                bench.pull = PullBroker(
                    stack.enter_context(Admin(config=pull_config)),
                    stack.enter_context(Producer(config=pull_config)),
                    pull_address,
                    pull_broker.process.pid,
                )
                progress(f"PullStream broker (fetch port off) on {pull_address}")
            for size in sizes:
                run_size(bench, size, messages_for(size, messages), args.repeat, plan)
            if set(formats) - {"binary"}:
                try:
                    run_formats(bench, formats, messages, args.repeat, plan)
                except Exception as exc:  # the figures measured so far still get reported
                    results.notes.append(f"the format scenario failed: {exc}")
                    progress(f"formats: failed: {exc}")
    finally:
        if spark is not None:
            spark.stop()
        for process in (broker, pull_broker):
            if process.process is not None:
                process.stop()
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - began
    mode = "quick" if args.quick else "full"
    print_report(results, meter, f"{mode}, repeat {args.repeat}, {elapsed:.0f} s")


def print_report(results: Results, meter: CpuMeter | None, run: str) -> None:
    """The tables on stdout; ``run`` describes the run (mode, repeats, duration)."""
    print(f"\n## Spark connector ({run})\n")
    print(main_table(results))
    print(
        "\nBaselines: streaming read = the `equeue_ceiling` Python source in the same Spark "
        "(same schema, partitions, micro-batches and Arrow batch sizes, built in memory); "
        f"batch write = `Producer.send_batches` of {PRODUCE_BATCH:,}-message batches from "
        "this process; exactly-once write = the same Spark write with "
        f"`delivery=at_least_once`. Reads: `maxOffsetsPerTrigger={TRIGGER_ROWS:,}`, "
        f"Trigger.AvailableNow, noop sink, {QUEUES} queues; writes: `batchSize={WRITE_BATCH:,}`, "
        "2 tasks, keys `str(id)`."
    )
    print("\n## Diagnostics (read path pieces in one process; Spark wall vs. batch time)\n")
    print(diagnostics_table(results))
    if meter is not None and meter.rows:
        print("\n## CPU seconds by component (from /proc)\n")
        print(meter.table())
    print("\n## Setup\n")
    print(f"- {versions()}")
    for note in results.notes:
        print(f"- {note}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
