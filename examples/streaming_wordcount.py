"""Streaming word count: a Structured Streaming query over a topic as lines arrive.

What it shows:

* ``spark.readStream.format("equeue")`` with a consumer group (``group``):
  the query commits its progress to the broker after every micro-batch, so
  the broker's own tools (``Admin.describe_group``) show its lag;
* admission control: ``maxOffsetsPerTrigger`` caps each micro-batch;
* a complete-mode aggregation into the memory sink, updated while a
  producer thread keeps sending lines into topic ``lines``;
* at the end, the counts match a plain-Python count of what was sent and
  the group's lag on the broker is 0.

Run it with ``.venv/bin/python examples/streaming_wordcount.py`` (starts a
local broker on a free port with a temporary data directory) or add
``--broker HOST:PORT`` to use a running broker.
"""

from __future__ import annotations

import collections
import random
import re
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor

from _local_broker import example_broker
from _local_spark import local_spark
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's usual spelling)
from pyspark.sql.streaming.query import StreamingQuery

from equeue_spark.client import Admin, Producer

SENTENCES = [
    "the queue is the log and the log is the queue",
    "a consumer group remembers where it stopped",
    "spark reads the queue in micro batches",
    "every message has a topic a queue and an offset",
    "keys keep related messages in order",
    "the broker stores messages in chunks on disk",
    "a streaming query is a batch query that never ends",
    "lag is the distance between the end of the queue and the group",
]
BURSTS = 8
LINES_PER_BURST = 500
MAX_OFFSETS_PER_TRIGGER = 700
TIMEOUT_S = 120.0


def make_lines(seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(SENTENCES) for _ in range(BURSTS * LINES_PER_BURST)]


def produce_in_bursts(address: str, topic: str, lines: list[str]) -> int:
    """Send ``lines`` in bursts while the query runs (in a background thread)."""
    with Producer(address) as producer:
        for start in range(0, len(lines), LINES_PER_BURST):
            burst = [line.encode() for line in lines[start : start + LINES_PER_BURST]]
            producer.send_batch(topic, burst)
            time.sleep(0.5)
    return len(lines)


def total_counted(spark: SparkSession, table: str) -> int:
    row = spark.sql(f"SELECT coalesce(sum(count), 0) AS n FROM {table}").first()
    return 0 if row is None else int(row["n"])


def wait_until_done(
    spark: SparkSession,
    *,
    query: StreamingQuery,
    producing: Future[int],
    admin: Admin,
    group: str,
    expected_words: int,
) -> None:
    """Poll (bounded) until every line was sent, counted, and committed by the group."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        error = query.exception()
        if error is not None or not query.isActive:
            raise SystemExit(f"the streaming query stopped: {error}")
        if (
            producing.done()
            and total_counted(spark, query.name) == expected_words
            and admin.describe_group(group).total_lag == 0
        ):
            return
        time.sleep(0.25)
    raise SystemExit(f"the word count did not catch up within {TIMEOUT_S:.0f} s")


def main() -> None:
    lines = make_lines()
    expected = collections.Counter(word for line in lines for word in re.findall(r"\w+", line))

    with (
        example_broker(__doc__) as broker,
        local_spark("equeue-streaming-wordcount") as spark,
        tempfile.TemporaryDirectory(prefix="wordcount-checkpoint-") as checkpoint,
        Admin(broker.address) as admin,
        ThreadPoolExecutor(1, thread_name_prefix="producer") as background,
    ):
        topic, group = broker.name("lines"), broker.name("wordcount")
        admin.create_topic(topic, queues=4)

        lines_df = (
            spark.readStream.format("equeue")
            .option("broker", broker.address)
            .option("topic", topic)
            .option("group", group)  # progress is committed to the broker as this group
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", MAX_OFFSETS_PER_TRIGGER)
            .load()
        )
        words = lines_df.select(
            F.explode(F.split(F.lower(F.col("value").cast("string")), r"\W+")).alias("word")
        ).where(F.col("word") != "")
        counts = words.groupBy("word").count()

        query = (
            counts.writeStream.format("memory")
            .queryName("wordcounts")
            .outputMode("complete")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        try:
            producing = background.submit(produce_in_bursts, broker.address, topic, lines)
            print(
                f"streaming query started; a producer sends {len(lines)} lines into "
                f"{topic!r} in {BURSTS} bursts"
            )
            wait_until_done(
                spark,
                query=query,
                producing=producing,
                admin=admin,
                group=group,
                expected_words=sum(expected.values()),
            )
            sent = producing.result(timeout=0)
            batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        finally:
            query.stop()

        print(f"\n{sent} lines counted in {len(batches)} micro-batches of {batches} rows")
        print(f"(maxOffsetsPerTrigger={MAX_OFFSETS_PER_TRIGGER} caps each micro-batch)\n")
        print("top words:")
        spark.sql("SELECT word, count FROM wordcounts ORDER BY count DESC, word").show(10)

        counted = {row["word"]: row["count"] for row in spark.table("wordcounts").collect()}
        assert counted == dict(expected), "Spark's counts differ from the lines sent"
        print(f"all {len(counted)} word counts match a plain-Python count of the lines sent")

        info = admin.describe_group(group)
        print(f"\nconsumer group {group!r} on the broker:")
        for q in sorted(info.queues, key=lambda q: (q.topic, q.queue_id)):
            print(
                f"  {q.topic} queue {q.queue_id}: committed {q.committed_offset:>5}"
                f"  end {q.end_offset:>5}  lag {q.lag}"
            )
        print(f"  total lag: {info.total_lag}")
        assert info.total_lag == 0, f"group {group!r} still lags by {info.total_lag}"


if __name__ == "__main__":
    main()
