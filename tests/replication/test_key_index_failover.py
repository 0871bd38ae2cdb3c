"""The key index on a replica and after failover: a replica derives its index
from the bytes it copies, so it answers queries by key exactly as its master
does; SIGKILL the master, promote the replica (SetRole), and it answers the
same and indexes the writes it takes as master. Small slot arrays make the
keys collide."""

from __future__ import annotations

from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, Producer
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

GROUP = "keys-group"
TOPIC = "orders"
KEYS = 500
COUNT = 20_000


def answers(address: str, keys: list[bytes]) -> dict[bytes, list[str]]:
    with Admin(address) as admin:
        return {
            k: [m.message_id for m in admin.query_messages(TOPIC, key=k, limit=100)] for k in keys
        }


def values_of(address: str, key: bytes) -> set[bytes]:
    with Admin(address) as admin:
        return {m.value for m in admin.query_messages(TOPIC, key=key, limit=1000)}


@pytest.mark.slow  # about 5 s: two brokers, a kill, a promotion
@pytest.mark.timeout(240)
def test_replica_answers_like_its_master_and_after_failover(tmp_path: Path) -> None:
    flags = ("--broker-name", GROUP, "--key-index-slots", "64")
    master = BrokerProcess(tmp_path / "m", *flags)
    master.start()
    replica = BrokerProcess(tmp_path / "r", *flags, "--role", "replica", "--master", master.address)
    try:
        replica.start()
        with Admin(master.address) as admin:
            admin.create_topic(TOPIC, queues=2)
        with Producer(master.address) as producer:
            for start in range(0, COUNT, 5_000):
                values = [b"%d" % i for i in range(start, start + 5_000)]
                span = range(start, start + 5_000)
                producer.send_batch(
                    TOPIC, values, keys=[b"k%d" % (i % KEYS) for i in span],
                    headers=[[("keys", b"extra-%d" % (i % 1000))] for i in span],
                )  # fmt: skip
        mc, rc = RawClient(master.address), RawClient(replica.address)
        end = mc.stats().log_end_position
        wait_for("the replica to copy", lambda: rc.stats().log_end_position >= end, 60)
        keys = [b"k%d" % k for k in range(0, KEYS, 7)] + [b"extra-3"]
        expected = answers(master.address, keys)
        assert all(len(ids) == COUNT // KEYS for k, ids in expected.items() if k != b"extra-3")
        assert values_of(master.address, b"extra-3") == {b"%d" % i for i in range(3, COUNT, 1000)}
        wait_for("the replica's answers", lambda: answers(replica.address, keys) == expected, 60)
        master.kill()
        mc.close()
        rc.admin.SetRole(pb.SetRoleRequest(role="master", epoch=1), timeout=10)
        assert answers(replica.address, keys) == expected
        with Producer(replica.address) as producer:
            producer.send_batch(TOPIC, [b"after"], keys=[b"k0"])
        assert b"after" in values_of(replica.address, b"k0")
        assert len(values_of(replica.address, b"k0")) == COUNT // KEYS + 1
        rc.close()
    finally:
        master.kill()
        replica.kill()
