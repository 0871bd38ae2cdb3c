"""Delayed messages across SIGKILLs: a real broker killed and restarted three
times while 100,000 delayed messages, due 1 to 60 s after they were sent,
wait (once with all of them pending, twice part-way through the deliveries);
every one is delivered exactly once and none before its time (the broker's
store time), with the pending count falling to zero. Lateness (store time of
the delivery minus the due time) is printed, not asserted: under load it
says more about the machine than about the broker (bench/delay_bench.py
measures it).
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

COUNT = 100_000
BATCH = 1_000
MAX_DELAY_MS = 60_000
KILLS_DURING = (0.25, 0.6)
"""Kills once these shares of the messages are delivered (after one with all pending)."""
QUEUES = 2


def delivered(client: RawClient, ends: dict[int, int], out: list[Message]) -> int:
    """Pull what arrived since ``ends`` (per queue) into ``out``; how many now."""
    for queue_id in range(QUEUES):
        while True:
            messages, reply = pull(client, "timed", ends[queue_id], queue_id=queue_id)
            out += messages
            ends[queue_id] = reply.next_offset
            if not messages:
                break
    return len(out)


def produce_delayed(client: RawClient, rng: random.Random) -> dict[bytes, int]:
    """COUNT messages, each due 1 to 60 s from now; value -> due time."""
    due: dict[bytes, int] = {}
    for start in range(0, COUNT, BATCH):
        values = [b"m%06d" % i for i in range(start, start + BATCH)]
        base = now_ms()
        times = [base + rng.randint(1_000, MAX_DELAY_MS) for _ in values]
        reply = produce(client, "timed", values, deliver_at_ms=times)
        assert set(reply.offsets) == {-1}
        due.update(zip(values, times, strict=True))
    return due


@pytest.mark.slow  # about 90 s: 100,000 messages waiting up to 60 s, three kills
@pytest.mark.timeout(600)
def test_delayed_messages_survive_kills_and_are_delivered_once(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b")
    broker.start()
    try:
        client = RawClient(broker.address)
        request = pb.CreateTopicRequest(name="timed", queue_count=QUEUES)
        client.admin.CreateTopic(request, timeout=10)
        due = produce_delayed(client, random.Random(27))
        client.close()
        broker.kill()  # SIGKILL with everything pending (acknowledged: in the log)
        broker.start()
        client = RawClient(broker.address)
        got: list[Message] = []
        ends = dict.fromkeys(range(QUEUES), 0)
        for share in KILLS_DURING:  # killed again part-way through the deliveries
            target = int(COUNT * share)

            def reached(c: RawClient = client, t: int = target) -> bool:
                return delivered(c, ends, got) >= t

            wait_for(f"{target} deliveries", reached, 180)
            client.close()
            broker.kill()
            broker.start()
            client = RawClient(broker.address)
        wait_for("every delivery", lambda: delivered(client, ends, got) >= COUNT, 240)
        wait_for("nothing pending", lambda: client.stats().delayed_pending == 0, 30)
        delivered(client, ends, got)  # anything after the last due one would be a duplicate
        copies = Counter(m.value for m in got)
        assert set(copies) == set(due)
        assert max(copies.values()) == 1, copies.most_common(3)
        early = [m for m in got if m.store_timestamp_ms < due[m.value]]
        assert not early, early[:3]
        lateness = sorted(m.store_timestamp_ms - due[m.value] for m in got)
        p50, p99 = lateness[len(lateness) // 2], lateness[len(lateness) * 99 // 100]
        print(f"lateness p50 {p50} ms, p99 {p99} ms, max {lateness[-1]} ms")
        client.close()
    finally:
        broker.kill()
