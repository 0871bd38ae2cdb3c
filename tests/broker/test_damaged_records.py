"""Damaged bytes at rest in the message log (issue 15, item 5), end to end.

A record of a sealed chunk with a flipped byte: the store serves the records
before it and answers ``DamagedRecord`` (DATA_LOSS over gRPC, naming topic,
queue and offset) when a read would start with it; the consumer never skips an
intact record, and skips damaged ones only when told to (``on_data_loss``).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from equeue_broker.server.errors import MAX_DETAIL, status_for
from equeue_broker.storage import (
    CorruptionError,
    DamagedRecord,
    ReadStatus,
    StorageConfig,
    Store,
)
from equeue_broker.testing import BrokerProcess
from equeue_proto.protocol import format_message_id
from equeue_spark.client import Admin, Consumer, DataLossError, Message
from tests.conftest import MakeConfig
from tests.support.faults import chunk_path, flip_byte, log_chunks, value_offset
from tests.support.sent import TOPIC, OpenStore, Sent, append

StartBroker = Callable[..., BrokerProcess]
VICTIM = 750


def _damaged_store(config: StorageConfig) -> tuple[list[Sent], list[Sent]]:
    """1,000 messages in queue 0 and 20 in queue 1, then the record of queue 0
    offset 750 (in a sealed chunk) gets a flipped value byte."""
    with Store(config, background=False) as store:
        store.create_topic(TOPIC, 2)
        sent0: list[Sent] = []
        for round_ in range(10):
            sent0 += append(store, 0, f"a{round_}", 100)
        sent1 = append(store, 1, "b", 20)
    path = chunk_path(config, sent0[VICTIM].position)
    assert path != log_chunks(config.data_dir)[-1]  # sealed
    flip_byte(path, value_offset(config, sent0[VICTIM]) + 50)
    return sent0, sent1


def test_damaged_record_in_sealed_chunk_is_not_served(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """A pull (``read_records``) used to copy the damaged record out with status
    OK. Now it stops before it, and a read starting at it fails, naming it."""
    config = make_config()
    sent0, _ = _damaged_store(config)
    store = open_store(config)
    result = store.reads.read_records(TOPIC, 0, 0, max_messages=1000)
    assert (result.status, result.count, result.next_offset) == (ReadStatus.OK, VICTIM, VICTIM)
    for tags in (None, ["even"]):
        with pytest.raises(DamagedRecord) as caught:
            store.reads.read_records(TOPIC, 0, VICTIM, tags=tags)
        assert (caught.value.topic, caught.value.queue_id, caught.value.offset) == (TOPIC, 0, 750)
        assert str(caught.value).startswith(f"damaged record: {TOPIC}/0 offset {VICTIM} (")
        assert len(str(caught.value)) < 300
    even = store.reads.read_records(TOPIC, 0, 700, max_messages=1000, tags=["even"])
    assert (even.count, even.next_offset) == (25, VICTIM)
    with pytest.raises(DamagedRecord):
        store.read(TOPIC, 0, VICTIM)
    after = store.reads.read_records(TOPIC, 0, VICTIM + 1, max_messages=1000)
    assert after.count == len(sent0) - VICTIM - 1


def _poll_until_error(consumer: Consumer, limit: int = 50) -> tuple[list[Message], Exception]:
    got: list[Message] = []
    for _ in range(limit):
        try:
            got += consumer.poll(timeout_s=0.2)
        except DataLossError as exc:
            return got, exc
    raise AssertionError("no DataLossError")


def _poll_all(consumer: Consumer, want: int, limit: int = 50) -> list[Message]:
    got: list[Message] = []
    for _ in range(limit):
        got += consumer.poll(timeout_s=0.2)
        if len(got) >= want:
            return got
    raise AssertionError(f"got {len(got)} of {want} messages")


def test_consumer_stops_at_damaged_record(
    broker_factory: StartBroker, make_config: MakeConfig
) -> None:
    """The broker used to serve the damaged record with status OK; the
    consumer's checksum caught it, but ``poll`` had advanced its positions
    first: it silently skipped the 749 intact records before it, and dropped
    what it had taken from the other queue in the same poll. Now the broker
    serves the 750 intact records, then DATA_LOSS naming the record; the
    consumer delivers every intact record, raises, and stays at the damaged
    one (by default)."""
    config = make_config()
    sent0, sent1 = _damaged_store(config)
    broker = broker_factory(data_dir=config.data_dir)
    want = sorted([(0, s.offset) for s in sent0[:VICTIM]] + [(1, s.offset) for s in sent1])
    with Consumer(broker.address) as consumer:
        consumer.assign(TOPIC, [0, 1])
        got: list[Message] = []
        errors: list[DataLossError] = []
        for _ in range(50):  # the error repeats, other queues' messages still come
            try:
                got += consumer.poll(timeout_s=0.2)
            except DataLossError as exc:
                errors.append(exc)
            if len(errors) >= 2 and len(got) >= len(want):
                break
        assert sorted((m.queue_id, m.offset) for m in got) == want  # each exactly once
        assert all(f"damaged record: {TOPIC}/0 offset {VICTIM}" in str(e) for e in errors)
        # ... and says where as attributes (the broker's trailer), as Kafka's errors do.
        where = {(e.topic, e.queue_id, e.offset, e.position) for e in errors}
        assert where == {(TOPIC, 0, VICTIM, sent0[VICTIM].position)}
        assert len(errors) >= 2 and consumer.position(TOPIC, 0) == VICTIM  # never skipped


def test_consumer_skips_damaged_record_when_told(
    broker_factory: StartBroker, make_config: MakeConfig
) -> None:
    """``on_data_loss="skip"``: every intact record, the damaged one counted."""
    config = make_config()
    sent0, sent1 = _damaged_store(config)
    broker = broker_factory(data_dir=config.data_dir)
    with Consumer(broker.address, on_data_loss="skip") as consumer:
        consumer.assign(TOPIC, [0, 1])
        got = _poll_all(consumer, len(sent0) - 1 + len(sent1))
        assert consumer.damaged_skipped == {(TOPIC, 0): [VICTIM]}
    offsets = sorted(m.offset for m in got if m.queue_id == 0)
    assert offsets == [s.offset for s in sent0 if s.offset != VICTIM]
    assert [m.value for m in got if m.queue_id == 0 and m.offset == VICTIM + 1] == [
        sent0[VICTIM + 1].value
    ]


def test_consumer_keeps_intact_records_of_a_damaged_reply(
    broker_factory: StartBroker, make_config: MakeConfig
) -> None:
    """A record damaged in the active chunk while the broker runs (not verified
    on the way out: the tail scan at open checked it): the consumer's checksum
    catches it. It delivers the records before it, and its position stops at
    the damaged one, which is never skipped unasked."""
    config = make_config()
    with Store(config, background=False) as store:
        store.create_topic(TOPIC, 1)
        sent = append(store, 0, "a", 30)
    broker = broker_factory(data_dir=config.data_dir)
    victim = sent[20]
    flip_byte(chunk_path(config, victim.position), value_offset(config, victim) + 5)
    with Consumer(broker.address, on_data_loss="skip") as consumer:
        consumer.assign(TOPIC, [0])
        got, error = _poll_until_error(consumer)
        assert [m.offset for m in got] == list(range(20))
        assert "offset 20" in str(error)
        assert isinstance(error, DataLossError)
        assert (error.topic, error.queue_id, error.offset) == (TOPIC, 0, 20)
        assert consumer.position(TOPIC, 0) == 20


def test_get_message_does_not_serve_a_damaged_record(
    broker_factory: StartBroker, make_config: MakeConfig
) -> None:
    """GetMessage (by queue and offset, or by message id) used to return the
    damaged record with status OK: only the Python client's checksum noticed,
    naming "byte 0". Now the broker verifies it and answers DATA_LOSS naming
    topic, queue and offset (and the log position), as attributes too."""
    config = make_config()
    sent0, _ = _damaged_store(config)
    broker = broker_factory(data_dir=config.data_dir)
    victim = sent0[VICTIM]
    with Admin(broker.address) as admin:
        before = admin.get_message_at(TOPIC, 0, VICTIM - 1)
        assert before.value == sent0[VICTIM - 1].value
        assert admin.get_message_at(TOPIC, 0, VICTIM + 1).value == sent0[VICTIM + 1].value
        broker_id = before.message_id.rpartition("-")[0]
        message_id = format_message_id(broker_id, victim.position)
        for by_id in (False, True):
            with pytest.raises(DataLossError) as caught:
                if by_id:
                    admin.get_message(message_id)
                else:
                    admin.get_message_at(TOPIC, 0, VICTIM)
            error = caught.value
            assert error.code is grpc.StatusCode.DATA_LOSS
            assert f"damaged record: {TOPIC}/0 offset {VICTIM} (log position" in str(error)
            assert "checksum" in str(error)
            assert (error.topic, error.queue_id, error.offset) == (TOPIC, 0, VICTIM)
            assert error.position == victim.position


def test_consumer_logs_and_seeks_past_a_damaged_record(
    broker_factory: StartBroker, make_config: MakeConfig
) -> None:
    """docs/client.md's loop: on DataLossError, log the record it names and
    seek past it; every intact record is read, the damaged one is not."""
    config = make_config()
    sent0, sent1 = _damaged_store(config)
    broker = broker_factory(data_dir=config.data_dir)
    logged: list[tuple[str | None, int | None, int | None]] = []
    got: list[Message] = []
    with Consumer(broker.address) as consumer:
        consumer.assign(TOPIC, [0, 1])
        for _ in range(100):
            try:
                got += consumer.poll(timeout_s=0.2)
            except DataLossError as exc:
                if exc.topic is None or exc.queue_id is None or exc.offset is None:
                    raise
                logged.append((exc.topic, exc.queue_id, exc.offset))
                consumer.seek(exc.topic, exc.queue_id, exc.offset + 1)
            if len(got) >= len(sent0) - 1 + len(sent1):
                break
    assert logged == [(TOPIC, 0, VICTIM)]
    assert sorted(m.offset for m in got if m.queue_id == 0) == [
        s.offset for s in sent0 if s.offset != VICTIM
    ]


def test_long_error_detail_is_cut_short() -> None:
    """A status message travels in gRPC metadata (8 KiB in all): a longer one
    used to turn a DATA_LOSS into RESOURCE_EXHAUSTED. The server cuts it."""
    code, detail = status_for(CorruptionError("x" * 20_000, "/data/log/000000001.chunk", 7))
    assert code is grpc.StatusCode.DATA_LOSS
    assert len(detail) == MAX_DETAIL and detail.endswith("...")


def test_damaged_last_record_of_a_queue_still_opens(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """Recovery checks each queue's last entry against the record it names by
    the record's header: a damaged body there is a read's business (it is
    reported, the queue keeps its end), not a reason to refuse to open."""
    config = make_config()
    with Store(config, background=False) as store:
        store.create_topic(TOPIC, 2)
        sent1 = append(store, 1, "b", 5)
        for round_ in range(5):
            append(store, 0, f"a{round_}", 100)
    path = chunk_path(config, sent1[-1].position)
    assert path != log_chunks(config.data_dir)[-1]  # sealed
    flip_byte(path, value_offset(config, sent1[-1]) + 10)

    store = open_store(config)
    assert store.queue_info(TOPIC, 1).end == len(sent1)
    assert store.reads.read_records(TOPIC, 1, 0).count == len(sent1) - 1
    with pytest.raises(DamagedRecord):
        store.reads.read_records(TOPIC, 1, len(sent1) - 1)
    assert append(store, 1, "c")[0].offset == len(sent1)
