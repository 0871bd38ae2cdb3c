"""Idempotent produce on the wire (broker.proto, "Idempotent produce"): a real
broker, the generated stubs, no equeue client."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.protocol import OUT_OF_ORDER_SEQUENCE, PRODUCER_FENCED, UNKNOWN_PRODUCER
from equeue_proto.v1 import broker_pb2 as pb
from tests.support.raw_client import RawClient, error_kind

pytestmark = pytest.mark.timeout(120)


def _request(
    topic: str, values: list[bytes], queue_ids: list[int], producer: tuple[int, int] = (0, 0),
    sequences: dict[int, int] | None = None,
) -> pb.ProduceRequest:  # fmt: skip
    columns = pb.MessageColumns(
        count=len(values), values=b"".join(values), value_lengths=[len(v) for v in values]
    )
    request = pb.ProduceRequest(topic=topic, messages=columns, queue_ids=queue_ids)
    request.producer_id, request.producer_epoch = producer
    for queue_id, sequence in (sequences or {}).items():
        request.sequences.add(queue_id=queue_id, sequence=sequence)
    return request


def _init(client: RawClient, producer_id: int = 0) -> tuple[int, int]:
    reply: pb.InitProducerReply = client.broker.InitProducer(
        pb.InitProducerRequest(producer_id=producer_id), timeout=10
    )
    assert reply.window == 5
    return reply.producer_id, reply.producer_epoch


def _ends(client: RawClient, topic: str) -> list[int]:
    reply = client.broker.ListOffsets(pb.ListOffsetsRequest(topic=topic), timeout=10)
    return [q.end_offset for q in sorted(reply.queues, key=lambda q: q.queue_id)]


def _refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_a_repeated_request_is_acknowledged_with_its_original_offsets(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """Also a request writing two queues, also after the broker was killed
    (SIGKILL) and restarted on its data."""
    broker = broker_factory()
    client = RawClient(broker.address)
    client.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=10)
    producer = _init(client)
    assert producer[0] > 0 and producer[1] == 0
    one = _request("t", [b"a", b"b"], [0, 0], producer, {0: 0})
    first = client.broker.Produce(one, timeout=10)
    again = client.broker.Produce(one, timeout=10)
    assert list(again.offsets) == list(first.offsets) == [0, 1]
    assert list(again.positions) == list(first.positions)
    two = _request("t", [b"c", b"x", b"d"], [0, 1, 0], producer, {0: 1, 1: 0})
    written = client.broker.Produce(two, timeout=10)
    assert _ends(client, "t") == [4, 1]
    broker.kill()
    client.close()
    broker.start()
    client = RawClient(broker.address)
    repeated = client.broker.Produce(two, timeout=10)
    assert list(repeated.queue_ids) == [0, 1, 0]
    assert list(repeated.offsets) == list(written.offsets) == [2, 0, 3]
    assert list(repeated.positions) == list(written.positions)
    assert _ends(client, "t") == [4, 1]
    client.close()


def test_gaps_fenced_epochs_unknown_producers_and_malformed_requests_are_refused(
    broker: BrokerProcess,
) -> None:
    client = RawClient(broker.address)
    client.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=10)
    producer = _init(client)
    client.broker.Produce(_request("t", [b"a"], [0], producer, {0: 0}), timeout=10)

    def produce(request: pb.ProduceRequest) -> grpc.RpcError:
        return _refused(lambda: client.broker.Produce(request, timeout=10))

    gap = produce(_request("t", [b"b"], [0], producer, {0: 2}))
    assert gap.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_kind(gap) == OUT_OF_ORDER_SEQUENCE
    assert "sent sequence 2 for t/0, expected 1" in (gap.details() or "")
    unknown = produce(_request("t", [b"b"], [0], (producer[0] ^ 1, 0), {0: 4}))
    assert error_kind(unknown) == UNKNOWN_PRODUCER
    assert _init(client, producer[0]) == (producer[0], 1)
    fenced = produce(_request("t", [b"b"], [0], producer, {0: 1}))
    assert (fenced.code(), error_kind(fenced)) == (
        grpc.StatusCode.FAILED_PRECONDITION, PRODUCER_FENCED,
    )  # fmt: skip
    bad = {
        "must name every message's queue": _request(
            "t", [b"b", b"c"], [], (producer[0], 1), {0: 0, 1: 0}
        ),
        "give one sequence per queue": _request("t", [b"b", b"c"], [0, 1], (producer[0], 1),
                                                {0: 0}),
        "without a producer_id": _request("t", [b"b"], [0], (0, 0), {0: 0}),
    }  # fmt: skip
    for why, request in bad.items():
        error = produce(request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, why
        assert why in (error.details() or "")
    assert _ends(client, "t") == [1, 0]  # nothing refused was appended
    client.close()


def test_a_repeated_staging_is_staged_once(broker_factory: Callable[..., BrokerProcess]) -> None:
    """Transactions: an idempotent staging sent again (also after a restart)
    stages nothing more; the commit appends each message once."""
    broker = broker_factory()
    client = RawClient(broker.address)
    client.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=10)
    producer = _init(client)
    plain = _request("t", [b"p"], [0], producer, {0: 0})
    client.broker.Produce(plain, timeout=10)
    staged = _request("t", [b"a", b"b", b"c"], [0, 1, 0], producer, {0: 1, 1: 0})
    staged.transaction_id = "tx-1"
    assert client.broker.Produce(staged, timeout=10).transaction_messages == 3
    assert client.broker.Produce(staged, timeout=10).transaction_messages == 3
    broker.kill()
    client.close()
    broker.start()
    client = RawClient(broker.address)
    assert client.broker.Produce(staged, timeout=10).transaction_messages == 3
    gap = _refused(lambda: client.broker.Produce(_request("t", [b"x"], [0], producer, {0: 3})))
    assert error_kind(gap) == OUT_OF_ORDER_SEQUENCE  # the staging took sequence 1 of queue 0
    commit = pb.CommitTransactionsRequest()
    commit.transactions.add(transaction_id="tx-1", expected_messages=3)
    reply = client.broker.CommitTransactions(commit, timeout=10)
    assert sorted((q.queue_id, q.first_offset, q.count) for q in reply.queues) == [
        (0, 1, 2), (1, 0, 1),
    ]  # fmt: skip
    assert _ends(client, "t") == [3, 1]
    client.close()


def test_a_batch_for_one_queue_may_name_it_once(broker: BrokerProcess) -> None:
    """No queue id per message: the one sequence entry names the queue."""
    client = RawClient(broker.address)
    client.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=3), timeout=10)
    producer = _init(client)
    request = _request("t", [b"a", b"b"], [], producer, {2: 0})
    first = client.broker.Produce(request, timeout=10)
    again = client.broker.Produce(request, timeout=10)
    assert list(first.queue_ids) == list(again.queue_ids) == [2, 2]
    assert list(first.offsets) == list(again.offsets) == [0, 1]
    assert _ends(client, "t") == [0, 0, 2]
    missing = _refused(
        lambda: client.broker.Produce(_request("t", [b"x"], [], producer, {7: 0}), timeout=10)
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    client.close()


def test_a_stream_of_repeated_requests_appends_each_once(broker: BrokerProcess) -> None:
    """ProduceStream: a stream resent whole after it broke (what the client
    does with the requests it has no acknowledgement for)."""
    client = RawClient(broker.address)
    client.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
    producer = _init(client)
    requests = [_request("t", [b"%d" % i], [0], producer, {0: i}) for i in range(20)]
    first = [r.offsets[0] for r in client.broker.ProduceStream(iter(requests[:12]), timeout=30)]
    again = iter(requests[8:])  # within the window of 5: sequences 7 to 11
    resent = [r.offsets[0] for r in client.broker.ProduceStream(again, timeout=30)]
    assert first == list(range(12)) and resent == list(range(8, 20))
    assert _ends(client, "t") == [20]
    client.close()
