"""The connector's pyspark-free logic: option parsing and offset arithmetic."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue_spark.spark.errors import InvalidOption, OffsetsLostError
from equeue_spark.spark.offsets import (
    from_json,
    incarnations,
    min_partition_ranges,
    rate_limit,
    split_budget,
    task_spans,
    to_json,
)
from equeue_spark.spark.options import (
    EARLIEST,
    ReadOptions,
    TimestampSpec,
    WriteOptions,
    headers_requested,
)


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
    # Kafka's double arithmetic (review 29, finding 12): 784 * (2805 / 4620) floors to 475,
    # though 784 * 2805 // 4620 is 476.
    both = {("t", 0): 0, ("t", 1): 0}
    capped = rate_limit(784, both, {("t", 0): 2805, ("t", 1): 4620 - 2805})
    assert capped[("t", 0)] == 475


def test_budget_and_range_splits() -> None:
    starts = {("t", 0): 0, ("t", 1): 0}
    assert split_budget(1000, starts, {("t", 0): 30, ("t", 1): 10}) == {
        ("t", 0): 750,
        ("t", 1): 250,
    }
    # maxRecordsPerPartition: ceil(15 / 7) = 3 near-equal pieces, as Spark 4's Kafka source.
    assert task_spans([(("t", 0), ((5, 20),))], None, 7) == [
        (("t", 0), ((5, 10),)), (("t", 0), ((10, 15),)), (("t", 0), ((15, 20),))
    ]  # fmt: skip
    assert task_spans([(("t", 0), ())], None, 7) == []
    assert task_spans([(("t", 0), ((0, 9),))], None, None) == [(("t", 0), ((0, 9),))]


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
        # Review 29, finding 9: every renamed Kafka option is pointed at ours.
        (
            {"topic": "t", "fetchoffset.retryintervalms": "10"},
            "did you mean 'timeoutMs' (equeue's name for Kafka's 'fetchOffset.retryIntervalMs')?",
        ),
        (
            {"topic": "t", "kafka.ssl.truststore.location": "/x"},
            "equeue's counterpart of Kafka's kafka.ssl options: tlsCa, tlsCert and tlsKey",
        ),
        (
            {"topic": "t", "kafka.ssl.key.password": "s3cret"},
            "(value <redacted>; Spark passes option names lower-cased); equeue's counterpart",
        ),
        ({"topic": "t", "kafka.sasl.mechanism": "PLAIN"}, "kafka.sasl options: token"),
        ({"topic": "t", "kafka.isolation.level": "x"}, "always read committed records"),
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
    for kafka, ours in (("kafka.batch.size", "batchSize"), ("kafka.acks", "delivery"),
                        ("kafka.enable.idempotence", "enableIdempotence")):  # fmt: skip
        with pytest.raises(InvalidOption, match=f"did you mean '{ours}' .*'{kafka}'"):
            WriteOptions.parse({"topic": "t", kafka.lower(): "1"})


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"assign": '{" o ": [0]}'}, "' o ' is not a topic name"),
        ({"assign": '{"o": [0], "o": [1]}'}, "'o' is given twice"),
        ({"assign": '{"o": [4294967296]}'}, "queue 4294967296 of 'o' is not a queue id"),
        ({"topic": "o", "startingoffsets": '{"o": {"0": 1, "0": 2}}'}, "'0' is given twice"),
        ({"topic": "o", "startingoffsetsbytimestamp": '{"o": {}}'}, "must map queue ids to"),
        ({"topic": "o", "minpartitions": "1_0"}, "minPartitions='1_0': not an integer"),
        ({"topic": "o", "minpartitions": "\uff11\uff10"}, "not an integer"),
        # The option Kafka's precedence ignores is checked too.
        (
            {"topic": "o", "startingtimestamp": "7", "startingoffsetsbytimestamp": "junk"},
            "startingOffsetsByTimestamp='junk': must be a JSON object",
        ),
    ],
)
def test_option_json_and_integers_are_strict(options: dict[str, str], fragment: str) -> None:
    """Review 29, finding 10."""
    with pytest.raises(InvalidOption) as caught:
        ReadOptions.parse(options, streaming=False)
    assert fragment in str(caught.value)


def test_a_strategy_without_a_timestamp_option_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="equeue.spark"):
        ReadOptions.parse({"topic": "o", "startingOffsetsByTimestampStrategy": "error"},
                          streaming=False)  # fmt: skip
    assert "startingOffsetsByTimestampStrategy=error has no effect without" in caplog.text


def test_timestamp_option_errors_say_which_time_they_compare() -> None:
    for key in ("startingtimestamp", "endingtimestamp"):
        with pytest.raises(InvalidOption, match="compared with the broker's store time"):
            ReadOptions.parse({"topic": "t", key: "yesterday"}, streaming=False)


# -- Spark Kafka source names (issue 29) ----------------------------------------------


def test_subscribe_and_subscribe_pattern_are_topic_and_topic_pattern() -> None:
    assert ReadOptions.parse({"subscribe": "a, b"}, streaming=True).topics == ("a", "b")
    pattern = ReadOptions.parse({"subscribePattern": "a.*"}, streaming=True).topic_pattern
    assert pattern is not None and pattern.pattern == "a.*"
    with pytest.raises(InvalidOption, match="give topic or subscribe, not both"):
        ReadOptions.parse({"subscribe": "a", "topic": "b"}, streaming=True)
    with pytest.raises(InvalidOption, match="give topicPattern or subscribePattern, not both"):
        ReadOptions.parse({"subscribepattern": "a", "topicpattern": "b"}, streaming=True)
    # Errors name the spelling the user wrote.
    with pytest.raises(InvalidOption, match="option subscribe='a,,b': an empty topic name"):
        ReadOptions.parse({"subscribe": "a,,b"}, streaming=True)


def test_assign_reads_exactly_the_named_queues() -> None:
    one = ReadOptions.parse({"assign": '{"orders": [0, "1"], "audit": [3]}'}, streaming=False)
    assert one.assigned == {"orders": frozenset({0, 1}), "audit": frozenset({3})}
    assert one.topics == ("orders", "audit") and one.topic_pattern is None
    cluster = ReadOptions.parse(
        {"namesrv": "n:1", "assign": '{"orders": ["a/0", "b/1", "b/2"]}'}, streaming=True
    )
    assert cluster.assigned == {"a/orders": frozenset({0}), "b/orders": frozenset({1, 2})}
    spec = ReadOptions.parse(
        {"assign": '{"orders": [0, 1]}', "startingoffsets": '{"orders": {"1": 7}}'},
        streaming=False,
    ).starting
    assert spec == {"orders": {1: 7}}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"assign": '{"o": [0]}', "topic": "o"}, "give exactly one of the options topic or"),
        ({"assign": '{"o": [0]}', "subscribepattern": "o"}, "subscribePattern='o', assign="),
        ({}, "got none"),
        ({"assign": "[0]"}, 'must be a JSON object like {"orders": [0, 1]}'),
        ({"assign": '{"o": []}'}, "topic 'o' must map to a list of queue ids"),
        ({"assign": '{"o": ["x"]}'}, "queue 'x' of 'o' is not a queue id"),
        ({"assign": '{"o": [-1]}'}, "queue -1 of 'o' is not a queue id"),
        ({"assign": '{"o": ["/1"]}'}, "queue '/1' of 'o' is not a queue id"),
        (
            {"assign": '{"o": [0]}', "startingoffsets": '{"o": {"1": 5}}'},
            "queue 1 of 'o' is not among the assigned queues",
        ),
        (
            {"assign": '{"o": [0]}', "startingoffsetsbytimestamp": '{"o": {"1": 5}}'},
            "queue 1 of 'o' is not among the assigned queues",
        ),
        # Queues named for the other kind of query (review 29, finding 3).
        (
            {"assign": '{"o": ["a/0"]}'},
            "assign='{\"o\": [\"a/0\"]}': queue \"a/0\" of 'o' names broker group 'a', but "
            "the query reads one broker (option broker): write the queue id alone, e.g. 0",
        ),
        (
            {"namesrv": "n:1", "assign": '{"o": [0]}'},
            "queue 0 of 'o' names no broker group, but the query reads a cluster (option "
            'namesrv or the driver $EQUEUE_NAMESRV): write "BROKER/QUEUE", e.g. "a/0"',
        ),
        ({"namesrv": "n:1", "assign": '{"o": ["a/0", 1]}'}, "queue 1 of 'o' names no broker"),
        ({"topic": "o", "startingoffsets": '{"o": {"b/1": 5}}'}, "names broker group 'b'"),
        (
            {"namesrv": "n:1", "topic": "o", "startingoffsetsbytimestamp": '{"o": {"2": 5}}'},
            'startingOffsetsByTimestamp=\'{"o": {"2": 5}}\': queue "2" of \'o\' names no '
            "broker group",
        ),
        # Times beyond startingTimestamp's bound (finding 4).
        (
            {"topic": "o", "startingoffsetsbytimestamp": '{"o": {"0": 9223372036854775808}}'},
            'startingOffsetsByTimestamp=\'{"o": {"0": 9223372036854775808}}\': time '
            "9223372036854775808 of o/0 must be between 0 and 4611686018427387904 (ms since",
        ),
        (
            {"topic": "o", "endingoffsetsbytimestamp": '{"o": {"0": 4611686018427387905}}'},
            "endingOffsetsByTimestamp=",
        ),
        ({"topic": "o", "endingoffsetsbytimestamp": '{"o": {"0": 1e23}}'}, "must be an integer"),
        (
            {"topic": "o", "startingoffsetsbytimestamp": '{"p": {"0": 5}}'},
            "topic 'p' is not one the query reads",
        ),
        ({"topic": "o", "startingoffsetsbytimestamp": "latest"}, "must be a JSON object"),
        (
            {"topic": "o", "startingoffsetsbytimestamp": '{"o": {"0": -1}}'},
            "time -1 of o/0 must be an integer >= 0",
        ),
        (
            {"topic": "o", "startingoffsetsbytimestampstrategy": "fail"},
            "startingOffsetsByTimestampStrategy='fail': must be error or latest",
        ),
        ({"topic": "o", "minpartitions": "0"}, "minPartitions='0': must be between 1 and 100000"),
        ({"topic": "o", "minpartitions": "100001"}, "between 1 and 100000"),
        ({"topic": "o", "minpartitions": "many"}, "minPartitions='many': not an integer"),
    ],
)
def test_kafka_option_errors(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidOption) as caught:
        ReadOptions.parse(options, streaming=False)
    assert fragment in str(caught.value)


def test_ending_offsets_by_timestamp_is_batch_only() -> None:
    with pytest.raises(InvalidOption, match=r"endingOffsetsByTimestamp=.*only batch reads"):
        ReadOptions.parse(
            {"topic": "o", "endingoffsetsbytimestamp": '{"o": {"0": 5}}'}, streaming=True
        )


def test_by_timestamp_options_parse_to_timestamp_specs() -> None:
    batch = ReadOptions.parse(
        {
            "topic": "o",
            "startingOffsetsByTimestamp": '{"o": {"0": 1767225600000}}',
            "startingOffsetsByTimestampStrategy": "ERROR",
            "endingOffsetsByTimestamp": '{"o": {"1": 1767225600001}}',
            "minPartitions": "10",
        },
        streaming=False,
    )
    assert batch.starting == TimestampSpec({"o": {0: 1767225600000}}, "error", "earliest")
    assert batch.ending == TimestampSpec(
        {"o": {1: 1767225600001}}, "latest", "latest", "endingOffsetsByTimestamp"
    )
    assert batch.timestamp_strategy == "error" and batch.min_partitions == 10
    # Default strategy latest (Kafka's is error: docs/spark.md says why); with a
    # group, the queues the JSON leaves out start at the group's offsets.
    grouped = ReadOptions.parse(
        {"topic": "o", "group": "g", "startingOffsetsByTimestamp": '{"o": {"0": 5}}'},
        streaming=True,
    )
    assert grouped.starting == TimestampSpec({"o": {0: 5}}, "latest", "group")


@pytest.mark.parametrize(
    ("options", "starting", "warning"),
    [
        (
            {"startingtimestamp": "5", "startingoffsets": "earliest"},
            "earliest",
            "startingTimestamp wins (Kafka's precedence: startingTimestamp > "
            "startingOffsetsByTimestamp > startingOffsets); startingOffsets is ignored",
        ),
        (
            {"startingtimestamp": "5", "startingoffsetsbytimestamp": '{"o": {"0": 1}}'},
            "latest",
            "options startingTimestamp and startingOffsetsByTimestamp both given: "
            "startingTimestamp wins",
        ),
        (
            {"startingoffsetsbytimestamp": '{"o": {"0": 1}}', "startingoffsets": "earliest"},
            TimestampSpec({"o": {0: 1}}, "latest", "earliest"),
            "startingOffsets applies only to the queues startingOffsetsByTimestamp leaves out",
        ),
    ],
)
def test_starting_precedence_is_kafkas_with_one_warning(
    options: dict[str, str], starting: Any, warning: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="equeue.spark"):
        parsed = ReadOptions.parse({"topic": "o", **options}, streaming=True)
    assert parsed.starting == starting
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warning in warnings[0]


def test_ending_precedence_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="equeue.spark"):
        parsed = ReadOptions.parse(
            {
                "topic": "o",
                "endingtimestamp": "9",
                "endingoffsetsbytimestamp": '{"o": {"0": 1}}',
                "endingoffsets": '{"o": {"0": 3}}',
            },
            streaming=False,
        )
    assert parsed.ending_timestamp_ms == 9
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "options endingTimestamp and endingOffsetsByTimestamp and endingOffsets both given: "
        "endingTimestamp wins (Kafka's precedence: endingTimestamp > endingOffsetsByTimestamp "
        "> endingOffsets); endingOffsetsByTimestamp and endingOffsets are ignored"
    ]


# -- minPartitions: Kafka's KafkaOffsetRangeCalculator.getRanges ----------------------


def _kafka_get_ranges(
    ranges: list[tuple[Any, int, int]], min_partitions: int | None
) -> list[tuple[Any, int, int]]:
    """A line-by-line transcription of Spark's Scala (KafkaOffsetRangeCalculator,
    apache/spark connector/kafka-0-10-sql), kept apart from the implementation."""
    offset_ranges = [r for r in ranges if r[2] - r[1] > 0]
    if min_partitions is None or len(offset_ranges) >= min_partitions:
        return offset_ranges

    def get_part_count(size: int, total_size: int, min_parts: int) -> int:
        return max(math.floor(float(size) / total_size * min_parts + 0.5), 1)

    total_size = sum(r[2] - r[1] for r in offset_ranges)
    unsplit_ranges = [
        r for r in offset_ranges if get_part_count(r[2] - r[1], total_size, min_partitions) == 1
    ]
    unsplit_range_total_size = sum(r[2] - r[1] for r in unsplit_ranges)
    split_range_total_size = total_size - unsplit_range_total_size
    unsplit_range_topic_partitions = {r[0] for r in unsplit_ranges}
    split_range_min_partitions = max(min_partitions - len(unsplit_ranges), 1)
    out = []
    for tp, from_offset, until_offset in offset_ranges:
        size = until_offset - from_offset
        if tp in unsplit_range_topic_partitions:
            parts = 1
        else:
            parts = get_part_count(size, split_range_total_size, split_range_min_partitions)
        remaining = size
        start_offset = from_offset
        for part in range(parts):
            this_partition = remaining // (parts - part)
            remaining -= this_partition
            end_offset = min(start_offset + this_partition, until_offset)
            out.append((tp, start_offset, end_offset))
            start_offset = end_offset
    return [r for r in out if r[2] - r[1] > 0]


def test_min_partitions_matches_kafkas_examples() -> None:
    equal = [(("t", q), 0, 100) for q in range(4)]
    assert len(min_partition_ranges(equal, 10)) == 12  # round(2.5) = 3 each
    skewed = [(("t", 0), 0, 700)] + [(("t", q), 0, 100) for q in range(1, 4)]
    split = min_partition_ranges(skewed, 10)
    assert [r for r in split if r[0] == ("t", 0)] == [
        (("t", 0), lo, lo + 100) for lo in range(0, 700, 100)
    ]
    assert len(split) == 10
    assert min_partition_ranges(equal, 4) == equal and min_partition_ranges(equal, None) == equal
    # Python's round(2.5) is 2: Scala's math.round is half up.
    assert len(min_partition_ranges([(("t", 0), 0, 5), (("t", 1), 0, 5)], 5)) == 6


_RANGES = st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)), min_size=0, max_size=12
).map(lambda rs: [(("t", i), lo, lo + size) for i, (lo, size) in enumerate(rs)])


@given(ranges=_RANGES, min_partitions=st.one_of(st.none(), st.integers(1, 200)))
def test_min_partition_ranges_is_kafkas_algorithm(
    ranges: list[tuple[Any, int, int]], min_partitions: int | None
) -> None:
    got = min_partition_ranges(ranges, min_partitions)
    assert got == _kafka_get_ranges(ranges, min_partitions)  # offsets, counts and order
    for key, lo, hi in ranges:  # every range covered exactly: no gaps, no overlaps
        pieces = [(a, b) for k, a, b in got if k == key]
        assert all(a < b for a, b in pieces)
        assert pieces == sorted(pieces)
        covered = [o for a, b in pieces for o in (a, b)]
        assert covered[:1] + covered[-1:] == ([lo, hi] if hi > lo else [])
        assert all(covered[i] == covered[i + 1] for i in range(1, len(covered) - 1, 2))
    nonempty = sum(1 for _, lo, hi in ranges if hi > lo)
    if min_partitions is not None:  # about min_partitions (Kafka's rounding), never fewer ranges
        total = sum(hi - lo for _, lo, hi in ranges)
        assert len(got) >= min(nonempty, min_partitions, total)


def _kafka_divided(ranges: list[tuple[Any, int, int]], max_records: int | None) -> list[Any]:
    """Spark 4's first stage (SPARK-49259): a range longer than
    maxRecordsPerPartition in ceil(size / max) pieces of Kafka's division."""
    if not max_records:
        return [r for r in ranges if r[2] > r[1]]
    out = []
    for tp, lo, hi in ranges:
        if hi - lo > max_records:
            parts = -(-(hi - lo) // max_records)
            out.extend(_kafka_get_ranges([(tp, lo, hi)], parts))  # one range in parts pieces
        elif hi > lo:
            out.append((tp, lo, hi))
    return out


def test_max_records_and_min_partitions_match_sparks_suite() -> None:
    """The cases of Spark's KafkaOffsetRangeCalculatorSuite (SPARK-49259)."""

    def tasks(ranges: list[tuple[int, int, int]], low: int | None, high: int | None) -> list[Any]:
        given = [(("t", q), ((lo, hi),)) for q, lo, hi in ranges]
        return [(k[1], spans[0][0], spans[-1][1]) for k, spans in task_spans(given, low, high)]

    assert tasks([(1, 1, 5)], None, 4) == [(1, 1, 5)]
    assert tasks([(1, 1, 6)], None, 4) == [(1, 1, 3), (1, 3, 6)]
    assert tasks([(1, 1, 40), (2, 1, 50), (3, 1, 60)], None, 20) == [
        (1, 1, 20), (1, 20, 40), (2, 1, 17), (2, 17, 33), (2, 33, 50),
        (3, 1, 20), (3, 20, 40), (3, 40, 60),
    ]  # fmt: skip
    assert tasks([(1, 1, 40)], 1, 20) == [(1, 1, 20), (1, 20, 40)]
    assert tasks([(1, 1, 40)], 4, 20) == [(1, 1, 10), (1, 10, 20), (1, 20, 30), (1, 30, 40)]
    # The review's cases: 10 records, max 4 -> 3/3/4; 9000/900/10, max 3000, min 6 -> 5 tasks.
    assert tasks([(0, 0, 10)], None, 4) == [(0, 0, 3), (0, 3, 6), (0, 6, 10)]
    assert len(tasks([(0, 0, 9000), (1, 0, 900), (2, 0, 10)], 6, 3000)) == 5


@given(
    ranges=_RANGES,
    min_partitions=st.one_of(st.none(), st.integers(1, 50)),
    max_records=st.one_of(st.none(), st.integers(1, 5000)),
)
def test_task_spans_is_spark_4s_kafka_split(
    ranges: list[tuple[Any, int, int]], min_partitions: int | None, max_records: int | None
) -> None:
    """One span per queue: exactly Spark 4's two stages (maxRecordsPerPartition,
    then minPartitions on the pieces); every piece within the limit."""
    got = task_spans([(k, ((lo, hi),) if hi > lo else ()) for k, lo, hi in ranges],
                     min_partitions, max_records)  # fmt: skip
    flat = [(k, spans[0][0], spans[-1][1]) for k, spans in got]
    assert all(len(spans) == 1 for _, spans in got)
    assert flat == _kafka_get_ranges(_kafka_divided(ranges, max_records), min_partitions)
    assert all(0 < hi - lo <= (max_records or hi - lo) for _, lo, hi in flat)


_SPANS = st.lists(st.tuples(st.integers(0, 50), st.integers(1, 50)), max_size=8).map(
    lambda gaps: tuple(
        (sum(g + s for g, s in gaps[:i]) + gaps[i][0], sum(g + s for g, s in gaps[: i + 1]))
        for i in range(len(gaps))
    )
)


@given(
    queues=st.lists(_SPANS, max_size=5),
    min_partitions=st.one_of(st.none(), st.integers(1, 40)),
    max_records=st.one_of(st.none(), st.integers(1, 60)),
)
def test_task_spans_after_pushdown_keep_every_offset_once(
    queues: list[tuple[tuple[int, int], ...]], min_partitions: int | None, max_records: int | None
) -> None:
    """Spans left by pushed-down filters: the pieces hold every offset read
    exactly once, at most maxRecordsPerPartition each, and as many tasks as the
    same number of records in one span would get (minPartitions counts what is read)."""
    given = [(("t", q), spans) for q, spans in enumerate(queues)]
    got = task_spans(given, min_partitions, max_records)
    for key, spans in given:
        read = [o for k, cut in got if k == key for lo, hi in cut for o in range(lo, hi)]
        assert read == [o for lo, hi in spans for o in range(lo, hi)]
    assert all(0 < sum(hi - lo for lo, hi in cut) <= (max_records or 10**9) for _, cut in got)
    sizes = [(k, ((0, sum(hi - lo for lo, hi in spans)),)) for k, spans in given]
    assert len(got) == len(task_spans(sizes, min_partitions, max_records))
