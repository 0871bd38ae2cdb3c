"""Spark filter pushdown: the mapping of Spark's filters (fast, no session),
the reader Spark gets, planning against a real broker, and real queries whose
pushed-down results equal Spark's own evaluation."""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringStartsWith,
)
from pyspark.sql.types import StructType

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.errors import NotFoundError
from equeue_spark.spark.errors import InvalidOption
from equeue_spark.spark.options import ReadOptions
from equeue_spark.spark.pushdown import (
    CONF,
    MAX_SPANS,
    PLANNER_MODULE,
    Names,
    Pushdown,
    push,
)
from tests.support.waits import wait_for

BIG = 2**63
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
MS0 = 1_767_225_600_000
"""T0 in ms since the epoch."""


def at(us: int) -> dt.datetime:
    """T0 plus ``us`` microseconds (Spark hands timestamps over as aware datetimes)."""
    return T0 + dt.timedelta(microseconds=us)


def options(**extra: str) -> ReadOptions:
    raw = {"broker": "127.0.0.1:5000", "topic": "t", **extra}
    if "namesrv" in raw:
        del raw["broker"]
    return ReadOptions.parse(raw, streaming=False)


def col(name: str) -> tuple[str, ...]:
    return (name,)


# (filter, Pushdown field, the field's value once the filter is taken)
TAKEN: list[tuple[Filter, str, Any]] = [
    (EqualTo(col("queue"), 1), "queues", ((1, 2),)),
    (In(col("queue"), (3, 1, 2)), "queues", ((1, 4),)),
    (In(col("queue"), [1, 3]), "queues", ((1, 2), (3, 4))),  # type: ignore[arg-type]  # a list arrived in a run
    (LessThan(col("queue"), 2), "queues", ((0, 2),)),
    (LessThanOrEqual(col("queue"), 2), "queues", ((0, 3),)),
    (GreaterThan(col("queue"), 2), "queues", ((3, BIG),)),
    (GreaterThanOrEqual(col("queue"), 2), "queues", ((2, BIG),)),
    (Not(EqualTo(col("queue"), 2)), "queues", ((0, 2), (3, BIG))),
    (Not(In(col("queue"), (2, 3))), "queues", ((0, 2), (4, BIG))),
    (Not(GreaterThan(col("queue"), 2)), "queues", ((0, 3),)),
    (LessThan(col("queue"), -1), "queues", ()),
    (EqualTo(col("offset"), 7), "offsets", ((7, 8),)),
    (In(col("offset"), (5, 6, 7, 10)), "offsets", ((5, 8), (10, 11))),
    (GreaterThanOrEqual(col("offset"), 1000), "offsets", ((1000, BIG),)),
    (GreaterThan(col("offset"), -5), "offsets", ((0, BIG),)),
    (LessThan(col("offset"), 3000), "offsets", ((0, 3000),)),
    (LessThanOrEqual(col("offset"), 3000), "offsets", ((0, 3001),)),
    (Not(EqualTo(col("offset"), 0)), "offsets", ((1, BIG),)),
    (EqualTo(col("topic"), "a"), "topics", Names(frozenset({"a"}))),
    (In(col("topic"), ("a", "b")), "topics", Names(frozenset({"a", "b"}))),
    (Not(EqualTo(col("topic"), "a")), "topics", Names(None, frozenset({"a"}))),
    (Not(In(col("topic"), ("a", "b"))), "topics", Names(None, frozenset({"a", "b"}))),
    # storeTimestamp: [lo, hi) in whole ms; a row's time is ms * 1000 us.
    (GreaterThan(col("storeTimestamp"), at(0)), "store_ms", (MS0 + 1, None)),
    (GreaterThan(col("storeTimestamp"), at(1)), "store_ms", (MS0 + 1, None)),
    (GreaterThan(col("storeTimestamp"), at(-1)), "store_ms", (MS0, None)),
    (GreaterThanOrEqual(col("storeTimestamp"), at(0)), "store_ms", (MS0, None)),
    (GreaterThanOrEqual(col("storeTimestamp"), at(1)), "store_ms", (MS0 + 1, None)),
    (GreaterThanOrEqual(col("storeTimestamp"), at(-999)), "store_ms", (MS0, None)),
    (LessThan(col("storeTimestamp"), at(0)), "store_ms", (None, MS0)),
    (LessThan(col("storeTimestamp"), at(1)), "store_ms", (None, MS0 + 1)),
    (LessThan(col("storeTimestamp"), at(-1)), "store_ms", (None, MS0)),
    (LessThanOrEqual(col("storeTimestamp"), at(0)), "store_ms", (None, MS0 + 1)),
    (LessThanOrEqual(col("storeTimestamp"), at(999)), "store_ms", (None, MS0 + 1)),
    (LessThanOrEqual(col("storeTimestamp"), at(-1)), "store_ms", (None, MS0)),
    (EqualTo(col("storeTimestamp"), at(0)), "store_ms", (MS0, MS0 + 1)),
    (Not(LessThan(col("storeTimestamp"), at(0))), "store_ms", (MS0, None)),
    # timestamp (producer time): a broker expression, the same rounding.
    (GreaterThan(col("timestamp"), at(0)), "selector", f"timestamp >= {MS0 + 1}"),
    (GreaterThan(col("timestamp"), at(1500)), "selector", f"timestamp >= {MS0 + 2}"),
    (GreaterThanOrEqual(col("timestamp"), at(0)), "selector", f"timestamp >= {MS0}"),
    (GreaterThanOrEqual(col("timestamp"), at(1)), "selector", f"timestamp >= {MS0 + 1}"),
    (LessThan(col("timestamp"), at(0)), "selector", f"timestamp < {MS0}"),
    (LessThan(col("timestamp"), at(1)), "selector", f"timestamp < {MS0 + 1}"),
    (LessThanOrEqual(col("timestamp"), at(0)), "selector", f"timestamp < {MS0 + 1}"),
    (LessThanOrEqual(col("timestamp"), at(-1)), "selector", f"timestamp < {MS0}"),
    (EqualTo(col("timestamp"), at(0)), "selector", f"timestamp = {MS0}"),
    (Not(EqualTo(col("timestamp"), at(0))), "selector", f"timestamp <> {MS0}"),
    (Not(EqualTo(col("timestamp"), at(1))), "selector", ""),  # every row passes
    (
        In(col("timestamp"), (at(0), at(1), at(2000))),
        "selector",
        f"timestamp IN ({MS0}, {MS0 + 2})",
    ),
    (Not(In(col("timestamp"), (at(0), at(3)))), "selector", f"timestamp NOT IN ({MS0})"),
    (
        LessThan(col("timestamp"), dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, dt.UTC)),
        "selector",
        "timestamp < 0",
    ),
    # tag: equality through the broker's tag filter; Spark's "" is the selector's NULL
    (EqualTo(col("tag"), "a"), "tags", ("a",)),
    (In(col("tag"), ("b", "a")), "tags", ("a", "b")),
    (EqualTo(col("tag"), ""), "selector", "tag IS NULL"),
    (In(col("tag"), ("a", "")), "selector", "(tag IS NULL OR tag IN ('a'))"),
    (Not(EqualTo(col("tag"), "a")), "selector", "(tag IS NULL OR tag NOT IN ('a'))"),
    (Not(EqualTo(col("tag"), "")), "selector", "tag IS NOT NULL"),
    (Not(In(col("tag"), ("", "o'k"))), "selector", "(tag IS NOT NULL AND tag NOT IN ('o''k'))"),
    # key: the selector, and the keys of an equality for the key index
    (EqualTo(col("key"), b"k"), "selector", "key = X'6b'"),
    (EqualTo(col("key"), b"k"), "keys", (b"k",)),
    (In(col("key"), (b"\x00\xff", b"k")), "selector", "key IN (X'00ff', X'6b')"),
    (Not(EqualTo(col("key"), b"k")), "selector", "key <> X'6b'"),
    (Not(In(col("key"), (b"k",))), "selector", "key NOT IN (X'6b')"),
    (IsNull(col("key")), "selector", "key IS NULL"),
    (IsNotNull(col("key")), "selector", "key IS NOT NULL"),
    (Not(IsNull(col("key"))), "selector", "key IS NOT NULL"),
]

