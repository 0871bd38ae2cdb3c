"""Deleting queues and topics against a real broker: an unforced queue delete
never drops a message some group (or, with no group, anyone) has not
consumed; a deleted topic's counters do not outlive it."""

from __future__ import annotations

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.cli import main
from equeue_spark.client import Admin, Consumer, PreconditionError, Producer


def _consume(address: str, group: str, topic: str, queue_id: int, count: int) -> None:
    """Pull ``count`` messages of one queue with ``group`` and commit them."""
    with Consumer(address, group=group) as consumer:
        consumer.assign(topic, [queue_id])
        got: list[object] = []
        for _ in range(50):  # bounded: 50 polls of at most 0.2 s
            got += consumer.poll(0.2)
            if len(got) >= count:
                break
        assert len(got) == count
        consumer.commit()


def _hide(admin: Admin, topic: str, queue_id: int) -> None:
    admin.set_queue_visibility(topic, queue_id, producer=False, consumer=False)


def test_delete_queue_refuses_unread_messages_no_group_committed(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("nogroup", queues=3)
        producer.send_batch("nogroup", [b"a", b"b", b"c"], queue_ids=[1, 1, 1])
        _hide(admin, "nogroup", 1)
        with pytest.raises(PreconditionError) as refused:
            admin.delete_queue("nogroup", 1)
        message = str(refused.value)
        assert "nogroup/1" in message and "3 unconsumed" in message and "--force" in message
        assert [q.queue_id for q in admin.describe_topic("nogroup").queues] == [0, 1, 2]

        # An empty queue goes without force.
        _hide(admin, "nogroup", 2)
        assert [q.queue_id for q in admin.delete_queue("nogroup", 2).queues] == [0, 1]
        # Forced, the unread messages go with it.
        assert [q.queue_id for q in admin.delete_queue("nogroup", 1, force=True).queues] == [0]
    assert "dropped=3" in broker.log_since_start()


def test_delete_queue_counts_groups_that_never_read_that_queue(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("partial", queues=2)
        producer.send_batch("partial", [b"x", b"y"], queue_ids=[0, 1])
        _consume(broker.address, "reads-both", "partial", 0, 1)
        _consume(broker.address, "reads-both", "partial", 1, 1)
        _consume(broker.address, "reads-zero", "partial", 0, 1)
        _hide(admin, "partial", 1)
        # "reads-zero" committed on the topic but never read queue 1.
        with pytest.raises(PreconditionError, match="partial/1 still has 1 unconsumed"):
            admin.delete_queue("partial", 1)
        _consume(broker.address, "reads-zero", "partial", 1, 1)
        assert [q.queue_id for q in admin.delete_queue("partial", 1).queues] == [0]


def test_cli_delete_queue_force(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("cli-force", queues=2)
        producer.send_batch("cli-force", [b"a", b"b"], queue_ids=[1, 1])
        _hide(admin, "cli-force", 1)
    base = ["--broker", broker.address, "--timeout-s", "10", "topics", "delete-queue"]
    assert main([*base, "cli-force", "1"]) == 1
    err = capsys.readouterr().err
    assert "FAILED_PRECONDITION" in err and "2 unconsumed" in err and "--force" in err
    assert main([*base, "cli-force", "1", "--force"]) == 0
    assert "deleted queue 1 of topic cli-force" in capsys.readouterr().out


def test_a_recreated_topic_starts_its_counters_at_zero(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("counted", queues=1)
        admin.create_topic("other", queues=1)
        producer.send_batch("counted", [b"1", b"2", b"3"], queue_ids=[0, 0, 0])
        producer.send_batch("other", [b"o"], queue_ids=[0])
        _consume(broker.address, "g", "counted", 0, 3)

        def counters() -> list[tuple[str, int, int, int]]:
            stats = admin.stats()
            return [(c.topic, c.queue_id, c.produced, c.consumed) for c in stats.queue_counters]

        assert counters() == [("counted", 0, 3, 3), ("other", 0, 1, 0)]
        admin.delete_topic("counted")
        assert counters() == [("other", 0, 1, 0)]
        admin.create_topic("counted", queues=1)
        producer.send_batch("counted", [b"new"], queue_ids=[0])
        assert counters() == [("counted", 0, 1, 0), ("other", 0, 1, 0)]
        # The broker-wide totals still count what the deleted topic did.
        stats = admin.stats()
        assert (stats.produced_total, stats.consumed_total) == (5, 3)


def test_a_recreated_queue_id_starts_its_counters_at_zero(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("requeued", queues=2)
        producer.send_batch("requeued", [b"1", b"2"], queue_ids=[1, 1])
        _consume(broker.address, "g", "requeued", 1, 2)
        _hide(admin, "requeued", 1)
        admin.delete_queue("requeued", 1)
        admin.add_queues("requeued", 1)  # takes id 1 again
        stats = admin.stats()
        assert [(c.topic, c.queue_id) for c in stats.queue_counters] == []
