"""Delayed messages fail over: a master holding pending delayed messages is
SIGKILLed once its replica has copied them; the replica, promoted by hand
(SetRole), delivers every one exactly once and none before its time (a
replica that delivered on its own would have written deliveries its master
also writes: duplicates).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.records import Message
from tests.broker.delayed_support import now_ms, produce, pull
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

GROUP = "delayed-group"
COUNT = 2_000


def read_all(client: RawClient, out: list[Message], ends: list[int]) -> int:
    while True:
        messages, reply = pull(client, "timed", ends[0])
        out += messages
        ends[0] = reply.next_offset
        if not messages:
            return len(out)


@pytest.mark.slow  # about 20 s: two brokers, a kill, a promotion, deliveries over 8 s
@pytest.mark.timeout(180)
def test_the_promoted_replica_delivers_the_pending_messages(tmp_path: Path) -> None:
    flags = ("--broker-name", GROUP)
    master = BrokerProcess(tmp_path / "m", *flags)
    master.start()
    replica = BrokerProcess(tmp_path / "r", *flags, "--role", "replica", "--master", master.address)
    try:
        replica.start()
        mc = RawClient(master.address)
        mc.admin.CreateTopic(pb.CreateTopicRequest(name="timed", queue_count=1), timeout=10)
        rng = random.Random(27)
        due: dict[bytes, int] = {}
        for start in range(0, COUNT, 500):
            values = [b"m%06d" % i for i in range(start, start + 500)]
            times = [now_ms() + rng.randint(3_000, 8_000) for _ in values]
            produce(mc, "timed", values, deliver_at_ms=times)
            due.update(zip(values, times, strict=True))
        rc = RawClient(replica.address)
        end = mc.stats().log_end_position
        wait_for("the replica to copy them", lambda: rc.stats().log_end_position >= end, 30)
        assert rc.stats().delayed_pending > 0  # the replica holds them too
        master.kill()
        mc.close()
        rc.admin.SetRole(pb.SetRoleRequest(role="master", epoch=1), timeout=10)
        got: list[Message] = []
        ends = [0]
        wait_for("every delivery", lambda: read_all(rc, got, ends) >= COUNT, 60)
        wait_for("nothing pending", lambda: rc.stats().delayed_pending == 0, 30)
        read_all(rc, got, ends)
        copies = Counter(m.value for m in got)
        assert set(copies) == set(due)
        assert max(copies.values()) == 1, copies.most_common(3)
        assert not [m for m in got if m.store_timestamp_ms < due[m.value]]
        rc.close()
    finally:
        master.kill()
        replica.kill()