EMPTY: list[Filter] = [
    EqualTo(col("storeTimestamp"), at(5)),
    EqualTo(col("timestamp"), at(5)),
    In(col("timestamp"), (at(5), at(6))),
    IsNull(col("queue")),
    IsNull(col("tag")),
    Not(IsNotNull(col("offset"))),
]

NOTHING_TO_DO: list[Filter] = [IsNotNull(col(c)) for c in (
    "topic", "queue", "offset", "timestamp", "tag", "message_id", "broker",
    "timestampType", "storeTimestamp", "headers",
)]  # fmt: skip

RETURNED: list[Filter] = [
    EqualTo(col("value"), b"x"),
    IsNotNull(col("value")),  # never pushed: decoded, a value may be null
    IsNull(col("value")),
    EqualTo(col("valueSchemaVersion"), 1),
    EqualTo(col("message_id"), "m"),
    IsNotNull(col("nosuch")),
    EqualNullSafe(col("queue"), 1),
    StringStartsWith(col("topic"), "a"),
    Not(StringContains(col("tag"), "a")),
    EqualTo(("headers", "key"), "x"),
    EqualTo(col("queue"), "1"),
    EqualTo(col("queue"), True),
    EqualTo(col("offset"), 1.5),
    EqualTo(col("offset"), None),
    In(col("queue"), (1, None)),
    In(col("offset"), ()),
    In(col("offset"), tuple(range(1001))),
    EqualTo(col("topic"), b"t"),
    GreaterThan(col("topic"), "a"),
    EqualTo(col("broker"), "b"),  # one broker: the column holds its id
    GreaterThanOrEqual(col("timestamp"), dt.datetime(2026, 1, 1)),  # naive
    GreaterThanOrEqual(col("timestamp"), dt.date(2026, 1, 1)),
    GreaterThanOrEqual(col("timestamp"), MS0),
    Not(EqualTo(col("storeTimestamp"), at(0))),
    In(col("storeTimestamp"), (at(0),)),
    GreaterThan(col("key"), b"a"),
    EqualTo(col("key"), "k"),
    EqualTo(col("tag"), 1),
    GreaterThan(col("tag"), "a"),
    EqualTo(col("timestampType"), 0),
]


