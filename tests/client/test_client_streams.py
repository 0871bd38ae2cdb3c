"""Streaming sends (``ProduceStream``) against a real broker: an error raised
while the caller's batches are produced reaches the caller as itself."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, Producer
from equeue_spark.client.batches import build_request


class BadBatch(Exception):
    pass


def one_good_batch_then_raise() -> Iterator[Sequence[bytes]]:
    yield [b"first", b"second"]
    raise BadBatch("batch 2 has a null value in row 7")


def test_send_batches_reraises_the_iterators_exception(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("s", queues=1)
    acknowledged = []
    with (
        Producer(broker.address) as producer,
        pytest.raises(BadBatch, match="batch 2 has a null value in row 7"),
    ):
        for results in producer.send_batches("s", one_good_batch_then_raise()):
            acknowledged.append(len(results))
    assert acknowledged == [2]  # the batch sent before the failure stands
    with Admin(broker.address) as admin:
        assert admin.get_message_at("s", 0, 1).value == b"second"


def test_transaction_stream_reraises_and_aborts(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("t", queues=1)
    staged = []
    with (
        Producer(broker.address) as producer,
        pytest.raises(BadBatch, match="batch 2 has a null value"),
        producer.transaction("txn-1") as txn,
    ):
        for results in txn.send_requests(requests_then_raise()):
            staged.append(len(results))
    assert staged == [1]
    with Admin(broker.address) as admin:
        assert list(admin.list_transactions().transactions) == []  # aborted on the way out
        assert admin.list_offsets("t")[0].end_offset == 0  # nothing became visible


def requests_then_raise() -> Iterator[pb.ProduceRequest]:
    yield build_request("t", [b"staged"])
    raise BadBatch("batch 2 has a null value")
