"""Spark quickstart: write a DataFrame into a topic, read it back with spark.read.

What it shows:

* ``df.write.format("equeue")``: 1,000 orders, ``key`` = the customer (so all
  of a customer's orders land in the same queue, in order) and ``value`` =
  the order as JSON;
* ``spark.read.format("equeue")``: the topic as a DataFrame (key, value,
  topic, queue, offset, timestamp, tag, message_id), parsed back with
  ``from_json``, counted per queue.

Run it with ``.venv/bin/python examples/spark_quickstart.py`` (starts a local
broker on a free port with a temporary data directory, removes it at the end)
or add ``--broker HOST:PORT`` to use a running broker.
"""

from __future__ import annotations

from _local_broker import example_broker
from _local_spark import local_spark
from pyspark.sql import functions as F  # noqa: N812 (Spark's usual spelling)

from equeue_spark.client import Admin

ORDERS = 1000
CUSTOMERS = 20
QUEUES = 4
ORDER_SCHEMA = "order_id long, customer string, amount double, status string"


def main() -> None:
    with example_broker(__doc__) as broker, local_spark("equeue-spark-quickstart") as spark:
        topic = broker.name("orders")
        with Admin(broker.address) as admin:
            admin.create_topic(topic, queues=QUEUES)

        # -- write: one row per order; key and value may be strings or binary ----------
        orders = (
            spark.range(ORDERS)
            .withColumnRenamed("id", "order_id")
            .withColumn("customer", F.format_string("customer-%d", F.col("order_id") % CUSTOMERS))
            .withColumn("amount", F.round((F.col("order_id") * 7919 % 10000) / 100, 2))
            .withColumn("status", F.when(F.col("order_id") % 10 == 0, "refunded").otherwise("paid"))
        )
        to_write = orders.select(
            F.col("customer").alias("key"),
            F.to_json(F.struct("order_id", "customer", "amount", "status")).alias("value"),
        )
        (
            to_write.write.format("equeue")
            .option("broker", broker.address)
            .option("topic", topic)
            .mode("append")  # topics are append-only; Spark's default mode is rejected
            .save()
        )
        print(f"wrote {ORDERS} orders of {CUSTOMERS} customers into topic {topic!r}")

        # -- read: the whole topic (startingOffsets=earliest, endingOffsets=latest) -------
        raw = spark.read.format("equeue").option("broker", broker.address).option("topic", topic)
        df = raw.load()
        print("\nschema of a topic read as a DataFrame:")
        df.printSchema()

        print("messages per queue (a key always goes to the same queue):")
        per_queue = df.groupBy("queue").agg(
            F.count("*").alias("messages"),
            F.countDistinct("key").alias("customers"),
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
        )
        per_queue.orderBy("queue").show()

        parsed = df.select(
            "queue",
            "offset",
            F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("order"),
        ).select("queue", "offset", "order.*")
        print("a few orders, parsed back from JSON:")
        parsed.orderBy("queue", "offset").show(5)

        print("\nrevenue per status:")
        parsed.groupBy("status").agg(
            F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue")
        ).orderBy("status").show()

        total = df.count()
        queues_per_key = df.groupBy("key").agg(F.countDistinct("queue").alias("n"))
        assert total == ORDERS, f"read {total} messages, wrote {ORDERS}"
        assert queues_per_key.filter("n > 1").count() == 0, "a customer spans two queues"
        print(f"read back all {total} orders; every customer's orders are in one queue")


if __name__ == "__main__":
    main()
