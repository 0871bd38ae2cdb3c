"""The idempotent producer against a real broker, with its acknowledgement lost
by a proxy on the way back (tests/support/ack_dropping_proxy.py): the retry
gets the original offsets and the batch is in the queue once; without
idempotence the same retry appends it twice (the control)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, Producer, SendResults, read_range
from equeue_spark.client.connection import ClientConfig
from tests.support.ack_dropping_proxy import AckDroppingProxy
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(180)

MARKER = b"lost-ack-marker-6b1f"


def _values(admin: Admin, topic: str, queue_id: int) -> list[bytes]:
    end = _end(admin, topic, queue_id)
    address = admin.route(topic).address("")
    batches = read_range(topic, queue_id, 0, end, broker=address)
    return [m.value for batch in batches for m in batch]


def _end(admin: Admin, topic: str, queue_id: int) -> int:
    (queue,) = [q for q in admin.list_offsets(topic) if q.queue_id == queue_id]
    return int(queue.end_offset)


def _lose_ack(
    broker: BrokerProcess, send: Callable[[Producer], object], idempotent: bool,
    appended: Callable[[Admin], bool],
) -> tuple[object, Admin]:  # fmt: skip
    """Run ``send`` through a proxy that holds the marked request's reply
    until ``appended`` says the broker has the batch, then cuts the
    connection; return what ``send`` returned."""
    proxy = AckDroppingProxy(broker.address, MARKER)
    admin = Admin(broker.address)
    config = ClientConfig(broker=proxy.address, timeout_s=20, retries=5, backoff_s=0.05)
    producer = Producer(config=config, enable_idempotence=idempotent)
    pool = ThreadPoolExecutor(1)
    try:
        future: Future[object] = pool.submit(send, producer)
        assert proxy.armed.wait(60), "the marked request never went out"
        wait_for("the broker to append the marked batch", lambda: appended(admin), 60)
        assert not future.done()  # its acknowledgement is still held
        proxy.cut()
        return future.result(timeout=120), admin
    finally:
        pool.shutdown(wait=True)
        producer.close()
        proxy.close()


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_lost_acknowledgement_is_retried_without_appending_twice(
    broker: BrokerProcess, idempotent: bool
) -> None:
    admin = Admin(broker.address)
    admin.create_topic("orders", 1)
    with Producer(broker.address) as warm:
        before = warm.send_batch("orders", [b"first"], keys=[b"k"])
    assert before[0].offset == 0

    def send(producer: Producer) -> SendResults:
        producer.send_batch("orders", [b"warm-up"], keys=[b"k"])  # the producer id first
        return producer.send_batch("orders", [b"a", MARKER, b"c"], keys=[b"k"] * 3)

    results, admin = _lose_ack(broker, send, idempotent, lambda a: _end(a, "orders", 0) >= 5)
    assert isinstance(results, SendResults)
    if idempotent:
        assert [r.offset for r in results] == [2, 3, 4]  # the original append's
        assert _values(admin, "orders", 0) == [b"first", b"warm-up", b"a", MARKER, b"c"]
    else:  # the control: the retry appended the batch again
        assert [r.offset for r in results] == [5, 6, 7]
        assert _values(admin, "orders", 0).count(MARKER) == 2
    admin.close()


def test_a_broken_stream_is_resent_and_each_batch_appended_once(broker: BrokerProcess) -> None:
    """``send_batches`` pipelines on one ProduceStream; the stream breaks after
    the broker appended batch 6 of 12 (its reply lost): the producer resends
    what was not acknowledged with the same sequences and carries on."""
    admin = Admin(broker.address)
    admin.create_topic("events", 1)
    batches = [[b"b%d-%d" % (i, j) for j in range(50)] for i in range(12)]
    batches[6][10] = MARKER
    stop = threading.Event()

    def send(producer: Producer) -> list[list[int]]:
        def paced() -> Iterator[list[bytes]]:
            for i, batch in enumerate(batches):
                if i == 7:  # the rest once the stream broke (or it is over)
                    stop.wait(60)
                yield batch

        return [[r.offset for r in results] for results in producer.send_batches("events", paced())]

    def appended(a: Admin) -> bool:
        done = _end(a, "events", 0) >= 7 * 50
        if done:
            threading.Timer(0.5, stop.set).start()  # after the cut, not before
        return done

    offsets, admin = _lose_ack(broker, send, True, appended)
    assert offsets == [list(range(i * 50, i * 50 + 50)) for i in range(12)]
    assert _values(admin, "events", 0) == [v for batch in batches for v in batch]
    admin.close()


def test_a_transaction_staging_whose_acknowledgement_is_lost_is_staged_once(
    broker: BrokerProcess,
) -> None:
    """``Transaction.send_batch`` through an idempotent producer is retried;
    the commit (which checks the count the client saw) appends each once."""
    admin = Admin(broker.address)
    admin.create_topic("ledger", 1)

    def send(producer: Producer) -> list[tuple[str, int, int, int]]:
        with producer.transaction("tx-lost-ack") as txn:
            txn.send_batch("ledger", [b"one"], keys=[b"k"])
            txn.send_batch("ledger", [b"two", MARKER], keys=[b"k", b"k"])
        return []

    def staged(a: Admin) -> bool:
        (txn,) = a.list_transactions().transactions or [None]
        return txn is not None and txn.messages == 3

    _, admin = _lose_ack(broker, send, True, staged)
    assert _values(admin, "ledger", 0) == [b"one", b"two", MARKER]
    admin.close()


def test_a_stream_that_breaks_after_its_last_acknowledgement_has_done_its_work(
    broker: BrokerProcess,
) -> None:
    """The broker dies after acknowledging the last batch, before the stream's
    end: ``send_batches`` returns every result instead of raising."""
    Admin(broker.address).create_topic("tail", 1)
    acknowledged = threading.Event()

    def batches() -> Iterator[list[bytes]]:
        yield [b"only"]
        assert acknowledged.wait(60)
        broker.kill()  # the stream ends with UNAVAILABLE, nothing left to send

    config = ClientConfig(broker=broker.address, timeout_s=10, retries=1, backoff_s=0.05)
    with Producer(config=config) as producer:
        results = []
        for result in producer.send_batches("tail", batches()):
            results.append([r.offset for r in result])
            acknowledged.set()
    assert results == [[0]]
