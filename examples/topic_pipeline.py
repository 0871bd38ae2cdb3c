"""Topic-to-topic pipeline: read ``raw``, clean it with Spark SQL, write ``clean``.

What it shows:

* a producer sends JSON events into topic ``raw``, keyed by user; some are
  malformed, some are heartbeats nobody downstream wants;
* a streaming query reads ``raw`` (``readStream.format("equeue")``), parses
  the JSON with ``from_json``, drops the bad and the unwanted rows, enriches
  the rest, and writes them to topic ``clean`` with
  ``writeStream.format("equeue")`` and a checkpoint; the event type becomes
  the message's tag, the key is passed through;
* ``Trigger.AvailableNow``: the query processes everything there is, in
  several micro-batches, then stops by itself;
* a batch read of ``clean``: counts per tag, and proof that the keys were
  preserved (each user's events are in one queue, in their original order).

Run it with ``.venv/bin/python examples/topic_pipeline.py`` (starts a local
broker on a free port with a temporary data directory) or add
``--broker HOST:PORT`` to use a running broker.
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile

from _local_broker import example_broker
from _local_spark import local_spark
from pyspark.sql import Window
from pyspark.sql import functions as F  # noqa: N812 (Spark's usual spelling)

from equeue_spark.client import Admin, Producer

EVENTS = 3000
USERS = 50
EVENT_SCHEMA = "user string, seq long, event string, amount double, country string"
TIMEOUT_S = 120


def make_events(seed: int = 11) -> tuple[list[bytes | None], list[bytes]]:
    """(keys, values): JSON events keyed by user; ~2% malformed, ~10% heartbeats."""
    rng = random.Random(seed)
    keys: list[bytes | None] = []
    values: list[bytes] = []
    seq: dict[str, int] = {}
    for _ in range(EVENTS):
        user = f"user-{rng.randrange(USERS)}"
        seq[user] = seq.get(user, 0) + 1
        kind = rng.choices(["view", "click", "purchase", "heartbeat"], [50, 25, 15, 10])[0]
        event = {
            "user": user,
            "seq": seq[user],
            "event": kind,
            "amount": round(rng.uniform(1, 200), 2) if kind == "purchase" else None,
            "country": rng.choice(["de", "fr", "us", "jp", "br"]),
        }
        text = json.dumps(event)
        if rng.random() < 0.02:
            text = text[: len(text) // 2]  # a truncated message
        keys.append(user.encode())
        values.append(text.encode())
    return keys, values


def main() -> None:
    keys, values = make_events()
    with (
        example_broker(__doc__) as broker,
        local_spark("equeue-topic-pipeline") as spark,
        tempfile.TemporaryDirectory(prefix="pipeline-checkpoint-") as checkpoint,
        Admin(broker.address) as admin,
    ):
        raw_topic, clean_topic = broker.name("raw"), broker.name("clean")
        group = broker.name("raw-to-clean")
        admin.create_topic(raw_topic, queues=4)
        admin.create_topic(clean_topic, queues=4)
        with Producer(broker.address) as producer:
            for lo in range(0, EVENTS, 1000):
                producer.send_batch(raw_topic, values[lo : lo + 1000], keys=keys[lo : lo + 1000])
        print(f"produced {EVENTS} JSON events of {USERS} users into {raw_topic!r}")

        # -- the pipeline: raw -> parse -> filter -> enrich -> clean ------------------
        raw = (
            spark.readStream.format("equeue")
            .option("broker", broker.address)
            .option("topic", raw_topic)
            .option("group", group)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 1000)
            .load()
        )
        parsed = raw.select(
            "key",
            "timestamp",
            F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"),
        )
        cleaned = (
            parsed.where(F.col("e.user").isNotNull())  # malformed JSON parses to nulls
            .where(F.col("e.event") != "heartbeat")
            .select(
                "key",  # passed through: the same user keeps routing to one queue
                F.col("e.event").alias("tag"),
                F.to_json(
                    F.struct(
                        F.col("e.user").alias("user"),
                        F.col("e.seq").alias("seq"),
                        F.upper("e.event").alias("event"),
                        F.coalesce(F.round(F.col("e.amount") * 100), F.lit(0))
                        .cast("long")
                        .alias("amount_cents"),
                        F.upper("e.country").alias("country"),
                        F.date_format("timestamp", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias(
                            "received_at"
                        ),
                    )
                ).alias("value"),
            )
        )
        query = (
            cleaned.writeStream.format("equeue")
            .option("broker", broker.address)
            .option("topic", clean_topic)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            if not query.awaitTermination(TIMEOUT_S):
                raise SystemExit(f"the pipeline did not finish within {TIMEOUT_S} s")
        finally:
            query.stop()
        error = query.exception()
        if error is not None:
            raise SystemExit(f"the pipeline failed: {error}")
        batches = [
            (p["numInputRows"], p["sink"].get("numOutputRows", -1))
            for p in query.recentProgress
            if p["numInputRows"]
        ]
        print(f"pipeline ran {len(batches)} micro-batches (rows in, rows out): {batches}")
        print(f"group {group!r} lag on {raw_topic!r}: {admin.describe_group(group).total_lag}")

        # -- check the result with a batch read ----------------------------------------
        clean = (
            spark.read.format("equeue")
            .option("broker", broker.address)
            .option("topic", clean_topic)
            .load()
            .withColumn("user", F.col("key").cast("string"))
            .withColumn("e", F.from_json(F.col("value").cast("string"), "seq long"))
        )
        clean.cache()
        print(f"\n{clean_topic!r} holds {clean.count()} events; per tag:")
        clean.groupBy("tag").count().orderBy(F.desc("count")).show()

        print("the first clean events of queue 0 (key: value):")
        for row in clean.where("queue = 0").orderBy("offset").limit(4).collect():
            print(f"  offset {row['offset']}  {row['user']}: {row['value'].decode()}")

        # Keys preserved: every user is in exactly one queue, and within it the
        # user's events are in their original order (seq increasing with offset).
        ordered = Window.partitionBy("user").orderBy("offset")
        per_user = (
            clean.withColumn("prev_seq", F.lag("e.seq").over(ordered))
            .groupBy("user")
            .agg(
                F.countDistinct("queue").alias("queues"),
                F.sum(F.when(F.col("e.seq") < F.col("prev_seq"), 1).otherwise(0)).alias(
                    "out_of_order"
                ),
            )
        )
        spread = per_user.where("queues > 1 OR out_of_order > 0").count()
        print(
            f"keys preserved: {per_user.count()} users, each in one queue of {clean_topic!r} "
            f"with its events in order ({spread} exceptions)"
        )

        expected = 0
        for value in values:
            with contextlib.suppress(ValueError):  # the truncated ones don't count
                expected += json.loads(value)["event"] != "heartbeat"
        got = clean.count()
        assert got == expected, f"{clean_topic!r} has {got} events, expected {expected}"
        assert spread == 0, "a user's events were split across queues or reordered"
        clean.unpersist()


if __name__ == "__main__":
    main()
