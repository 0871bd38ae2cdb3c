"""The connector's pyspark-free logic: option parsing and offset arithmetic."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from equeue_spark.spark.errors import InvalidOption, OffsetsLostError
from equeue_spark.spark.offsets import (
    from_json,
    incarnations,
    rate_limit,
    split_budget,
    split_range,
    to_json,
)
from equeue_spark.spark.options import EARLIEST, ReadOptions, WriteOptions, headers_requested


def test_offsets_json_is_canonical() -> None:
    offsets = {("b", 10): 5, ("a", 2): 1, ("b", 9): 7, ("a", 10): 3}
    text = json.dumps(to_json(offsets))
    # Spark compares offsets as JSON text: order must not depend on insertion.
    assert text == '{"a": {"2": 1, "10": 3}, "b": {"9": 7, "10": 5}}'
    assert json.dumps(to_json(dict(reversed(offsets.items())))) == text
    assert from_json(json.loads(text)) == offsets


def test_offsets_json_carries_incarnations_and_reads_old_offsets() -> None:
    offsets = {("b", 10): 5, ("a", 2): 1, ("b", 9): 7}
    text = json.dumps(to_json(offsets, {"b": 2**63 - 1, "a": 0, "gone": 4}))
    # After the queues, only for topics with offsets and a known incarnation.
    assert text == '{"a": {"2": 1}, "b": {"9": 7, "10": 5, "incarnation": 9223372036854775807}}'
    assert from_json(json.loads(text)) == offsets
    assert incarnations(json.loads(text)) == {"b": 2**63 - 1}
    old = json.loads('{"a": {"2": 1}, "b": {"9": 7, "10": 5}}')  # before incarnations
    assert from_json(old) == offsets and incarnations(old) == {}


def test_rate_limit_is_proportional_and_never_starves() -> None:
    starts = {("t", 0): 0, ("t", 1): 100, ("t", 2): 7}
    ends = {("t", 0): 1000, ("t", 1): 103, ("t", 2): 7}
    capped = rate_limit(100, starts, ends)
    assert capped[("t", 0)] == 0 + 100 * 1000 // 1003
    assert capped[("t", 1)] == 101  # a share below one record still gets one
    assert capped[("t", 2)] == 7
    assert rate_limit(5000, starts, ends) == ends


def test_budget_and_range_splits() -> None:
    starts = {("t", 0): 0, ("t", 1): 0}
    assert split_budget(1000, starts, {("t", 0): 30, ("t", 1): 10}) == {
        ("t", 0): 750,
        ("t", 1): 250,
    }
    assert split_range(5, 20, 7) == [(5, 12), (12, 19), (19, 20)]
    assert split_range(5, 5, 7) == [] and split_range(0, 9, None) == [(0, 9)]


def test_read_options_defaults_and_parsing() -> None:
    streaming = ReadOptions.parse({"topic": "a, b"}, streaming=True)
    assert streaming.topics == ("a", "b") and streaming.starting == "latest"
    assert streaming.fail_on_data_loss and streaming.max_trigger_delay_ms == 15 * 60_000
    batch = ReadOptions.parse({"TOPIC": "a", "maxtriggerdelay": "30s"}, streaming=False)
    assert batch.starting == "earliest" and batch.max_trigger_delay_ms == 30_000
    spec = ReadOptions.parse({"topic": "a", "startingoffsets": '{"a": {"0": -2, "3": 9}}'},
                             streaming=True).starting  # fmt: skip
    assert spec == {"a": {0: EARLIEST, 3: 9}}
    tags = ReadOptions.parse({"topicpattern": "x.*", "tags": "a | b"}, streaming=True)
    assert tags.tags == ("a", "b") and tags.topic_pattern is not None


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"topic": "a", "timeoutms": "0"}, "timeoutMs='0': must be between 1"),
        ({"topic": "a", "startingoffsets": '{"a": {"x": 1}}'}, "queue id 'x'"),
        ({"topic": "a", "startingoffsets": '{"a": {"0": -3}}'}, "offset -3 of a/0"),
        ({"topic": "a", "startingoffsets": "[1]"}, "must be a JSON object"),
        ({"topic": "a,,b"}, "an empty topic name"),
        ({"topic": "a", "tags": "a||b"}, "an empty tag"),
        ({"topic": "a", "startingtimestamp": "1", "startingoffsets": "earliest"}, "not both"),
        ({"topic": "a", "groupfallback": "middle"}, "groupFallback='middle'"),
    ],
)
def test_read_option_errors(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidOption, match=fragment.replace("[", r"\[")):
        ReadOptions.parse(options, streaming=True)


def test_headers_requested_parses_as_read_options_do() -> None:
    """The schema (asked for before any reader) and ReadOptions agree on includeHeaders."""
    assert headers_requested({"IncludeHeaders": " TRUE "}) is True
    assert headers_requested({"includeHeaders": "false"}) is False
    assert headers_requested({"topic": "t"}) is False
    with pytest.raises(InvalidOption, match="includeHeaders='yes': must be true or false"):
        headers_requested({"includeheaders": "yes"})
    with pytest.raises(InvalidOption, match="includeHeaders='yes'"):
        ReadOptions.parse({"topic": "a", "includeheaders": "yes"}, streaming=True)


def test_write_options() -> None:
    assert WriteOptions.parse({"topic": "t", "batchsize": "100"}).batch_size == 100
    with pytest.raises(InvalidOption, match="unknown option 'startingoffsets'"):
        WriteOptions.parse({"topic": "t", "startingoffsets": "earliest"})


def test_read_ahead_keeps_order_raises_errors_and_stops() -> None:
    """The read task's read-ahead thread: items in order, the iterator's error
    raised in the consumer after the items before it, and a consumer leaving
    early stops the thread (it would otherwise block on its full queue)."""
    from equeue_spark.spark.read_task import ReadAhead

    def failing() -> Iterator[Any]:
        yield from range(5)
        raise OffsetsLostError("gone")

    ahead: ReadAhead[Any] = ReadAhead(2)
    got: list[Any] = []
    with pytest.raises(OffsetsLostError, match="gone"):
        got.extend(ahead.run(failing()))
    ahead.stop()
    assert got == [0, 1, 2, 3, 4]

    endless: ReadAhead[int] = ReadAhead(2)
    items = endless.run(iter(range(10**9)))
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    endless.stop()
    assert endless._thread is not None and not endless._thread.is_alive()


def test_a_checkpoint_of_the_other_kind_is_refused() -> None:
    from equeue_spark.spark.planning import Planner

    cluster = Planner(ReadOptions.parse({"namesrv": "n:1", "topic": "t"}, streaming=True))
    single = Planner(ReadOptions.parse({"broker": "b:1", "topic": "t"}, streaming=True))
    assert cluster.offsets({"t": {"a/0": 5, "incarnation/a": 9}}) == {("a/t", 0): 5}
    assert single.offsets({"t": {"0": 5, "incarnation": 9}}) == {("t", 0): 5}
    with pytest.raises(InvalidOption, match="written by a query over a single broker"):
        cluster.offsets({"t": {"0": 5}})
    with pytest.raises(InvalidOption, match="written by a query over a cluster"):
        single.offsets({"t": {"a/0": 5}})


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        # Spark lower-cases option names before the source sees them: the error
        # shows the key as received and the nearest option as documented.
        (
            {"topic": "t", "topicpatern": "x"},
            "unknown option 'topicpatern' (value 'x'; Spark passes option names lower-cased);"
            " did you mean 'topicPattern'?",
        ),
        ({"topic": "t", "startingoffset": "earliest"}, "did you mean 'startingOffsets'?"),
        ({"topic": "t", "tokn": "s3cret"}, "unknown option 'tokn' (value <redacted>;"),
        ({"topic": "t", "subscribepatternx": "t.*"}, "did you mean 'subscribePattern'?"),
        (
            {"topic": "t", "kafka.bootstrap.servers": "h:9092"},
            "did you mean 'broker' (equeue's name for Kafka's 'kafka.bootstrap.servers')?",
        ),
        (
            {"topic": "t", "kafka.group.id": "etl"},
            "did you mean 'group' (equeue's name for Kafka's 'kafka.group.id')?",
        ),
        ({"topic": "t", "bogus": "1"}, "the equeue source knows: assign, broker, column"),
    ],
)
def test_unknown_option_names_the_nearest_known_one(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidOption) as caught:
        ReadOptions.parse(options, streaming=True)
    assert fragment in str(caught.value)


def test_unknown_write_option_hints_only_write_options() -> None:
    """The sink has no topicPattern: a Kafka subscribePattern gets no hint to it."""
    with pytest.raises(InvalidOption) as caught:
        WriteOptions.parse({"topic": "t", "subscribepattern": "x"})
    assert "topicPattern" not in str(caught.value)
    with pytest.raises(InvalidOption, match="did you mean 'batchSize'"):
        WriteOptions.parse({"topic": "t", "batchsise": "1"})


def test_timestamp_option_errors_say_which_time_they_compare() -> None:
    for key in ("startingtimestamp", "endingtimestamp"):
        with pytest.raises(InvalidOption, match="compared with the broker's store time"):
            ReadOptions.parse({"topic": "t", key: "yesterday"}, streaming=False)