def _id(value: object) -> str:
    """A test id that is the same in every process: a frozenset's repr follows
    string hashing, which differs between pytest-xdist workers."""
    return re.sub(
        r"frozenset\(\{([^}]*)\}\)",
        lambda m: "frozenset({" + ", ".join(sorted(m[1].split(", "))) + "})",
        repr(value),
    )


@pytest.mark.parametrize(("f", "attr", "expected"), TAKEN, ids=_id)
def test_push_takes(f: Filter, attr: str, expected: Any) -> None:
    pushdown, remaining = push([f], options())
    assert remaining == []
    assert getattr(pushdown, attr) == expected
    assert pushdown.pushed == (repr(f),)
    assert not pushdown.empty


@pytest.mark.parametrize("f", EMPTY, ids=_id)
def test_push_plans_nothing_when_no_row_can_pass(f: Filter) -> None:
    pushdown, remaining = push([f], options())
    assert remaining == [] and pushdown.empty


@pytest.mark.parametrize("f", NOTHING_TO_DO, ids=_id)
def test_push_takes_not_null_of_columns_never_null(f: Filter) -> None:
    pushdown, remaining = push([f], options())
    assert remaining == []
    assert pushdown == Pushdown(pushed=(repr(f),))


@pytest.mark.parametrize("f", RETURNED, ids=_id)
def test_push_returns_what_it_does_not_apply_exactly(f: Filter) -> None:
    pushdown, remaining = push([f], options())
    assert len(remaining) == 1 and remaining[0] is f
    assert pushdown.pushed == () and not pushdown.empty


def test_push_returns_the_same_objects_in_order() -> None:
    filters: list[Filter] = [
        EqualTo(col("value"), b"x"), EqualTo(col("queue"), 1), GreaterThan(col("key"), b"a"),
        GreaterThanOrEqual(col("offset"), 1000), StringContains(col("topic"), "x"),
    ]  # fmt: skip
    equal = EqualTo(col("value"), b"x")  # equal to the first, not the same object
    pushdown, remaining = push(filters, options())
    assert [id(f) for f in remaining] == [id(filters[0]), id(filters[2]), id(filters[4])]
    assert all(f is not equal for f in remaining)
    assert pushdown.queues == ((1, 2),) and pushdown.offsets == ((1000, BIG),)


def test_conjuncts_intersect() -> None:
    pushdown, remaining = push(
        [
            GreaterThanOrEqual(col("offset"), 1000), LessThan(col("offset"), 3000),
            Not(EqualTo(col("offset"), 2000)), In(col("queue"), (1, 2, 3)),
            LessThan(col("queue"), 3), GreaterThanOrEqual(col("storeTimestamp"), at(0)),
            LessThan(col("storeTimestamp"), at(10_000)), GreaterThan(col("storeTimestamp"), at(1)),
            GreaterThanOrEqual(col("timestamp"), at(0)), LessThan(col("timestamp"), at(5000)),
            EqualTo(col("key"), b"k"), In(col("topic"), ("t", "u")), EqualTo(col("topic"), "t"),
        ],
        options(),
    )  # fmt: skip
    assert remaining == []
    assert pushdown.offsets == ((1000, 2000), (2001, 3000))
    assert pushdown.queues == ((1, 3),)
    assert pushdown.store_ms == (MS0 + 1, MS0 + 10)
    assert pushdown.topics == Names(frozenset({"t"}))
    conjuncts = pushdown.selector.split(" AND ")
    assert sorted(conjuncts) == sorted(
        [f"timestamp >= {MS0}", f"timestamp < {MS0 + 5}", "key = X'6b'"]
    )


