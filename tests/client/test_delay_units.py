"""Delayed delivery and retries on the client side, without a broker:
delivery times and durations, the request and result columns, the retry
headers a message carries, the CLI's and the Spark sink's checks."""

from __future__ import annotations

import datetime as dt
import pickle

import pyarrow as pa
import pytest

from equeue_proto.retry_topics import (
    DELIVERIES,
    ERROR,
    ORIGIN_ID,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    dlq_topic,
    retry_topic,
)
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli import main
from equeue_spark.client import InvalidRequest, Message
from equeue_spark.client.batches import BatchColumns, SendResults
from equeue_spark.client.delays import (
    deliver_at_ms,
    parse_duration_s,
    parse_time_ms,
    refuse_staged,
    time_ms,
)
from equeue_spark.client.records import Origin
from equeue_spark.client.retries import (
    RetryMessage,
    address_of,
    check_reconsume_times,
    redelivered,
)
from equeue_spark.client.route import split_request, take_rows
from equeue_spark.client.transactions import Transaction
from equeue_spark.spark.write_task import build_produce, check_schema

NOW = 1_800_000_000_000


# -- delivery times --------------------------------------------------------------------


def test_delay_and_deliver_at_become_ms_since_the_epoch() -> None:
    assert deliver_at_ms(3) == []
    assert deliver_at_ms(3, delay_s=30, now_ms=NOW) == [NOW + 30_000]
    assert deliver_at_ms(3, delay_s=0.25, now_ms=NOW) == [NOW + 250]
    assert deliver_at_ms(2, delay_s=[1, 2.5], now_ms=NOW) == [NOW + 1000, NOW + 2500]
    assert deliver_at_ms(1, deliver_at=NOW + 5) == [NOW + 5]
    aware = dt.datetime(2027, 1, 31, 10, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    naive = dt.datetime(2027, 1, 31, 9, 0)  # naive: UTC
    assert deliver_at_ms(2, deliver_at=[aware, naive]) == [time_ms(aware)] * 2
    assert time_ms(naive) == 1_801_386_000_000


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"delay_s": 1, "deliver_at": NOW}, "not both"),
        ({"delay_s": -1}, ">= 0"),
        ({"delay_s": float("nan")}, "finite"),
        ({"delay_s": "30s"}, "not text"),
        ({"delay_s": 1e30}, "the broker can take"),
        ({"delay_s": [1, 2, 3]}, "3 items for 2 messages"),
        ({"deliver_at": -5}, "before 1970"),
        ({"deliver_at": 2**63}, "out of range"),
        ({"deliver_at": dt.datetime(1, 1, 1, tzinfo=dt.UTC)}, "out of range"),
        ({"deliver_at": "2027-01-01"}, "not text"),
        ({"deliver_at": [NOW]}, "1 items for 2 messages"),
    ],
)
def test_bad_delivery_times_are_clear_errors(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        deliver_at_ms(2, now_ms=NOW, **kwargs)  # type: ignore[arg-type]


def test_durations_and_iso_times() -> None:
    assert parse_duration_s("30s") == 30
    assert parse_duration_s("500ms") == 0.5
    assert parse_duration_s("1.5m") == 90
    assert parse_duration_s("2h") == 7200
    assert parse_duration_s("7d") == 7 * 86400
    assert parse_duration_s("12") == 12
    for bad in ("", "-1s", "5x", "1 week"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration_s(bad)
    assert parse_time_ms("2027-01-31T09:00:00Z") == 1_801_386_000_000
    assert parse_time_ms("2027-01-31T10:00:00+01:00") == 1_801_386_000_000
    assert parse_time_ms("2027-01-31T09:00:00") == 1_801_386_000_000
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time_ms("tomorrow")


# -- requests and results --------------------------------------------------------------


def test_requests_carry_the_times_and_split_them_per_row() -> None:
    columns = BatchColumns([b"a", b"b", b"c"], deliver_at_ms=[NOW, NOW + 1, NOW + 2])
    request = columns.request("t")
    assert list(request.deliver_at_ms) == [NOW, NOW + 1, NOW + 2]
    assert list(take_rows(request, [2, 0]).deliver_at_ms) == [NOW + 2, NOW]
    one = BatchColumns([b"a", b"b"], keys=[b"x", b"y"], deliver_at_ms=[NOW]).request("t")
    parts = split_request(one, [("a", 0), ("b", 0)], ("a", 0))
    for _, part in parts.values():
        assert list(part.deliver_at_ms) == [NOW]  # one time for all stays one


def test_a_delayed_message_cannot_be_staged() -> None:
    with pytest.raises(InvalidRequest, match="cannot be staged in a transaction"):
        BatchColumns([b"a"], deliver_at_ms=[NOW]).request("t", "txn-1")
    request = pb.ProduceRequest(topic="t", transaction_id="txn-2", deliver_at_ms=[NOW])
    with pytest.raises(InvalidRequest, match="txn-2"):
        refuse_staged(request)
    txn = Transaction(None, "txn-3")  # type: ignore[arg-type]  # refused before any call
    with pytest.raises(InvalidRequest, match="txn-3"):
        txn.send_batch("t", [b"a"], delay_s=5)


def test_results_of_delayed_messages_have_no_offset_yet() -> None:
    reply = pb.ProduceReply(
        queue_ids=[0, 1], offsets=[-1, -1], positions=[10, 20], broker_id="b",
        deliver_at_ms=[NOW, NOW + 1],
    )  # fmt: skip
    results = SendResults("t", reply)
    assert results.delayed
    assert [(r.offset, r.deliver_at_ms, r.message_id) for r in results] == [
        (-1, NOW, "b-000000000000000a"),
        (-1, NOW + 1, "b-0000000000000014"),
    ]
    one = SendResults("t", pb.ProduceReply(queue_ids=[0], offsets=[-1], positions=[1],
                                           deliver_at_ms=[NOW]))  # fmt: skip
    merged = SendResults.merged("t", 3, [([0, 2], results), ([1], one)])
    assert [r.deliver_at_ms for r in merged] == [NOW, NOW, NOW + 1]
    plain = SendResults("t", pb.ProduceReply(queue_ids=[0], offsets=[5], positions=[1]))
    assert not plain.delayed and plain[0].offset == 5 and plain[0].deliver_at_ms == 0


# -- what a retried message carries ----------------------------------------------------


def _message(topic: str, offset: int, headers: tuple[tuple[str, bytes], ...] = ()) -> Message:
    return Message(topic, 0, offset, None, b"v", "", headers, NOW, NOW, 99, "b1")


RETRY_HEADERS = (
    ("app", b"x"),
    (ORIGIN_TOPIC, b"orders"),
    (ORIGIN_QUEUE, b"3"),
    (ORIGIN_OFFSET, b"41"),
    (ORIGIN_ID, b"b1-0000000000000007"),
    (DELIVERIES, b"2"),
    (ERROR, b"boom"),
)


def test_a_first_delivery_is_no_retry() -> None:
    m = _message("orders", 5)
    assert (m.retry, m.origin, m.deliveries, m.error) == (False, None, 1, None)
    assert address_of(m) == ("orders", 0, 5)


def test_a_retry_copy_looks_like_its_origin_and_remembers_its_address() -> None:
    copy = _message(retry_topic("billing"), 12, RETRY_HEADERS)
    assert copy.retry and copy.deliveries == 2  # as stored: two failed deliveries
    m = redelivered(copy)
    assert isinstance(m, RetryMessage) and isinstance(m, Message)
    assert (m.topic, m.queue_id, m.offset) == ("orders", 3, 41)
    assert m.origin == Origin("orders", 3, 41, "b1-0000000000000007")
    assert m.deliveries == 3  # this delivery counts
    assert m.error == "boom" and m.header("app") == b"x"
    assert m.message_id == copy.message_id  # the copy's: Admin.get_message finds it
    assert address_of(m) == ("%RETRY%billing", 0, 12)  # what nack names
    again = pickle.loads(pickle.dumps(m))
    assert again == m and address_of(again) == address_of(m)
    assert redelivered(_message(retry_topic("billing"), 1)) == _message(retry_topic("billing"), 1)


def test_topic_names_and_reconsume_limits() -> None:
    assert (retry_topic("g"), dlq_topic("g")) == ("%RETRY%g", "%DLQ%g")
    assert check_reconsume_times(None) == 0 and check_reconsume_times(3) == 3
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(ValueError, match="max_reconsume_times"):
            check_reconsume_times(bad)  # type: ignore[arg-type]


# -- the CLI's and the sink's checks ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["produce", "t", "--delay", "5x"], "not a duration"),
        (["produce", "t", "--deliver-at", "soon"], "ISO 8601"),
        (["produce", "t", "--delay", "99999999999999999999"], "longer than any broker"),
        (["produce", "t", "--deliver-at", "0001-01-01T00:00:00Z"], "out of range"),
        (["produce", "t", "--delay", "5s", "--deliver-at", "2027-01-01"], "not allowed with"),
        (["dlq", "resend", "g"], "one of the arguments --ids --all is required"),
        (["dlq", "resend", "g", "--ids", "a", "--all"], "not allowed with"),
        (["message", "cancel"], "the following arguments are required: ID"),
    ],
)
def test_cli_usage_errors(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--broker", "127.0.0.1:1", *argv]) == 2
    assert says in capsys.readouterr().err


def test_sink_deliver_at_column() -> None:
    stamps = pa.array([NOW * 1000 + 7, None, (NOW + 5) * 1000], pa.timestamp("us", tz="UTC"))
    batch = pa.record_batch({"value": pa.array([b"a", b"b", b"c"]), "deliver_at": stamps})
    due = list(build_produce("t", batch).deliver_at_ms)
    assert due[0] == NOW and due[2] == NOW + 5 and due[1] > NOW - 10**12  # null: now
    nulls = pa.record_batch(
        {"value": pa.array([b"a"]), "deliver_at": pa.array([None], pa.timestamp("us"))}
    )
    assert list(build_produce("t", nulls).deliver_at_ms) == []
    check_schema({"value": "binary", "deliver_at": "timestamp"}, "t")
    with pytest.raises(InvalidRequest, match="delivery=at_least_once"):
        check_schema({"value": "binary", "deliver_at": "timestamp"}, "t", exactly_once=True)
    with pytest.raises(InvalidRequest, match="column deliver_at has type string"):
        check_schema({"value": "binary", "deliver_at": "string"}, "t")
