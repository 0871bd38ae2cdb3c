"""The equeue demo: a broker, a Spark write, a streaming query, a consumer group.

This is ``make demo``. It

1. starts a local equeue broker (a real process, on a free port, with a
   temporary data directory);
2. writes a DataFrame of 5,000 orders into topic ``orders`` with
   ``df.write.format("equeue")`` (key = customer, value = JSON);
3. runs a Structured Streaming query over the topic with
   ``spark.readStream.format("equeue")``: consumer group ``order-stats``,
   at most 2,000 messages per micro-batch (``maxOffsetsPerTrigger``), a
   running revenue-per-country aggregation;
4. sends 1,500 more orders while the query runs, and watches them arrive;
5. prints the aggregate, then asks the broker for the group's lag per queue
   (0: everything was processed and committed), and shuts everything down.

Run it with ``make demo`` or ``.venv/bin/python examples/streaming_demo.py``;
add ``--broker HOST:PORT`` to use a running broker instead.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from typing import Any

from _local_broker import BrokerHandle, example_broker
from _local_spark import local_spark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's usual spelling)
from pyspark.sql.streaming.query import StreamingQuery

from equeue_spark.client import Admin, Producer

QUEUES = 4
FIRST_ORDERS = 5000
LATE_ORDERS = 1500
MAX_OFFSETS_PER_TRIGGER = 2000
TIMEOUT_S = 90.0
COUNTRIES = ["DE", "FR", "US", "JP", "BR", "IN"]
ORDER_SCHEMA = "order_id long, customer string, country string, amount double"

_started = time.monotonic()


def say(text: str) -> None:
    """Print a line with the seconds since the demo started."""
    print(f"[{time.monotonic() - _started:5.1f}s] {text}", flush=True)


def orders_frame(spark: SparkSession, count: int) -> DataFrame:
    """``count`` orders as (key = customer, value = JSON), computed by Spark."""
    order = (
        spark.range(count)
        .withColumnRenamed("id", "order_id")
        .withColumn("customer", F.format_string("customer-%d", F.col("order_id") % 200))
        .withColumn(
            "country",
            F.element_at(F.array(*map(F.lit, COUNTRIES)), (F.col("order_id") % 6 + 1).cast("int")),
        )
        .withColumn("amount", F.round(F.col("order_id") * 7919 % 20000 / 100, 2))
    )
    return order.select(
        F.col("customer").alias("key"),
        F.to_json(F.struct("order_id", "customer", "country", "amount")).alias("value"),
    )


def late_orders(count: int, first_id: int) -> tuple[list[bytes | None], list[bytes]]:
    """``count`` more orders, made in Python, as the Producer client sends them."""
    rng = random.Random(5)
    keys: list[bytes | None] = []
    values: list[bytes] = []
    for order_id in range(first_id, first_id + count):
        customer = f"customer-{rng.randrange(200)}"
        order = {
            "order_id": order_id,
            "customer": customer,
            "country": rng.choice(COUNTRIES),
            "amount": round(rng.uniform(1, 200), 2),
        }
        keys.append(customer.encode())
        values.append(json.dumps(order).encode())
    return keys, values


def end_offsets(progress: dict[str, Any]) -> str:
    """A micro-batch's end offsets per queue, from its progress report (each
    topic's entry also names the topic's incarnation: docs/spark.md)."""
    end = progress["sources"][0]["endOffset"]
    offsets = json.loads(end) if isinstance(end, str) else end
    return " ".join(
        f"q{q}={o}" for queues in offsets.values() for q, o in queues.items() if q.isdigit()
    )


class BatchPrinter:
    """Prints each completed micro-batch once, from the query's progress reports."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.rows = 0

    def update(self, query: StreamingQuery) -> None:
        for p in query.recentProgress:
            if p["batchId"] in self.seen or not p["numInputRows"]:
                continue
            self.seen.add(p["batchId"])
            self.rows += p["numInputRows"]
            seconds = p["durationMs"].get("triggerExecution", 0) / 1000
            say(
                f"  micro-batch {p['batchId']}: {p['numInputRows']:>5} orders in {seconds:.1f}s"
                f"  (read up to {end_offsets(p)})"
            )