def test_store_timestamp_bounds_that_cross_read_nothing() -> None:
    pushdown, remaining = push(
        [GreaterThan(col("storeTimestamp"), at(5000)), LessThan(col("storeTimestamp"), at(0))],
        options(),
    )
    assert remaining == [] and pushdown.empty
    pushdown, _ = push([LessThan(col("storeTimestamp"), at(1)),
                        GreaterThan(col("storeTimestamp"), at(0))], options())  # fmt: skip
    assert pushdown.store_ms == (MS0 + 1, MS0 + 1) and pushdown.empty


def test_two_key_equalities_read_the_keys_both_allow() -> None:
    pushdown, _ = push([In(col("key"), (b"a", b"b")), EqualTo(col("key"), b"b")], options())
    assert pushdown.keys == (b"b",) and not pushdown.empty
    pushdown, remaining = push([EqualTo(col("key"), b"a"), EqualTo(col("key"), b"b")], options())
    assert remaining == [] and pushdown.empty


def test_tags_intersect_with_the_tags_option() -> None:
    pushdown, _ = push([In(col("tag"), ("b", "c"))], options(tags="a|b"))
    assert pushdown.tags == ("b",)
    pushdown, remaining = push([EqualTo(col("tag"), "c")], options(tags="a|b"))
    assert remaining == [] and pushdown.empty
    pushdown, _ = push([EqualTo(col("value"), b"v")], options(tags="a|b"))
    assert pushdown.tags is None  # the option's, unchanged


def test_offset_in_with_too_many_ranges_reads_its_hull_and_stays_in_spark() -> None:
    f = In(col("offset"), tuple(range(0, 2 * (MAX_SPANS + 1), 2)))
    pushdown, remaining = push([f, LessThan(col("offset"), 100)], options())
    assert remaining == [f]
    assert pushdown.offsets == ((0, 100),)
    near = In(col("offset"), tuple(range(0, 2 * MAX_SPANS, 2)))
    pushdown, remaining = push([near], options())
    assert remaining == [] and len(pushdown.offsets) == MAX_SPANS


def test_broker_names_are_pushed_over_a_cluster() -> None:
    cluster = options(namesrv="127.0.0.1:9876")
    pushdown, remaining = push(
        [In(col("broker"), ("a", "b")), Not(EqualTo(col("broker"), "b"))], cluster
    )
    assert remaining == []
    assert pushdown.brokers == Names(frozenset({"a", "b"}), frozenset({"b"}))
    assert pushdown.brokers.admits("a") and not pushdown.brokers.admits("b")


def test_a_selector_too_long_gives_its_longest_conjuncts_back() -> None:
    long_keys = In(col("key"), tuple(bytes([i]) * 40 for i in range(100)))
    short = Not(EqualTo(col("key"), b"k"))
    pushdown, remaining = push([long_keys, short], options())
    assert remaining == [long_keys]
    assert pushdown.selector == "key <> X'6b'"
    assert pushdown.pushed == (repr(short),)


def test_read_filter_ands_the_filter_option() -> None:
    pushdown, _ = push([EqualTo(col("key"), b"k")], options(filter="region = 'eu'"))
    assert pushdown.read_filter("region = 'eu'") == "(region = 'eu') AND (key = X'6b')"
    assert Pushdown().read_filter("a = 1") == "a = 1"
    assert Pushdown(selector="b = 2").read_filter("") == "b = 2"


def test_bad_filter_option_fails_naming_it() -> None:
    with pytest.raises(InvalidOption, match=r"option filter='amount >': .* at position 8"):
        options(filter="amount >")
    with pytest.raises(InvalidOption, match="pushFilters"):
        options(pushFilters="maybe")


# -- which reader Spark gets ------------------------------------------------------


def test_the_planner_module_spark_runs_for_pushdown_exists() -> None:
    """Pins the module the reader choice keys on, and the check that makes a
    reader defining pushFilters fail while pushdown is off: an upgrade of
    pyspark that renames either fails here."""
    spec = importlib.util.find_spec(PLANNER_MODULE)
    assert spec is not None and spec.origin is not None
    assert "reader.pushFilters(" in Path(spec.origin).read_text()
    plain = importlib.util.find_spec("pyspark.sql.worker.plan_data_source_read")
    assert plain is not None and plain.origin is not None
    assert "DATA_SOURCE_PUSHDOWN_DISABLED" in Path(plain.origin).read_text()


