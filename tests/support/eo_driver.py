"""A Spark driver for the exactly-once kill test (run as a subprocess).

``python -m tests.support.eo_driver BROKER CHECKPOINT SOURCE TARGET [--available-now]``
copies topic SOURCE to topic TARGET with a streaming query (exactly-once sink,
the default). It prints ``query started`` once the query runs, then runs until
it is killed; with ``--available-now`` it copies what is there and exits 0.
A failed query (e.g. the broker went away) exits 1. ``BROKER`` may be
``namesrv=HOST:PORT,...`` (an equeue cluster: the option ``namesrv``);
``--max-per-trigger N`` sets ``maxOffsetsPerTrigger`` (default 20000).
"""

from __future__ import annotations

import sys
from pathlib import Path

from equeue_spark.spark.testing import local_session
from tests.support.spark_home import use_shadow_spark_home


def main() -> int:
    target_broker, checkpoint, source, target = sys.argv[1:5]
    option, broker = "broker", target_broker
    if target_broker.startswith("namesrv="):
        option, broker = "namesrv", target_broker.partition("=")[2]
    flags = sys.argv[5:]
    available_now = "--available-now" in flags
    per_trigger = "20000"
    if "--max-per-trigger" in flags:
        per_trigger = flags[flags.index("--max-per-trigger") + 1]
    # Each driver start runs a new streaming source runner, which has Spark's
    # fixed 10 s to connect back: pyspark imported with cached bytecode (spark_home.py).
    use_shadow_spark_home(Path(checkpoint).parent)
    spark = local_session("equeue-eo-kill-driver")
    spark.sparkContext.setLogLevel("ERROR")
    stream = (
        spark.readStream.format("equeue")
        .option(option, broker)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_trigger)
        .load()
    )
    writer = (
        stream.select("key", "value")
        .writeStream.format("equeue")
        .option(option, broker)
        .option("topic", target)
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="500 milliseconds")
    query = writer.start()
    print("query started", flush=True)
    query.awaitTermination()
    return 0 if query.exception() is None else 1


if __name__ == "__main__":
    try:
        code = main()
    except Exception as exc:  # a failed query: the harness restarts us
        print(f"query failed: {exc}"[:2000], file=sys.stderr, flush=True)
        code = 1
    sys.exit(code)
