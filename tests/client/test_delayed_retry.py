"""Delayed delivery, nack/retry and dead letters through the client, against
a real broker process.

- A delayed batch is acknowledged at once, invisible until due (broker clock:
  a delivered message's store time is its delivery time), then read once
  with a fresh offset, its message id still resolving; a cancelled one is
  never delivered.
- A consumer that nacks every message with ``max_reconsume_times=3`` sees
  each exactly 4 times (deliveries 1..4, origin address each time), then the
  message is once in ``%DLQ%G`` with its history; a resend puts it back once.
- A consumer that nacks every other attempt processes every message, and
  nothing reaches the dead-letter topic.

Every wait is a bounded loop on what the test waits for; each test's
pytest timeout is above its own budget.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.retry_topics import dlq_topic, retry_topic
from equeue_spark.client import (
    Admin,
    Consumer,
    InvalidRequest,
    Message,
    NotFoundError,
    Producer,
)

BUDGET_S = 60.0
"""How long a test waits for what it expects (far above an idle machine's
seconds): the loops end as soon as it is there."""


def _consume_until(
    consumer: Consumer, done: Callable[[], bool], handle: Callable[[Message], None],
    budget_s: float = BUDGET_S,
) -> None:  # fmt: skip
    """Poll, hand each message to ``handle``, commit; until ``done()``."""
    deadline = time.monotonic() + budget_s
    while not done():
        assert time.monotonic() < deadline, "gave up waiting (see the test's budget)"
        for message in consumer.poll(timeout_s=0.5):
            handle(message)
        consumer.commit()


def _wait_for(check: Callable[[], bool], what: str, budget_s: float = BUDGET_S) -> None:
    deadline = time.monotonic() + budget_s
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_delayed_messages_appear_when_due_and_not_before(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("later", queues=2)
        delay_s = 3.0
        results = producer.send_batch(
            "later", [f"m{i}".encode() for i in range(10)], keys=[b"k"] * 10, delay_s=delay_s
        )
        sent_at_ms = int(time.time() * 1000)
        assert results.delayed and list(results.offsets) == [-1] * 10
        due = results[0].deliver_at_ms
        assert sent_at_ms - 1000 <= due - int(delay_s * 1000) <= sent_at_ms
        info = admin.describe_topic("later")
        if time.time() * 1000 < due:  # a very slow machine may be past it already
            assert info.delayed_pending == 10 and info.delayed_next_due_ms == due
        with Consumer(broker.address, group="g-later", topics=["later"]) as consumer:
            seen: list[Message] = []

            def take(m: Message) -> None:
                assert m.store_timestamp_ms >= due, "delivered before its time"
                seen.append(m)

            _consume_until(consumer, lambda: len(seen) >= 10, take)
            for m in consumer.poll(timeout_s=0.5):  # nothing twice
                take(m)
        assert sorted(m.value for m in seen) == sorted(f"m{i}".encode() for i in range(10))
        assert len({m.queue_id for m in seen}) == 1  # the key routes as without delay
        assert sorted(m.offset for m in seen) == list(range(10))
        assert {m.message_id for m in seen} == {r.message_id for r in results}
        fetched = admin.get_message(results[3].message_id)  # the id still resolves
        assert fetched.value == b"m3" and fetched.offset >= 0
        info = admin.describe_topic("later")
        assert (info.delayed_pending, info.delayed_next_due_ms) == (0, 0)


@pytest.mark.timeout(60)
def test_cancel_a_pending_message(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("cancel", queues=1)
        (result,) = producer.send_batch("cancel", [b"never"], delay_s=3600)
        reply = producer.cancel_delayed(result.message_id)
        assert (reply.topic, reply.queue_id, reply.deliver_at_ms) == (
            "cancel", 0, result.deliver_at_ms,
        )  # fmt: skip
        with pytest.raises(NotFoundError):
            admin.cancel_delayed(result.message_id)  # cancelled already
        unknown = result.message_id[:-4] + "ffff"
        with pytest.raises(NotFoundError):
            admin.cancel_delayed(unknown)
        with pytest.raises(InvalidRequest, match="malformed message id"):
            admin.cancel_delayed("not-an-id")
        assert admin.describe_topic("cancel").delayed_pending == 0
        assert admin.stats().delayed_pending == 0


@pytest.mark.timeout(60)
def test_bad_delivery_times_are_refused_clearly(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer:
        far = int(time.time() * 1000) + 400 * 86_400_000
        with pytest.raises(InvalidRequest, match=str(far)):
            producer.send_batch("bad-times", [b"x"], deliver_at=far)
        with pytest.raises(InvalidRequest, match="before 1970"):
            producer.send_batch("bad-times", [b"x"], deliver_at=-1)
        with pytest.raises(InvalidRequest, match="cannot be staged in a transaction"):
            producer.send_batch("bad-times", [b"x"], delay_s=5, transaction_id="t-1")


@pytest.mark.timeout(180)
def test_nack_every_delivery_until_the_dead_letter_topic(broker: BrokerProcess) -> None:
    """Each message delivered exactly 4 times (max_reconsume_times=3), then
    once in %DLQ%G with its history; a resend puts each back once."""
    values = [f"v{i}".encode() for i in range(5)]
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("work", queues=2)
        originals = producer.send_batch("work", values, keys=values)
        where = {
            v: (r.queue_id, r.offset, r.message_id) for v, r in zip(values, originals, strict=True)
        }
        deliveries: dict[bytes, list[int]] = {v: [] for v in values}
        consumer = Consumer(
            broker.address, group="G", topics=["work"], max_reconsume_times=3,
            heartbeat_interval_s=0.2,
        )  # fmt: skip
        with consumer:

            def fail(m: Message) -> None:
                deliveries[m.value].append(m.deliveries)
                queue_id, offset, message_id = where[m.value]
                assert (m.topic, m.queue_id, m.offset) == ("work", queue_id, offset)
                assert m.retry == (m.deliveries > 1)
                if m.retry:
                    assert m.origin is not None and m.origin.message_id == message_id
                    assert m.error == f"attempt {m.deliveries - 1} failed"
                (outcome,) = consumer.nack(m, delay_s=0.1, error=f"attempt {m.deliveries} failed")
                assert outcome.deliveries == m.deliveries
                assert outcome.action == ("dlq" if m.deliveries == 4 else "retry")

            def all_dead() -> bool:
                return all(len(d) == 4 for d in deliveries.values())

            _consume_until(consumer, all_dead, fail)
            assert retry_topic("G") in {t for t, _ in consumer.assignment()}
            # Nothing comes a fifth time: the retry topic is drained (its end
            # committed) and the topics' queues too.
            _consume_until(consumer, lambda: _drained(admin, "G"), fail)
        assert deliveries == {v: [1, 2, 3, 4] for v in values}
        dead = admin.dead_letters("G")
        assert sorted(m.value for m in dead) == values
        for m in dead:
            queue_id, offset, message_id = where[m.value]
            assert m.topic == dlq_topic("G")
            assert m.origin is not None
            assert (m.origin.topic, m.origin.queue_id, m.origin.offset) == (
                "work", queue_id, offset,
            )  # fmt: skip
            assert m.origin.message_id == message_id
            assert m.deliveries == 4 and m.error == "attempt 4 failed"
        reply = admin.resend_dead_letters("G", [dead[0].message_id])
        assert (reply.resent, reply.already_resent, list(reply.not_found)) == (1, 0, [])
        reply = admin.resend_dead_letters("G", all=True)
        assert (reply.resent, reply.already_resent) == (4, 0)
        assert admin.resend_dead_letters("G", all=True).resent == 0  # once each
        again = admin.resend_dead_letters("G", [dead[0].message_id])
        assert (again.resent, again.already_resent) == (0, 1)
        with Consumer(broker.address, group="G2", topics=["work"]) as reader:
            got: Counter[bytes] = Counter()
            _consume_until(reader, lambda: sum(got.values()) >= 10, lambda m: got.update([m.value]))
        assert got == Counter({v: 2 for v in values})  # the original and its one resend
        assert admin.purge_dead_letters("G") == 5
        assert admin.dead_letters("G") == []


def _drained(admin: Admin, group: str) -> bool:
    """No retry pending, then every queue the group reads (its retry topic
    too) committed at its end: nothing more can come (asked in this order,
    a retry delivered in between shows as lag)."""
    if admin.describe_topic(retry_topic(group)).delayed_pending:
        return False
    return all(q.lag == 0 for q in admin.describe_group(group).queues)


@pytest.mark.timeout(180)
def test_nack_every_other_attempt_processes_everything(broker: BrokerProcess) -> None:
    values = [f"w{i}".encode() for i in range(20)]
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("half", queues=2)
        producer.send_batch("half", values, keys=values)
        processed: Counter[bytes] = Counter()
        attempts: Counter[bytes] = Counter()
        consumer = Consumer(
            broker.address, group="H", topics=["half"], max_reconsume_times=3,
            heartbeat_interval_s=0.2,
        )  # fmt: skip
        with consumer:

            def every_other(m: Message) -> None:
                attempts[m.value] += 1
                if m.deliveries % 2:
                    consumer.nack(m, delay_s=0.1, error="odd attempt")
                else:
                    processed[m.value] += 1

            _consume_until(consumer, lambda: len(processed) == len(values), every_other)
            _consume_until(consumer, lambda: _drained(admin, "H"), every_other)
        assert processed == Counter({v: 1 for v in values})
        assert attempts == Counter({v: 2 for v in values})
        assert admin.dead_letters("H") == []
