"""A group's lag per queue (server/group_view.py) and its age in ms: on a
store directly, and through DescribeGroup, GetStats and ``equeue groups
describe`` of a real broker."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from equeue_broker.server.group_view import GroupQueueView, group_queues
from equeue_broker.server.groups import ConsumerRegistry
from equeue_broker.storage import MessageBatch, Store
from equeue_broker.testing import BrokerProcess
from equeue_spark.cli.commands.groups import lag_seconds
from equeue_spark.client import Admin, Producer

OpenStore = Callable[..., Store]


def values(n: int) -> list[bytes]:
    return [f"m{i}".encode() for i in range(n)]


def test_lag_and_its_age_per_queue(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 2)
    store.append("t", 0, MessageBatch(values(5)))
    store.append("t", 1, MessageBatch(values(3)))
    stamp = store.read("t", 0, 2, max_messages=1).messages[0].store_timestamp_ms
    store.commit_offsets("g", [("t", 0, 2), ("t", 1, 3)])
    consumers = ConsumerRegistry(timeout_s=30)
    now = stamp + 1_500
    views = group_queues(store, consumers, "g", now)
    assert views == [
        GroupQueueView("t", 0, 2, 0, 5, 3, 1_500, ""),
        GroupQueueView("t", 1, 3, 0, 3, 0, 0, ""),  # nothing unconsumed: no age
    ]
    assert group_queues(store, consumers, "nobody", now) == []


def test_a_group_that_never_committed_lags_from_the_earliest(open_store: OpenStore) -> None:
    """A live member's topic without committed offsets: lag end - earliest,
    its age that of the earliest message; the member owns the queue."""
    store = open_store()
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch(values(4)))
    stamp = store.read("t", 0, 0, max_messages=1).messages[0].store_timestamp_ms
    consumers = ConsumerRegistry(timeout_s=30)
    consumers.heartbeat("g", "c1", {"t": [0]})
    (view,) = group_queues(store, consumers, "g", stamp + 10)
    assert (view.committed, view.lag, view.lag_ms, view.consumer_id) == (-1, 4, 10, "c1")
    store.topic_admin.delete_topic("t")
    assert group_queues(store, consumers, "g", stamp + 10) == []  # deleted topics left out


def test_lag_seconds_column() -> None:
    assert lag_seconds(0, 0) == 0.0
    assert lag_seconds(3, 2_500) == 2.5
    assert lag_seconds(3, 0) is None  # a broker without the "lag_ms" feature


def test_describe_group_and_stats_report_lag_ms_disk_and_retention(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer, Admin(broker.address) as admin:
        admin.create_topic("aged", queues=1)
        producer.send_batch("aged", [b"a", b"b", b"c"], queue_ids=[0, 0, 0])
        admin.commit_offsets("g", {("aged", 0): 1})
        time.sleep(0.3)  # the unconsumed messages age
        info = admin.describe_group("g")
        (queue,) = info.queues
        assert queue.lag == 2
        assert 300 <= queue.lag_ms < 60_000
        assert info.max_lag_ms == queue.lag_ms
        admin.commit_offsets("g", {("aged", 0): 3})
        caught_up = admin.describe_group("g")
        assert (caught_up.total_lag, caught_up.max_lag_ms, caught_up.queues[0].lag_ms) == (0, 0, 0)

        stats = admin.stats()
        assert "lag_ms" in stats.features
        fs = os.statvfs(broker.data_dir)
        assert stats.data_dir_size_bytes == fs.f_blocks * fs.f_frsize
        assert 0 < stats.data_dir_free_bytes <= stats.data_dir_size_bytes
        assert stats.bytes_on_disk > 0
        assert stats.retention_max_age_ms == 7 * 24 * 3600 * 1000  # the defaults
        assert stats.retention_max_bytes > 0
