"""A Spark driver program for the standalone-cluster test (run as a subprocess).

``python -m tests.support.cluster_job MASTER_URL BROKER CHECKPOINT_DIR [BROKER CHECKPOINT_DIR
...]`` writes rows into
(``BROKER`` may be ``namesrv=HOST:PORT,...``: an equeue cluster, the option ``namesrv``)
a topic, reads them back in batch and with a streaming AvailableNow query
committing a group, and prints one JSON line of what it saw, including the
process ids that ran the read tasks (to prove they were not the driver). With
several (BROKER, CHECKPOINT_DIR) pairs it does so for each in turn, in one
application (one driver and executor start), a JSON line each.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession


def main() -> None:
    master, pairs = sys.argv[1], sys.argv[2:]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(master)
        .appName("equeue-cluster-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    for n in range(0, len(pairs), 2):
        run(spark, pairs[n], pairs[n + 1], "streamed" if n == 0 else f"streamed_{n // 2}")
    spark.stop()


def run(spark: SparkSession, target: str, checkpoint: str, table: str) -> None:
    option, _, value = target.partition("=") if target.startswith("namesrv=") else ("", "", "")
    option, broker = (option, value) if option else ("broker", target)
    rows = spark.range(2000).selectExpr(
        "cast(id % 50 as string) as key", "cast(id as string) as value"
    )
    rows.write.format("equeue").option(option, broker).option("topic", "cl").mode("append").save()

    read = spark.read.format("equeue").option(option, broker).option("topic", "cl").load()
    read.createOrReplaceTempView("cl")
    stats = spark.sql(
        "select count(*), count(distinct broker, queue, offset), count(distinct value) from cl"
    )
    brokers = sorted(r[0] for r in spark.sql("select distinct broker from cl").collect())
    total, distinct_positions, distinct_values = stats.collect()[0]
    task_pids = read.rdd.mapPartitions(lambda _: [os.getpid()]).distinct().collect()

    stream = (
        spark.readStream.format("equeue").option(option, broker).option("topic", "cl")
        .option("startingOffsets", "earliest").option("group", "cluster")
        .option("maxOffsetsPerTrigger", "700").load()
        .writeStream.format("memory").queryName(table)
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )  # fmt: skip
    finished = stream.awaitTermination(180)
    streamed = spark.sql(f"select count(*) from {table}").collect()[0][0]
    batches = sum(1 for p in stream.recentProgress if p["numInputRows"])
    print(
        json.dumps(
            {
                "total": total,
                "distinct_positions": distinct_positions,
                "distinct_values": distinct_values,
                "task_pids": task_pids,
                "driver_pid": os.getpid(),
                "finished": finished,
                "streamed": streamed,
                "batches": batches,
                "brokers": brokers,
                "target": target,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
