"""Checkpoints written by an earlier version of the connector resume where
they stopped: nothing read again, nothing skipped (tests/support/checkpoints.py
wrote them, one over a single broker and one over a cluster)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from equeue_broker.testing import BrokerProcess, LocalCluster
from tests.support import checkpoints as ck

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

NEW = 5
"""Messages per queue produced after the checkpoint was written."""


def _resume(spark: Any, target: dict[str, str], cluster: bool, tmp_path: Path) -> None:
    """Recreate the checkpoint's topic, add ``NEW`` messages per queue, resume
    the query from a copy of the fixture and check it reads exactly those."""
    checkpoint = tmp_path / "ck"
    shutil.copytree(ck.FIXTURES / ("cluster" if cluster else "single"), checkpoint)
    ck.create_topic(target, cluster)
    ck.fill(target, cluster, 0, ck.PER_QUEUE)
    ck.fill(target, cluster, ck.PER_QUEUE, ck.PER_QUEUE + NEW)
    ck.adopt_incarnations(checkpoint, ck.incarnations(target, cluster))
    batches = len(list((checkpoint / "offsets").glob("[0-9]*")))

    # foreachBatch: a file sink would look for the batches before the
    # checkpoint in its own log, and a memory sink refuses to recover.
    rows: list[Any] = []
    query = (
        ck.stream(spark, target).writeStream
        .foreachBatch(lambda batch, _id: rows.extend(batch.collect()))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip
    try:
        assert query.awaitTermination(180), "AvailableNow query did not finish in time"
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    read = sorted((r.broker if cluster else "", r.queue, r.offset, r.value) for r in rows)
    assert read == sorted(
        (broker, queue_id, offset, ck.value(broker, queue_id, offset))
        for broker, queue_id in ck.queues(cluster)
        for offset in range(ck.PER_QUEUE, ck.PER_QUEUE + NEW)
    )
    assert len(list((checkpoint / "offsets").glob("[0-9]*"))) > batches  # it went on


def test_single_broker_checkpoint_resumes(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    _resume(spark, {"broker": broker.address}, False, tmp_path)


def test_cluster_checkpoint_resumes(spark: Any, tmp_path: Path) -> None:
    equeue = LocalCluster(tmp_path / "equeue", broker_flags=("--register-interval-ms", "300"))
    try:
        equeue.start(1, ck.BROKERS)  # the brokers the checkpoint names
        _resume(spark, {"namesrv": equeue.namesrv}, True, tmp_path)
    finally:
        equeue.stop()
