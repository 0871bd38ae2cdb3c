"""Delayed delivery, nack and dead letters over a cluster (two broker groups,
one name server): a keyed delayed batch splits over both groups and each
part waits on its own broker; a consumer's nacks go to the broker holding
each message (its group's retry topic there, found through the name server);
the dead letters of both groups are listed, resent once and purged.

Real processes (``equeue_broker.testing.LocalCluster``); every wait bounded.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from equeue_broker.testing import LocalCluster
from equeue_proto.retry_topics import retry_topic
from equeue_spark.client import Admin, ClientConfig, Consumer, Message, Producer

pytestmark = pytest.mark.slow

BROKERS = ("a", "b")
BUDGET_S = 90.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    started = LocalCluster(
        tmp_path,
        broker_flags=("--register-interval-ms", "300"),
        namesrv_flags=("--broker-expiry-ms", "3000"),
    )
    try:
        yield started.start(1, BROKERS)
    finally:
        started.kill()


def _config(namesrv: str) -> ClientConfig:
    # Routes refreshed often: the other group's retry topic is found soon.
    return ClientConfig(namesrv=namesrv, timeout_s=10.0, route_refresh_s=1.0)


@pytest.mark.timeout(300)
def test_delays_and_dead_letters_across_two_broker_groups(cluster: LocalCluster) -> None:
    config = _config(cluster.namesrv)
    keys = [b"key-%d" % i for i in range(40)]
    with Admin(config=config) as admin, Producer(config=config) as producer:
        admin.create_topic("jobs", queues=1)
        deadline = time.monotonic() + BUDGET_S
        while len(admin.route("jobs").queues()) < 2:
            assert time.monotonic() < deadline, "the route never showed both brokers"
            time.sleep(0.05)
        results = producer.send_batch("jobs", keys, keys=keys, delay_s=2)
        assert {results.broker_of(i) for i in range(len(results))} == set(BROKERS)
        assert list(results.offsets) == [-1] * len(keys)
        due = results[0].deliver_at_ms
        pending = admin.describe_topic("jobs")
        if time.time() * 1000 < due:
            assert pending.delayed_pending == len(keys)
        deliveries: Counter[bytes] = Counter()
        dead: set[bytes] = set()
        with Consumer(
            config=config, group="jobs-g", topics=["jobs"], max_reconsume_times=1,
            heartbeat_interval_s=0.2,
        ) as consumer:  # fmt: skip
            while len(dead) < len(keys):
                assert time.monotonic() < deadline + BUDGET_S, f"{len(dead)} dead letters"
                batch: list[Message] = consumer.poll(timeout_s=0.5)
                for m in batch:
                    assert m.store_timestamp_ms >= due and m.topic == "jobs"
                    deliveries[m.value] += 1
                if batch:  # one call for the poll's messages: one Nack per broker group
                    outcomes = consumer.nack(batch, delay_s=0.1, error="no")
                    dead.update(m.value for m, o in zip(batch, outcomes, strict=True)
                                if o.action == "dlq")  # fmt: skip
                consumer.commit()
            groups = {b for b, t, _ in consumer.assignments() if t == retry_topic("jobs-g")}
        assert deliveries == Counter({k: 2 for k in keys})
        assert groups == set(BROKERS)  # each group's retry topic read where it is
        letters = admin.dead_letters("jobs-g")
        assert sorted(m.value for m in letters) == sorted(keys)
        assert {m.broker_id for m in letters} == set(BROKERS)
        assert admin.resend_dead_letters("jobs-g", all=True).resent == len(keys)
        assert admin.resend_dead_letters("jobs-g", [letters[0].message_id]).already_resent == 1
        assert admin.purge_dead_letters("jobs-g") == len(keys)
