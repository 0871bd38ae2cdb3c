"""The Spark benchmark's setup: the session, its queries and writes, the broker's topics.

Shared by ``bench/spark_bench.py`` and the ceiling source (``bench/_spark_ceiling.py``):
the layout constants (queues, batch sizes, timeouts), the local Spark session,
one timed AvailableNow query, the cached write input and one timed Spark
write, and the broker side (filling a read topic, the client's write baseline).
Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, Producer
from equeue_spark.client.batches import build_request
from equeue_spark.spark.testing import local_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

QUEUES = 4
PRODUCE_BATCH = 10_000
TRIGGER_ROWS = 1_000_000
WRITE_BATCH = 10_000
KEY_WIDTH = 10
"""Keys of the read topics: the message number as 10 decimal digits."""
CEILING = "equeue_ceiling"
QUERY_TIMEOUT_S = 900
RPC_TIMEOUT_S = 120.0


@dataclass
class QueryRun:
    rows: int
    seconds: float
    batch_ms: float
    """Sum of the micro-batches' triggerExecution durations."""
    batches: int


# -- Spark -------------------------------------------------------------------------------------


def spark_session() -> SparkSession:
    """The tests' local session, plus driver memory for the cached write input."""
    conf = {"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"}
    session = local_session("equeue-spark-bench", **conf)
    session.sparkContext.setLogLevel("ERROR")
    return session


WORKER_START_FAILURE = "Python worker failed to connect back"
"""Spark's error when a Python worker did not start within its 10 s: on a machine
shared with other work, a query is run again (fresh checkpoint) after it."""
QUERY_ATTEMPTS = 3


def run_query(spark: SparkSession, fmt: str, options: dict[str, str], checkpoint: Path) -> QueryRun:
    """An AvailableNow query from ``fmt`` into the noop sink, timed from start() to
    its end; run again (at most ``QUERY_ATTEMPTS`` times) if a Python worker did
    not start in time, which says nothing about the source."""
    for attempt in range(1, QUERY_ATTEMPTS + 1):
        try:
            return _run_query(
                spark, fmt, options, checkpoint.with_name(f"{checkpoint.name}-{attempt}")
            )
        except Exception as exc:  # pyspark's StreamingQueryException, or ours
            if WORKER_START_FAILURE not in str(exc) or attempt == QUERY_ATTEMPTS:
                raise
            print(f"{fmt} query: {WORKER_START_FAILURE}; running it again", file=sys.stderr)
    raise AssertionError("unreachable")


def _run_query(
    spark: SparkSession, fmt: str, options: dict[str, str], checkpoint: Path
) -> QueryRun:
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


def settle(spark: SparkSession) -> None:
    """Before a timed step: write back every dirty page (``os.sync``) and
    collect the driver JVM's garbage (``System.gc``), so that no step pays for
    the writeback or the heap (the cached write input is 1 GB at 1 KiB) of the
    step before it."""
    os.sync()
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.System.gc()


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