def test_reader_defines_push_filters_only_in_the_pushdown_planner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql.datasource import DataSourceReader

    from equeue_spark.spark.source import (
        EqueueBatchReader,
        EqueueDataSource,
        EqueuePushdownReader,
    )

    def reader(**extra: str) -> DataSourceReader:
        source = EqueueDataSource({"broker": "127.0.0.1:5000", "topic": "t", **extra})
        return source.reader(StructType())

    def overrides(r: DataSourceReader) -> bool:
        return getattr(r.pushFilters, "__func__", None) is not DataSourceReader.pushFilters

    monkeypatch.delitem(sys.modules, PLANNER_MODULE, raising=False)
    plain = reader()
    assert type(plain) is EqueueBatchReader and not overrides(plain)
    monkeypatch.setitem(sys.modules, PLANNER_MODULE, types.ModuleType(PLANNER_MODULE))
    pushing = reader()
    assert type(pushing) is EqueuePushdownReader and overrides(pushing)
    assert type(reader(pushFilters="false")) is EqueueBatchReader


# -- real queries: pushed down against Spark's own evaluation --------------------------

TOPIC = "pd"
QUEUES = 4
RECORDS = 100_000
BASE_MS = MS0
"""Producer timestamps are BASE_MS + a permutation of 0..RECORDS-1: known, and in
no order along a queue (only store times are)."""


def producer_ms(i: int) -> int:
    return BASE_MS + (i * 7919) % RECORDS


def message_key(i: int) -> bytes | None:
    if i % 9_973 == 5:
        return b"rare"  # 11 messages: the key index finds them without a scan
    return None if i % 97 == 0 else b"k%d" % (i % 41)


def message_tag(i: int) -> str:
    return {0: "a", 1: "b"}.get(i % 5, "")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker holding topic ``pd``: RECORDS messages, message i in queue i % 4
    at offset i // 4, with a key, a tag and a producer timestamp from i."""
    broker = BrokerProcess(tmp_path_factory.mktemp("pushdown") / "data")
    broker.start()
    try:
        with Admin(broker.address) as admin:
            admin.create_topic(TOPIC, queues=QUEUES)
        with Producer(broker.address) as producer:
            for lo in range(0, RECORDS, 2000):
                ids = range(lo, lo + 2000)
                producer.send_batch(
                    TOPIC, [b"v%d" % i for i in ids], keys=[message_key(i) for i in ids],
                    tags=[message_tag(i) for i in ids], queue_ids=[i % QUEUES for i in ids],
                    timestamps_ms=[producer_ms(i) for i in ids],
                )  # fmt: skip
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def pushdown_spark(spark: SparkSession) -> Iterator[SparkSession]:
    """The session with ``spark.sql.python.filterPushdown.enabled`` on (restored after)."""
    before = spark.conf.get(CONF)
    spark.conf.set(CONF, "true")
    yield spark
    spark.conf.set(CONF, before or "false")


def table(spark: SparkSession, broker: BrokerProcess, **extra: str) -> DataFrame:
    source = spark.read.format("equeue").option("broker", broker.address).option("topic", TOPIC)
    for key, value in extra.items():
        source = source.option(key, value)
    return source.load()


def served(broker: BrokerProcess) -> int:
    return inspected(broker)[0]


def inspected(broker: BrokerProcess) -> tuple[int, int]:
    """(records sent, records read and left out by a filter) so far."""
    with Admin(broker.address) as admin:
        stats = admin.stats()
        return int(stats.records_served), int(stats.records_filtered)


def rows_both_ways(
    spark: SparkSession, broker: BrokerProcess, where: str
) -> tuple[list[tuple[Any, ...]], int, list[tuple[Any, ...]]]:
    """(rows with pushdown on, records the broker sent for them, rows with it off)."""

    def collect() -> list[tuple[Any, ...]]:
        rows = table(spark, broker).where(where).collect()
        return sorted((r.queue, r.offset, r.key, r.value, r.timestamp, r.tag) for r in rows)

    spark.conf.set(CONF, "true")
    before = served(broker)
    pushed = collect()
    sent = served(broker) - before
    spark.conf.set(CONF, "false")
    try:
        plain = collect()
    finally:
        spark.conf.set(CONF, "true")
    return pushed, sent, plain


def micros(ms: int, extra_us: int = 0) -> str:
    """A Spark SQL timestamp literal ``ms`` + ``extra_us`` after the epoch."""
    return f"timestamp_micros({ms * 1000 + extra_us})"


