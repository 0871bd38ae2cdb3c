"""Spark connector benchmark: reads beside a from-memory ceiling, writes beside the client.

Run ``python bench/spark_bench.py`` (about 3 minutes here, 5 with
``--repeat 3``; ``--quick`` for a smoke run of under 2 minutes, mostly Spark's
start and warm-up; ``--repeat N`` reports medians of N runs;
``--sizes 100,1024`` picks the value sizes). It starts one broker (async flush)
on 127.0.0.1 in a temporary directory under /tmp and one local Spark session
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
  Arrow from the worker to the JVM, rows into the sink). Target: read >= 0.7x
  the ceiling.
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
import importlib
import importlib.metadata
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench`, `tests` as packages

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.batches import build_request
from equeue_spark.client.columns import decode_columns
from equeue_spark.client.connection import Connection
from equeue_spark.client.reader import stream_replies
from equeue_spark.spark import read_task
from equeue_spark.spark.arrow import arrow_schema, read_schema, to_record_batch
from equeue_spark.spark.testing import local_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SIZES = (100, 1024)
QUEUES = 4
PRODUCE_BATCH = 10_000
TRIGGER_ROWS = 1_000_000
WRITE_BATCH = 10_000
KEY_WIDTH = 10
"""Keys of the read topics: the message number as 10 decimal digits."""
READ_TARGET = 0.7
WRITE_TARGET = 0.5
EXACTLY_TARGET = 0.7
DELIVERIES = ("exactly_once", "at_least_once")
CEILING = "equeue_ceiling"
QUERY_TIMEOUT_S = 900
RPC_TIMEOUT_S = 120.0
HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
NA = "-"


@dataclass(frozen=True)
class Plan:
    messages: int
    """Messages per size at 100 B (sizes above 512 B: scaled down by size)."""
    warmup: int
    """Rows of the untimed warm-up queries."""


FULL = Plan(2_000_000, 80_000)
QUICK = Plan(200_000, 40_000)


def messages_for(size: int, messages: int) -> int:
    """Messages of ``size`` bytes: ``messages``, scaled by 512 / size above 512 B,
    rounded down to whole produce batches per queue."""
    n = messages if size <= 512 else messages * 512 // size
    unit = PRODUCE_BATCH * QUEUES
    return max(unit, n // unit * unit)


# -- the ceiling: a Python data source yielding the read task's batches from memory ----------


@dataclass(frozen=True)
class CeilingSpec:
    """What the ceiling source serves: ``rows_per_queue`` rows in each of ``queues``."""

    rows_per_queue: int
    queues: int
    value_size: int
    batch_rows: int
    """Rows per Arrow batch, as the real read task yields them."""
    max_per_trigger: int
    topic: str
    broker_id: str

    @classmethod
    def parse(cls, options: dict[str, str]) -> CeilingSpec:
        o = {k.lower(): v for k, v in options.items()}
        return cls(
            rows_per_queue=int(o["rowsperqueue"]),
            queues=int(o["queues"]),
            value_size=int(o["valuesize"]),
            batch_rows=int(o["batchrows"]),
            max_per_trigger=int(o["maxoffsetspertrigger"]),
            topic=o["topic"],
            broker_id=o["brokerid"],
        )

    def options(self) -> dict[str, str]:
        return {
            "rowsPerQueue": str(self.rows_per_queue),
            "queues": str(self.queues),
            "valueSize": str(self.value_size),
            "batchRows": str(self.batch_rows),
            "maxOffsetsPerTrigger": str(self.max_per_trigger),
            "topic": self.topic,
            "brokerId": self.broker_id,
        }


@dataclass(frozen=True)
class CeilingRange:
    spec: CeilingSpec
    queue_id: int
    start: int
    end: int


class CeilingPartition(InputPartition):
    def __init__(self, part: CeilingRange) -> None:
        super().__init__(part)


class CeilingSource(DataSource):
    """``format("equeue_ceiling")``: the equeue schema, offsets and batches, from memory."""

    @classmethod
    def name(cls) -> str:
        return CEILING

    def schema(self) -> str:
        return read_schema(False)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return CeilingStreamReader(CeilingSpec.parse(dict(self.options)), schema)


class CeilingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{queue: next row}``; admission as the equeue source's
    ``maxOffsetsPerTrigger`` (equal backlogs: an equal share per queue)."""

    def __init__(self, spec: CeilingSpec, schema: StructType) -> None:
        self.spec = spec
        self.schema = schema

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return {str(q): 0 for q in range(self.spec.queues)}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.spec.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        pass  # the data never grows

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        s = self.spec
        share = s.rows_per_queue
        if isinstance(limit, ReadMaxRows):
            share = max(min(limit.max_rows, s.max_per_trigger) // s.queues, 1)
        return {q: min(int(o) + share, s.rows_per_queue) for q, o in start.items()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [
            CeilingPartition(CeilingRange(self.spec, int(q), int(start[q]), int(end[q])))
            for q in sorted(end, key=int)
            if int(end[q]) > int(start[q])
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return ceiling_batches(partition.value, arrow_schema(self.schema))

    def commit(self, end: dict[str, int]) -> None:
        pass


def _digits(numbers: np.ndarray[Any, Any], width: int, base: int) -> np.ndarray[Any, Any]:
    """Fixed-width ASCII digits of ``numbers`` (one row of ``width`` bytes each)."""
    powers = np.int64(base) ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (numbers[:, None] // powers) % base
    out: np.ndarray[Any, Any] = HEX[digits]
    return out


def _fixed_width(rows: np.ndarray[Any, Any]) -> tuple[pa.Buffer, pa.Buffer]:
    """(offsets, data) of a string/binary column whose items are the rows of ``rows``."""
    n, width = rows.shape
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(width)
    return pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(rows))


TEMPLATES: dict[tuple[int, int, str, str, int, str], pa.RecordBatch] = {}
"""Ceiling template batches, per Python worker process (Spark reuses workers)."""


def ceiling_batches(part: CeilingRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows ``[start, end)`` of one ceiling queue as Arrow batches of
    ``batch_rows``: slices of one template batch per shape, built on first use
    in this process and kept, so that a task costs Spark's work and nothing else."""
    s = part.spec
    key = (s.value_size, s.batch_rows, s.topic, s.broker_id, part.queue_id, str(schema))
    template = TEMPLATES.get(key)
    if template is None:
        template = TEMPLATES[key] = template_batch(s, part.queue_id, schema)
    for lo in range(part.start, part.end, s.batch_rows):
        n = min(s.batch_rows, part.end - lo)
        yield template if n == template.num_rows else template.slice(0, n)


def template_batch(s: CeilingSpec, queue_id: int, schema: pa.Schema) -> pa.RecordBatch:
    """``batch_rows`` rows shaped as the read task's: 10-digit keys, random
    values, the topic, queue, offsets 0.., a timestamp, empty tags, message ids."""
    n = s.batch_rows
    offsets = np.arange(n, dtype=np.int64)
    key_offsets, keys = _fixed_width(_digits(offsets * QUEUES + queue_id, KEY_WIDTH, 10))
    values = pa.py_buffer(np.random.default_rng(queue_id).bytes(n * s.value_size))
    value_offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32) * np.int32(s.value_size))
    topic = np.frombuffer(s.topic.encode(), dtype=np.uint8)
    topic_offsets, topics = _fixed_width(np.broadcast_to(topic, (n, topic.size)))
    prefix = np.frombuffer(f"{s.broker_id}-".encode(), dtype=np.uint8)
    positions = offsets * (s.value_size + 80) + queue_id
    ids = np.concatenate(
        [np.broadcast_to(prefix, (n, prefix.size)), _digits(positions, 16, 16)], axis=1
    )
    id_offsets, id_data = _fixed_width(ids)
    queues = pa.py_buffer(np.full(n, queue_id, dtype=np.int32))
    stamps = pa.py_buffer(np.full(n, time.time_ns() // 1000, dtype=np.int64))
    no_tags = pa.py_buffer(np.zeros(n + 1, dtype=np.int32))
    arrays = [
        pa.Array.from_buffers(pa.binary(), n, [None, key_offsets, keys]),
        pa.Array.from_buffers(pa.binary(), n, [None, value_offsets, values]),
        pa.Array.from_buffers(pa.string(), n, [None, topic_offsets, topics]),
        pa.Array.from_buffers(pa.int32(), n, [None, queues]),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(schema.field("timestamp").type, n, [None, stamps]),
        pa.Array.from_buffers(pa.string(), n, [None, no_tags, pa.py_buffer(b"")]),
        pa.Array.from_buffers(pa.string(), n, [None, id_offsets, id_data]),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- results -----------------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    size: int
    rows: int
    target: float
    ours: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)

    def ours_rate(self) -> float:
        return statistics.median(self.ours)

    def base_rate(self) -> float:
        return statistics.median(self.base)

    def ratio(self) -> float:
        return self.ours_rate() / self.base_rate()


@dataclass
class Diagnostic:
    what: str
    size: int
    rows: int
    seconds: list[float] = field(default_factory=list)
    note: str = ""
    """Shown beside the rate; ``{}`` in it stands for the median of ``asides``."""
    asides: list[float] = field(default_factory=list)

    def rate(self) -> float:
        return self.rows / statistics.median(self.seconds)

    def note_text(self) -> str:
        return self.note.format(statistics.median(self.asides)) if self.asides else self.note


@dataclass
class QueryRun:
    rows: int
    seconds: float
    batch_ms: float
    """Sum of the micro-batches' triggerExecution durations."""
    batches: int


class Results:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], Row] = {}
        self.diagnostics: dict[tuple[str, int], Diagnostic] = {}
        self.notes: list[str] = []

    def add(self, scenario: str, size: int, rows: int, target: float) -> Row:
        return self.rows.setdefault((scenario, size), Row(scenario, size, rows, target))

    def diag(
        self,
        what: str,
        size: int,
        rows: int,
        seconds: float,
        note: str = "",
        *,
        aside: float | None = None,
    ) -> None:
        d = self.diagnostics.setdefault((what, size), Diagnostic(what, size, rows, note=note))
        d.seconds.append(seconds)
        if aside is not None:
            d.asides.append(aside)
        shown = note.format(aside) if aside is not None else note
        progress(f"  diag {what:48} {size_label(size):6} {rows / seconds:12,.0f} rows/s {shown}")


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- CPU by component ------------------------------------------------------------------------------

COMPONENTS = ("JVM", "Python workers", "broker", "bench process")


def cpu_sample(broker_pid: int) -> dict[int, tuple[str, float]]:
    """pid -> (component, CPU seconds so far: user + system, own) of this process
    and its descendants; {} without Linux's /proc.

    The JVM is the ``java`` descendant; Python workers are the Python processes
    below it (pyspark daemons, task workers, the streaming sources' planners);
    the broker is ``broker_pid``; the bench process is this one (the client
    baseline, and the driver's py4j calls).
    """
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, str, float]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            raw = Path("/proc", entry, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        procs[int(entry)] = (int(fields[1]), comm, cpu)
    me = os.getpid()
    found: dict[int, tuple[str, float]] = {}
    for pid, (_, comm, cpu) in procs.items():
        chain = [pid]
        while chain[-1] in procs and chain[-1] not in (me, 0, 1):
            chain.append(procs[chain[-1]][0])
        if chain[-1] != me:
            continue  # not ours
        if pid == broker_pid:
            found[pid] = ("broker", cpu)
        elif comm == "java":
            found[pid] = ("JVM", cpu)
        elif any(procs[p][1] == "java" for p in chain if p in procs):
            found[pid] = ("Python workers", cpu)
        elif pid == me:
            found[pid] = ("bench process", cpu)
    return found


@dataclass
class CpuUse:
    what: str
    size: int
    walls: list[float] = field(default_factory=list)
    uses: list[dict[str, float]] = field(default_factory=list)


class CpuMeter:
    """``with meter.measure(what, size):`` records CPU seconds by component.

    With ``poll`` the processes are sampled every 100 ms, so that a Python
    worker that exits before the end still counts (up to its last sample).
    """

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid
        self.rows: dict[tuple[str, int], CpuUse] = {}

    @contextlib.contextmanager
    def measure(self, what: str, size: int, *, poll: bool = True) -> Iterator[None]:
        # pid -> (component, CPU at the start (0 if started since), latest CPU)
        seen: dict[int, tuple[str, float, float]] = {
            pid: (kind, cpu, cpu) for pid, (kind, cpu) in cpu_sample(self.broker_pid).items()
        }

        def merge() -> None:
            for pid, (kind, cpu) in cpu_sample(self.broker_pid).items():
                first = seen[pid][1] if pid in seen else 0.0
                seen[pid] = (kind, first, cpu)

        stop = threading.Event()

        def sampler() -> None:
            while not stop.wait(0.1):
                merge()

        thread = threading.Thread(target=sampler, name="cpu-sampler", daemon=True)
        if seen and poll:
            thread.start()
        start = time.perf_counter()
        try:
            yield
        finally:
            wall = time.perf_counter() - start
            stop.set()
            if thread.is_alive():
                thread.join()
        if not seen:
            return
        merge()
        use = dict.fromkeys(COMPONENTS, 0.0)
        for kind, first, last in seen.values():
            use[kind] += last - first
        row = self.rows.setdefault((what, size), CpuUse(what, size))
        row.walls.append(wall)
        row.uses.append(use)

    def last(self, what: str, size: int) -> str:
        """The latest measurement of ``what``, as "component seconds" pairs."""
        row = self.rows.get((what, size))
        if row is None:
            return "not sampled"
        return ", ".join(f"{k} {v:.2f}" for k, v in row.uses[-1].items())

    def table(self) -> str:
        cores = os.cpu_count() or 1
        head = " | ".join(f"{k} s" for k in COMPONENTS)
        lines = [
            f"| measurement | size | wall s | {head} | CPU / ({cores} cores x wall) |",
            "|---|---|---:|" + "---:|" * (len(COMPONENTS) + 1),
        ]
        for row in sorted(self.rows.values(), key=lambda r: r.size):
            wall = statistics.median(row.walls)
            use = {k: statistics.median(u[k] for u in row.uses) for k in COMPONENTS}
            cells = [
                row.what,
                size_label(row.size),
                f"{wall:.2f}",
                *(f"{use[k]:.2f}" for k in COMPONENTS),
                f"{sum(use.values()) / (cores * wall):.0%}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


# -- broker side -------------------------------------------------------------------------------


def random_values(size: int) -> list[bytes]:
    rng = np.random.default_rng(size)
    blob = rng.bytes(size * PRODUCE_BATCH)
    return [blob[i * size : (i + 1) * size] for i in range(PRODUCE_BATCH)]


def fill_topic(admin: Admin, producer: Producer, topic: str, size: int, count: int) -> float:
    """Produce ``count`` messages (10-byte keys), batch i to queue i % QUEUES;
    the seconds it took."""
    admin.create_topic(topic, queues=QUEUES)
    values = random_values(size)

    def requests() -> Iterator[pb.ProduceRequest]:
        for b in range(count // PRODUCE_BATCH):
            first = b * PRODUCE_BATCH
            keys = [b"%010d" % (first + i) for i in range(PRODUCE_BATCH)]
            queue = [b % QUEUES] * PRODUCE_BATCH
            yield build_request(topic, values, keys=keys, queue_ids=queue)

    start = time.perf_counter()
    sent = sum(len(r) for r in producer.send_requests(requests()))
    elapsed = time.perf_counter() - start
    if sent != count:
        raise RuntimeError(f"{topic}: produced {sent} of {count}")
    return elapsed


def stored(admin: Admin, topic: str) -> int:
    return sum(q.end_offset - q.earliest_offset for q in admin.list_offsets(topic))


def client_produce(admin: Admin, producer: Producer, topic: str, size: int, count: int) -> float:
    """The write baseline: ``send_batches`` of 10,000 prebuilt messages with
    ``str(i)`` keys, as the Spark write sends; rows/s."""
    admin.create_topic(topic, queues=QUEUES)
    values = random_values(size)
    keys = [str(i).encode() for i in range(count)]
    key_batches = [keys[i : i + PRODUCE_BATCH] for i in range(0, count, PRODUCE_BATCH)]
    batches = [values[: len(k)] for k in key_batches]
    start = time.perf_counter()
    sent = sum(len(r) for r in producer.send_batches(topic, batches, keys=key_batches))
    elapsed = time.perf_counter() - start
    if sent != count or stored(admin, topic) != count:
        raise RuntimeError(f"{topic}: produced {sent} of {count}")
    return count / elapsed


# -- read task in isolation ----------------------------------------------------------------------


def measure_read_task(
    address: str, topic: str, size: int, rows: int, results: Results
) -> tuple[list[int], str]:
    """Time the read path of one partition (queue 0, ``[0, rows)``) in this
    process, piece by piece; the batch sizes the read task yields and the broker id."""
    schema = arrow_schema(_struct(read_schema(False)))
    part = read_task.QueueRange(topic, 0, 0, rows, address, int(RPC_TIMEOUT_S * 1000))
    start = time.perf_counter()
    batches = list(read_task.read_range(part, schema))
    results.diag("read task (PullStream + decode + Arrow)", size, rows, time.perf_counter() - start)
    if sum(b.num_rows for b in batches) != rows:
        raise RuntimeError(f"read task returned {sum(b.num_rows for b in batches)} of {rows}")
    broker_id = str(batches[0].column("message_id")[0].as_py()).rsplit("-", 1)[0]
    sizes = [b.num_rows for b in batches]

    config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)
    with Connection(config) as conn:
        start = time.perf_counter()
        replies = [
            (r.count, r.records)
            for r in stream_replies(
                conn,
                topic,
                0,
                0,
                rows,
                batch_messages=read_task.REPLY_MESSAGES,
                batch_bytes=read_task.REPLY_BYTES,
            )
            if r.count
        ]
        elapsed = time.perf_counter() - start
        results.diag("PullStream transfer only (not decoded)", size, rows, elapsed)
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
    template_batch(spec, 0, schema)
    results.diag("ceiling: one template batch built", size, sizes[0], time.perf_counter() - start)
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


def _struct(ddl: str) -> StructType:
    parsed = StructType.fromDDL(ddl)  # needs the running Spark session's JVM
    assert isinstance(parsed, StructType)
    return parsed


# -- Spark -------------------------------------------------------------------------------------


def spark_session() -> SparkSession:
    """The tests' local session, plus driver memory for the cached write input."""
    conf = {"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"}
    session = local_session("equeue-spark-bench", **conf)
    session.sparkContext.setLogLevel("ERROR")
    return session


def run_query(spark: SparkSession, fmt: str, options: dict[str, str], checkpoint: Path) -> QueryRun:
    """An AvailableNow query from ``fmt`` into the noop sink, timed from start() to its end."""
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load()
    writer = df.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
    start = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    finished = query.awaitTermination(QUERY_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    if not finished:
        query.stop()
        raise RuntimeError(f"{fmt} query did not finish in {QUERY_TIMEOUT_S} s")
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"{fmt} query failed: {error}")
    done = [p for p in query.recentProgress if p.numInputRows]
    rows = sum(p.numInputRows for p in done)
    batch_ms = sum(float(p.durationMs.get("triggerExecution", 0)) for p in query.recentProgress)
    return QueryRun(rows, elapsed, batch_ms, len(done))


def equeue_read_options(address: str, topic: str) -> dict[str, str]:
    return {
        "broker": address,
        "topic": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": str(TRIGGER_ROWS),
        "timeoutMs": str(int(RPC_TIMEOUT_S * 1000)),
    }


def write_frame(spark: SparkSession, size: int, count: int) -> DataFrame:
    """``count`` rows of (key = str(id), value = ``size`` bytes), cached and materialized."""
    hex_digest = "sha2(cast(id as string), 256)"  # 64 hex digits
    value = f"cast(substring(repeat({hex_digest}, {-(-size // 64)}), 1, {size}) as binary)"
    df = spark.range(count).selectExpr("cast(id as string) as key", f"{value} as value").cache()
    if df.count() != count:
        raise RuntimeError("write input: wrong row count")
    return df


def spark_write(
    admin: Admin, df: DataFrame, address: str, topic: str, count: int, *, delivery: str
) -> float:
    admin.create_topic(topic, queues=QUEUES)
    writer = (
        df.write.format("equeue")
        .option("broker", address)
        .option("topic", topic)
        .option("delivery", delivery)
        .option("batchSize", str(WRITE_BATCH))
        .option("timeoutMs", str(int(RPC_TIMEOUT_S * 1000)))
        .mode("append")
    )
    start = time.perf_counter()
    writer.save()
    elapsed = time.perf_counter() - start
    if (got := stored(admin, topic)) != count:
        raise RuntimeError(f"{topic}: Spark wrote {got} of {count}")
    return count / elapsed


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
    df = write_frame(b.spark, size, rows)
    for delivery in DELIVERIES:
        spark_write(b.admin, df, b.address, f"{topic}-{delivery}", rows, delivery=delivery)
    df.unpersist()
    progress(f"{size_label(size)}: warm-up done in {time.perf_counter() - began:.1f} s")


def run_size(b: Bench, size: int, count: int, repeat: int, warmup: int) -> None:
    label = size_label(size)
    warm_up(b, warmup, size)
    topic = f"read-{size}"
    seconds = fill_topic(b.admin, b.producer, topic, size, count)
    progress(f"{label}: {count:,} messages produced in {seconds:.1f} s ({count / seconds:,.0f}/s)")
    per_queue = count // QUEUES
    partition_rows = min(per_queue, TRIGGER_ROWS // QUEUES)
    settle(b.spark)
    sizes, broker_id = measure_read_task(b.address, topic, size, partition_rows, b.results)
    spec = CeilingSpec(per_queue, QUEUES, size, sizes[0], TRIGGER_ROWS, topic, broker_id)
    read = b.results.add("streaming read", size, count, READ_TARGET)
    write = b.results.add("batch write (at-least-once)", size, count, WRITE_TARGET)
    exactly = b.results.add("exactly-once write vs at-least-once", size, count, EXACTLY_TARGET)
    df = write_frame(b.spark, size, count)
    # Untimed, at full size: the first full-size query of a run was the slow one
    # of every benchmark (0.51-0.57x at 1 KiB; its JVM used 5.2-5.5 CPU seconds,
    # 1.4-1.9 in the same query later), even after the small warm-up.
    for fmt in ("equeue", CEILING):
        settle(b.spark)
        began = time.perf_counter()
        run_query(b.spark, fmt, source_options(b, fmt, spec), b.root / f"ck-{size}-warm-{fmt}")
        progress(f"{label}: untimed full-size read {fmt} in {time.perf_counter() - began:.1f} s")
    for run in range(repeat):
        order = ["equeue", CEILING] if run % 2 == 0 else [CEILING, "equeue"]
        for fmt in order:
            settle(b.spark)
            read_query(b, fmt, size=size, count=count, run=run, spec=spec, row=read)
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


def settle(spark: SparkSession) -> None:
    """Before a timed step: write back every dirty page (``os.sync``) and
    collect the driver JVM's garbage (``System.gc``), so that no step pays for
    the writeback or the heap (the cached write input is 1 GB at 1 KiB) of the
    step before it."""
    os.sync()
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.System.gc()


def source_options(b: Bench, fmt: str, spec: CeilingSpec) -> dict[str, str]:
    """The read options of ``fmt`` (equeue or the ceiling) over the topic ``spec`` describes."""
    return equeue_read_options(b.address, spec.topic) if fmt == "equeue" else spec.options()


def read_query(
    b: Bench, fmt: str, *, size: int, count: int, run: int, spec: CeilingSpec, row: Row
) -> None:
    """One timed streaming read, equeue or the ceiling, recorded in ``row``."""
    checkpoint = b.root / f"ck-{size}-{run}-{fmt}"
    options = source_options(b, fmt, spec)
    what = "Spark query, equeue" if fmt == "equeue" else "Spark query, ceiling"
    with b.cpu.measure(f"streaming read, {fmt}", size):
        q = run_query(b.spark, fmt, options, checkpoint)
    if q.rows != count:
        raise RuntimeError(f"{fmt} query read {q.rows} of {count} rows")
    (row.ours if fmt == "equeue" else row.base).append(count / q.seconds)
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


def main_table(results: Results) -> str:
    lines = [
        "| scenario | size | rows | equeue rows/s | baseline rows/s | ratio | target | met? |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    kinds = ["streaming read", "batch write (at-least-once)", "exactly-once write vs at-least-once"]
    order = sorted(results.rows.values(), key=lambda r: (kinds.index(r.scenario), r.size))
    for row in order:
        if not row.ours or not row.base:
            continue
        ratio = row.ratio()
        cells = [
            row.scenario,
            size_label(row.size),
            f"{row.rows:,}",
            f"{row.ours_rate():,.0f}",
            f"{row.base_rate():,.0f}",
            f"{ratio:.2f}x",
            f">= {row.target:g}x",
            "yes" if ratio >= row.target else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def diagnostics_table(results: Results) -> str:
    lines = ["| measurement | size | rows | rows/s | note |", "|---|---|---:|---:|---|"]
    for d in sorted(results.diagnostics.values(), key=lambda d: d.size):
        note = d.note_text()
        if len(d.seconds) > 1:
            note = f"{note} median of {len(d.seconds)}".strip()
        cells = [d.what, size_label(d.size), f"{d.rows:,}", f"{d.rate():,.0f}", note or NA]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    parser.add_argument("--quick", action="store_true", help="smoke run (200,000 messages)")
    parser.add_argument("--repeat", type=int, default=1, help="report the median of N runs")
    parser.add_argument("--sizes", default="100,1024", help="value sizes in bytes (100,1024)")
    parser.add_argument(
        "--messages",
        type=int,
        default=None,
        help="messages at 100 B (default 2,000,000; --quick 200,000); sizes above 512 B "
        "get messages * 512 / size",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not sizes or min(sizes) < 1:
        parser.error("--sizes: give positive sizes")
    plan = QUICK if args.quick else FULL
    messages = args.messages or plan.messages

    # The ceiling source by reference (bench.spark_bench), so Python workers import it
    # instead of unpickling a copy of __main__'s classes.
    ceiling_source: type[DataSource] = importlib.import_module("bench.spark_bench").CeilingSource

    results = Results()
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="equeue-spark-bench-", dir="/tmp"))
    broker = BrokerProcess(root / "broker", "--flush", "async")
    spark: SparkSession | None = None
    meter: CpuMeter | None = None
    try:
        address = broker.start()
        progress(f"broker on {address}, data in {root}")
        spark = spark_session()
        spark.dataSource.register(ceiling_source)
        config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)
        with Admin(config=config) as admin, Producer(config=config) as producer:
            assert broker.process is not None
            meter = CpuMeter(broker.process.pid)
            bench = Bench(spark, admin, producer, address, root, results, meter)
            for size in sizes:
                run_size(bench, size, messages_for(size, messages), args.repeat, plan.warmup)
    finally:
        if spark is not None:
            spark.stop()
        if broker.process is not None:
            broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - began
    mode = "quick" if args.quick else "full"
    print(f"\n## Spark connector ({mode}, repeat {args.repeat}, {elapsed:.0f} s)\n")
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
