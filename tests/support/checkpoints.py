"""Spark checkpoints written by an earlier version of the connector, and the
topics they read: ``python -m tests.support.checkpoints`` wrote the fixtures
in tests/data/checkpoints/ (one query over a single broker, one over a
cluster of brokers ``a`` and ``b``); tests/spark/test_checkpoint_compat.py
resumes them.

A checkpoint's offsets are queue offsets, and a cluster checkpoint names its
brokers: ``fill`` recreates the topic with the same messages at the same
(broker, queue, offset) on brokers of the same names. The topic's
incarnation is new on a new broker, so ``adopt_incarnations`` writes the
current one into the copied checkpoint (the only edit: otherwise the query
would rightly see a recreated topic). Hadoop's ``.crc`` side files are left
out of the fixtures, so that edit needs no checksum.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent.parent / "data" / "checkpoints"
TOPIC = "compat"
QUEUES = 2
"""Queues per broker."""
BROKERS = ("a", "b")
"""The cluster checkpoint's broker names."""
PER_QUEUE = 15
"""Messages per queue (per broker and queue in the cluster) before the checkpoint."""
PER_TRIGGER = 10
"""The query's maxOffsetsPerTrigger: the checkpoint holds several batches."""


def queues(cluster: bool) -> list[tuple[str, int]]:
    """(broker name or "", queue id) of every queue of the topic."""
    return [(b, q) for b in (BROKERS if cluster else ("",)) for q in range(QUEUES)]


def value(broker: str, queue_id: int, offset: int) -> bytes:
    return f"{broker or 'single'}-{queue_id}-{offset}".encode()


def fill(target: dict[str, str], cluster: bool, start: int, stop: int) -> None:
    """Offsets ``[start, stop)`` of every queue (``value`` each), queue by queue."""
    from equeue_spark.client import Producer

    with Producer(target.get("broker", ""), namesrv=target.get("namesrv", "")) as producer:
        for broker, queue_id in queues(cluster):
            values = [value(broker, queue_id, o) for o in range(start, stop)]
            producer.send_batch(
                TOPIC,
                values,
                queue_ids=[queue_id] * len(values),
                brokers=[broker] * len(values) if cluster else None,
            )


def create_topic(target: dict[str, str], cluster: bool) -> None:
    """The topic with ``QUEUES`` queues (on each broker), its route complete."""
    from equeue_spark.client import Admin

    with Admin(target.get("broker", ""), namesrv=target.get("namesrv", "")) as admin:
        if not cluster:
            admin.create_topic(TOPIC, queues=QUEUES)
            return
        admin.create_topic(TOPIC, queues=QUEUES, brokers=list(BROKERS))
        deadline = time.monotonic() + 30
        while len(admin.route(TOPIC).queues()) < len(queues(True)):
            assert time.monotonic() < deadline, "the route does not list every queue"
            time.sleep(0.05)


def incarnations(target: dict[str, str], cluster: bool) -> dict[str, int]:
    """The topic's incarnation per broker name ("" for the single broker)."""
    from equeue_spark.client import Admin

    with Admin(target.get("broker", ""), namesrv=target.get("namesrv", "")) as admin:
        if not cluster:
            return {"": admin.describe_topic(TOPIC).incarnation}
        return {b: admin.broker_admin(b).describe_topic(TOPIC).incarnation for b in BROKERS}


def adopt_incarnations(checkpoint: Path, current: dict[str, int]) -> None:
    """Write the topic's ``current`` incarnations into ``checkpoint``'s offsets."""
    for path in (checkpoint / "offsets").glob("[0-9]*"):
        text = path.read_text()
        for broker, incarnation in current.items():
            name = f"incarnation/{broker}" if broker else "incarnation"
            text = re.sub(rf'"{re.escape(name)}": ?\d+', f'"{name}": {incarnation}', text)
        path.write_text(text)


def stream(spark: Any, target: dict[str, str]) -> Any:
    """The query's source, as the fixtures were written with it."""
    reader = spark.readStream.format("equeue")
    for key, setting in target.items():
        reader = reader.option(key, setting)
    return (
        reader.option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(PER_TRIGGER))
        .load()
    )


def run_available_now(df: Any, checkpoint: Path, sink: Path, timeout_s: int = 180) -> None:
    query = (
        df.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(timeout_s), "AvailableNow query did not finish in time"
    assert query.exception() is None, query.exception()


def _keep(checkpoint: Path, into: Path) -> None:
    """``checkpoint`` without what a resume does not need (``.crc`` files)."""
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(checkpoint, into, ignore=shutil.ignore_patterns("*.crc", ".*.crc"))


def generate() -> None:  # pragma: no cover - run by hand, once
    from equeue_broker.testing import BrokerProcess, LocalCluster
    from equeue_spark.spark.testing import local_session

    spark = local_session()
    with tempfile.TemporaryDirectory(prefix="equeue-ck-") as scratch:
        root = Path(scratch)
        broker = BrokerProcess(root / "broker")
        equeue = LocalCluster(root / "cluster", broker_flags=("--register-interval-ms", "300"))
        try:
            broker.start()
            equeue.start(1, BROKERS)
            for name, target, cluster in (
                ("single", {"broker": broker.address}, False),
                ("cluster", {"namesrv": equeue.namesrv}, True),
            ):
                create_topic(target, cluster)
                fill(target, cluster, 0, PER_QUEUE)
                run_available_now(stream(spark, target), root / f"ck-{name}", root / f"{name}-out")
                rows = spark.read.parquet(str(root / f"{name}-out")).count()
                assert rows == PER_QUEUE * len(queues(cluster)), rows
                _keep(root / f"ck-{name}", FIXTURES / name)
        finally:
            broker.stop()
            equeue.stop()
            spark.stop()


if __name__ == "__main__":  # pragma: no cover
    generate()
    sys.exit(0)