def store_times(spark: SparkSession, broker: BrokerProcess) -> list[int]:
    """The distinct store times (ms) of queue 0, in order."""
    rows = table(spark, broker).where("queue = 0").select("storeTimestamp").distinct().collect()
    return sorted(int(r.storeTimestamp.timestamp() * 1000) for r in rows)


@pytest.mark.timeout(600)
def test_pushed_queries_equal_spark_and_send_only_matching_records(
    pushdown_spark: SparkSession, loaded: BrokerProcess
) -> None:
    """Issue 28: a batch read with offset and timestamp ranges and a key
    equality reads only the matching records from the broker: its
    ``records_served`` grows by the rows returned. Every query gives the rows
    Spark gives without pushdown (rounding of us to ms included)."""
    spark = pushdown_spark
    t1, t2 = micros(BASE_MS + 20_000, 500), micros(BASE_MS + 60_000)
    stamps = store_times(spark, loaded)
    assert len(stamps) >= 3, "the topic's records were stored within too few ms"
    s1 = micros(stamps[len(stamps) // 3], 1)
    s2 = micros(stamps[2 * len(stamps) // 3])
    issue = (
        f"offset >= 1000 and offset < 3000 and timestamp >= {t1} and timestamp < {t2} "
        "and key = X'6b37'"
    )  # k7
    queries = [
        issue,
        f"{issue} and queue = 1",
        f"storeTimestamp >= {s1} and storeTimestamp < {s2} and key = X'6b37'",
        f"storeTimestamp > {s1} and storeTimestamp <= {s2} and queue in (0, 3)",
        "tag = 'a' and queue in (0, 2) and offset < 500",
        "tag = '' and offset < 300 and queue <> 3",
        "tag <> 'a' and key is null and offset >= 100",
        f"timestamp = {micros(producer_ms(4321))} or offset in (5, 6, 7, 100)",
        "offset in (5, 6, 7, 100, 2000) and timestamp > " + micros(BASE_MS + 50_000),
    ]
    for where in queries:
        pushed, sent, plain = rows_both_ways(spark, loaded, where)
        assert pushed == plain, where
        assert pushed, f"{where}: no rows (the test's data is wrong)"
        if " or " not in where:  # an OR is not pushed: Spark filters what is read
            assert sent == len(pushed), f"{where}: the broker sent {sent} for {len(pushed)} rows"


@pytest.mark.timeout(300)
def test_explain_shows_what_was_pushed_and_empty_ranges_read_nothing(
    pushdown_spark: SparkSession, loaded: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    spark = pushdown_spark
    df = table(spark, loaded).where("queue = 1 and offset < 10 and value = X'7635'")
    df.explain("formatted")
    plan = capsys.readouterr().out
    assert "PushedFilters: [" in plan and "EqualTo(queue,1)" in plan
    assert "LessThan(offset,10)" in plan
    assert "value" in plan.split("Filter")[-1]  # the value filter stays in Spark
    assert [r.value for r in df.collect()] == [b"v5"]
    assert df.rdd.getNumPartitions() == 1  # one queue read
    for empty in (
        "offset >= 10 and offset < 5",
        "queue = 9",
        f"storeTimestamp < {micros(0)}",
        f"timestamp = {micros(BASE_MS, 1)}",
        "tag = 'a' and tag = 'b'",
    ):
        before = served(loaded)
        assert table(spark, loaded).where(empty).count() == 0, empty
        assert served(loaded) == before, empty


@pytest.mark.timeout(300)
def test_with_pushdown_off_or_refused_the_same_query_works_unpushed(
    spark: SparkSession, loaded: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert spark.conf.get(CONF) == "false", "pyspark's default changed: see docs/spark.md"
    where = "queue = 2 and offset >= 100 and offset < 200"
    df = table(spark, loaded).where(where)
    df.explain("formatted")
    assert "PushedFilters" not in capsys.readouterr().out
    assert sorted(r.offset for r in df.collect()) == list(range(100, 200))
    spark.conf.set(CONF, "true")
    try:
        refused = table(spark, loaded, pushFilters="false").where(where)
        refused.explain("formatted")
        assert "EqualTo(queue,2)" not in capsys.readouterr().out
        assert sorted(r.offset for r in refused.collect()) == list(range(100, 200))
    finally:
        spark.conf.set(CONF, "false")


@pytest.mark.timeout(300)
def test_filter_option_applies_to_batch_and_streaming_reads(
    pushdown_spark: SparkSession, loaded: BrokerProcess
) -> None:
    """The ``filter`` option is evaluated on the broker for batch reads (ANDed
    with what is pushed) and streaming reads (which get no pushdown); a bad
    expression fails at load() naming its position."""
    spark = pushdown_spark
    expression = "tag = 'a' AND key = X'6b37'"
    wanted = {
        (i % QUEUES, i // QUEUES)
        for i in range(RECORDS)
        if message_tag(i) == "a" and message_key(i) == b"k7"
    }
    before = served(loaded)
    batch = table(spark, loaded, filter=expression).where("offset < 1000").collect()
    assert {(r.queue, r.offset) for r in batch} == {(q, o) for q, o in wanted if o < 1000}
    assert served(loaded) - before == len(batch)

    stream = (
        spark.readStream.format("equeue").option("broker", loaded.address).option("topic", TOPIC)
        .option("startingOffsets", "earliest").option("filter", expression).load()
    )  # fmt: skip
    query = (
        stream.writeStream.format("memory").queryName("pushdown_filter")
        .trigger(availableNow=True).start()
    )  # fmt: skip
    try:
        assert query.awaitTermination(240), "the AvailableNow query did not finish"
        assert query.exception() is None
        got = spark.sql("select queue, offset from pushdown_filter").collect()
    finally:
        query.stop()
    assert {(r.queue, r.offset) for r in got} == wanted and len(got) == len(wanted)

    with pytest.raises(Exception, match=r"option filter=.* at position \d+"):
        table(spark, loaded, filter="tag = ")


def test_coarsen_groups_found_offsets_into_few_ranges() -> None:
    from equeue_spark.spark.key_plan import coarsen

    assert coarsen([], 4) == ()
    assert coarsen([9, 3, 4, 5, 5], 4) == ((3, 6), (9, 10))
    assert coarsen([1, 3, 10, 11, 30], 2) == ((1, 12), (30, 31))  # the widest gap kept
    assert coarsen([1, 3, 10, 11, 30], 1) == ((1, 31),)
    found = list(range(0, 10_000, 7))
    spans = coarsen(found, 256)
    assert len(spans) == 256 and all(any(lo <= o < hi for lo, hi in spans) for o in found)


def test_pushed_spans_share_tasks_up_to_the_partition_limit() -> None:
    from equeue_spark.spark.offsets import task_spans

    spans = ((0, 5), (10, 20), (30, 31))
    assert task_spans([(("t", 0), spans)], None, None) == [(("t", 0), spans)]
    # 16 offsets read, at most 15 a task: 2 tasks of 8 (Kafka's even division).
    assert task_spans([(("t", 0), spans)], None, 15) == [
        (("t", 0), ((0, 5), (10, 13))), (("t", 0), ((13, 20), (30, 31))),
    ]  # fmt: skip
    assert task_spans([(("t", 0), ((0, 10), (10, 20)))], None, 10) == [
        (("t", 0), ((0, 10),)), (("t", 0), ((10, 20),)),
    ]  # fmt: skip
    assert task_spans([(("t", 0), ())], None, 10) == []


DECODED_KEY: list[Filter] = [
    IsNull(col("key")), IsNotNull(col("key")), Not(IsNull(col("key"))),
    EqualTo(col("key"), b"k"), In(col("key"), (b"a", b"b")), Not(EqualTo(col("key"), b"k")),
    EqualTo(col("key"), "k"),
]  # fmt: skip


@pytest.mark.parametrize("f", DECODED_KEY, ids=_id)
def test_key_conditions_stay_in_spark_when_the_key_is_decoded(f: Filter) -> None:
    """With keyFormat the key column is text or a struct, not the bytes the
    broker compares (and its index holds): nothing on it is pushed."""
    pushdown, remaining = push([f], options(keyFormat="string"))
    assert remaining == [f]
    assert pushdown.pushed == () and pushdown.selector == "" and pushdown.keys == ()
    assert not pushdown.empty
    raw, left = push([IsNull(col("key"))], options())  # raw bytes: pushed as before
    assert left == [] and raw.selector == "key IS NULL"


@pytest.mark.parametrize("f", [IsNull(col("value")), IsNotNull(col("value")),
                               EqualTo(col("value"), b"x"), EqualTo(col("valueSchemaVersion"), 1),
                               IsNull(col("valueSchemaVersion"))], ids=_id)  # fmt: skip
def test_value_conditions_stay_in_spark_when_the_value_is_decoded(f: Filter) -> None:
    """A decoded value may be null (a corrupt record in PERMISSIVE mode): not
    even IS NULL is decided by the source; valueSchemaVersion is Spark's.
    (RETURNED checks the same filters without a valueFormat.)"""
    pushdown, remaining = push([f], options(valueFormat="string"))
    assert remaining == [f] and pushdown.pushed == () and not pushdown.empty


def test_min_partitions_apply_to_what_pushdown_leaves(broker: BrokerProcess) -> None:
    """minPartitions and maxRecordsPerPartition count the offsets read after the
    pushed filters narrow the range, not the whole queue (review 29, finding 7)."""
    from equeue_spark.spark.planning import Planner

    with Admin(broker.address) as admin:
        admin.create_topic("pm", queues=1)
    with Producer(broker.address) as producer:
        producer.send_batch("pm", [b"v%d" % i for i in range(1000)], queue_ids=[0] * 1000)
    filters = [GreaterThanOrEqual(col("offset"), 900), LessThan(col("offset"), 1000)]
    for extra, tasks in (({"minPartitions": "8"}, 8), ({"maxRecordsPerPartition": "30"}, 4)):
        o = ReadOptions.parse({"broker": broker.address, "topic": "pm", **extra}, streaming=False)
        planner = Planner(o)
        try:
            starts = planner.resolve(o.starting, None, end=False)
            ends = planner.resolve(o.ending, None, end=True)
            pushdown, _ = push(filters, o)
            ranges = planner.ranges(starts, ends, pushdown=pushdown)
        finally:
            planner.close()
        assert len(ranges) == tasks
        read = [o for r in ranges for lo, hi in (r.spans or ((r.start, r.end),))
                for o in range(lo, hi)]  # fmt: skip
        assert read == list(range(900, 1000))


@pytest.mark.timeout(300)
def test_key_equality_reads_only_what_the_key_index_finds(
    pushdown_spark: SparkSession, loaded: BrokerProcess
) -> None:
    """A pushed ``key =`` plans only the offsets the broker's key index finds:
    the broker reads no record it then leaves out (``records_filtered`` does
    not move), and one task per queue reads them."""
    spark = pushdown_spark
    wanted = sorted((i % QUEUES, i // QUEUES) for i in range(RECORDS) if message_key(i) == b"rare")
    sent_before, filtered_before = inspected(loaded)
    df = table(spark, loaded).where("key = X'72617265'")  # 'rare'
    rows = sorted((r.queue, r.offset) for r in df.collect())
    sent_after, filtered_after = inspected(loaded)
    assert rows == wanted and sent_after - sent_before == len(wanted)
    assert filtered_after == filtered_before, "the broker inspected records it did not send"
    assert df.rdd.getNumPartitions() == len({q for q, _ in wanted})


@pytest.mark.timeout(300)
def test_broker_conditions_over_a_cluster_read_only_that_group(
    pushdown_spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over a cluster (``namesrv``) ``broker = 'b'`` is pushed: broker group a
    sends nothing, b only the queue and offsets asked for."""
    spark = pushdown_spark
    equeue = LocalCluster(tmp_path / "equeue", broker_flags=("--register-interval-ms", "300"))
    try:
        equeue.start(1, ("a", "b"))
        with Admin(namesrv=equeue.namesrv) as admin:
            wait_for(
                "both brokers to register",
                lambda: {"a", "b"} <= {b.broker_name for b in admin.cluster_brokers()},
            )
            admin.create_topic("pdc", queues=2)

            def both() -> bool:
                try:
                    return len(admin.route("pdc").queues()) == 4
                except NotFoundError:
                    return False

            wait_for("both brokers in the topic's route", both)
        with Producer(config=ClientConfig(namesrv=equeue.namesrv)) as producer:
            ids = range(400)  # message i: broker "ab"[i % 2], queue (i // 2) % 2
            producer.send_batch(
                "pdc", [b"v%d" % i for i in ids], queue_ids=[(i // 2) % 2 for i in ids],
                brokers=["ab"[i % 2] for i in ids],
            )  # fmt: skip
        df = spark.read.format("equeue").option("namesrv", equeue.namesrv).option("topic", "pdc")
        query = df.load().where("broker = 'b' and queue = 1 and offset >= 10")
        query.explain("formatted")
        assert "EqualTo(broker,b)" in capsys.readouterr().out
        before = {name: served(b) for name, b in equeue.brokers.items()}
        rows = sorted((r.broker, r.queue, r.offset) for r in query.collect())
        assert rows == [("b", 1, o) for o in range(10, 100)]
        assert {name: served(b) - before[name] for name, b in equeue.brokers.items()} == {
            "a": 0, "b": 90,
        }  # fmt: skip
        spark.conf.set(CONF, "false")
        assert sorted((r.broker, r.queue, r.offset) for r in query.collect()) == rows
    finally:
        spark.conf.set(CONF, "true")
        equeue.stop()