def wait_for_rows(
    query: StreamingQuery, printer: BatchPrinter, admin: Admin, group: str, rows: int
) -> None:
    """Print micro-batches until ``rows`` were processed and committed (bounded)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if query.exception() is not None or not query.isActive:
            raise SystemExit(f"the streaming query stopped: {query.exception()}")
        printer.update(query)
        if printer.rows >= rows and admin.describe_group(group).total_lag == 0:
            return
        time.sleep(0.2)
    raise SystemExit(f"the query did not process {rows} orders within {TIMEOUT_S:.0f} s")


def run(broker: BrokerHandle, spark: SparkSession, admin: Admin, checkpoint: str) -> None:
    topic, group = broker.name("orders"), broker.name("order-stats")
    admin.create_topic(topic, queues=QUEUES)

    # 1. A batch write: any DataFrame with a value column (key, tag, ... optional).
    (
        orders_frame(spark, FIRST_ORDERS)
        .write.format("equeue")
        .option("broker", broker.address)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    say(f"wrote {FIRST_ORDERS} orders into topic {topic!r} with df.write.format('equeue')")

    # 2. A streaming query over the topic, as consumer group `group`.
    orders = (
        spark.readStream.format("equeue")
        .option("broker", broker.address)
        .option("topic", topic)
        .option("group", group)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", MAX_OFFSETS_PER_TRIGGER)
        .load()
        .select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o"))
        .select("o.*")
    )
    revenue = orders.groupBy("country").agg(
        F.count("*").alias("orders"),
        F.round(F.sum("amount"), 2).alias("revenue"),
        F.round(F.avg("amount"), 2).alias("avg_order"),
        F.max("amount").alias("largest"),
    )
    query = (
        revenue.writeStream.format("memory")
        .queryName("revenue_by_country")
        .outputMode("complete")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    say(f"streaming query started: group {group!r}, maxOffsetsPerTrigger={MAX_OFFSETS_PER_TRIGGER}")
    printer = BatchPrinter()
    try:
        wait_for_rows(query, printer, admin, group, FIRST_ORDERS)

        # 3. More data arrives while the query runs (here from the Python client).
        keys, values = late_orders(LATE_ORDERS, first_id=FIRST_ORDERS)
        with Producer(broker.address) as producer:
            producer.send_batch(topic, values, keys=keys)
        say(f"sent {LATE_ORDERS} more orders with the Producer client")
        wait_for_rows(query, printer, admin, group, FIRST_ORDERS + LATE_ORDERS)
    finally:
        query.stop()
    say(f"stopped the query after {len(printer.seen)} micro-batches, {printer.rows} orders")

    print("\nrevenue by country (the streaming aggregate, complete mode):")
    spark.sql("SELECT * FROM revenue_by_country ORDER BY revenue DESC").show()

    info = admin.describe_group(group)
    print(f"consumer group {group!r}, as the broker sees it:")
    width = max(len("topic"), *(len(q.topic) for q in info.queues))
    print(f"  {'topic':<{width}}  queue  committed    end    lag")
    for q in sorted(info.queues, key=lambda q: (q.topic, q.queue_id)):
        offsets = f"{q.committed_offset:>10} {q.end_offset:>6} {q.lag:>6}"
        print(f"  {q.topic:<{width}}  {q.queue_id:>5} {offsets}")
    print(f"  total lag: {info.total_lag}\n")
    assert info.total_lag == 0, f"group {group!r} still lags by {info.total_lag}"
    assert printer.rows == FIRST_ORDERS + LATE_ORDERS


def main() -> None:
    with example_broker(__doc__) as broker:
        say("starting Spark (local[2]): a JVM and its Python workers, 10 to 30 s")
        with (
            local_spark("equeue-demo") as spark,
            tempfile.TemporaryDirectory(prefix="equeue-demo-checkpoint-") as checkpoint,
            Admin(broker.address) as admin,
        ):
            say(f"Spark {spark.version} ready; format('equeue') needs no registration")
            run(broker, spark, admin, checkpoint)
        say("Spark stopped")
    print(
        "\nnext: examples/spark_quickstart.py, streaming_wordcount.py, topic_pipeline.py, "
        "broker_quickstart.py"
    )


if __name__ == "__main__":
    main()
