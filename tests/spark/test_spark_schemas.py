"""valueFormat/keyFormat in Spark against a real broker with topic schemas
and a real SparkSession: decoding, evolution within a stream, corrupt
records in each mode, the sink's encoding."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest

pytest.importorskip("pyspark")

import fastavro
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_spark.client import Admin, Producer
from equeue_spark.client.errors import EqueueError
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

SparkError = (PySparkException, CapturedException)

V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
V3_BAD = {**V1, "fields": [*V1["fields"], {"name": "qty", "type": "int"}]}
JSON_V1 = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
    "required": ["id"],
}


def avro(schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def send(address: str, topic: str, values: list[bytes], version: int | None) -> None:
    """Values with the version header a validating producer stamps."""
    headers = [[] if version is None else [("equeue.schema", str(version).encode())]] * len(values)
    with Producer(address) as producer:
        producer.send_batch(topic, values, headers=headers)


def send_validated(address: str, topic: str, datums: list[dict[str, Any]]) -> None:
    """As an application writes: ``Producer(validate=True)`` encodes each dict
    with the topic's latest schema and stamps its version (a new producer:
    a fresh schema cache)."""
    with Producer(address, validate=True) as producer:
        futures = [producer.send(topic, value=datum) for datum in datums]
    for future in futures:
        future.result(timeout=30)


def schema_topic(address: str, topic: str, schema: dict[str, Any], kind: str = "avro") -> None:
    with Admin(address) as admin:
        admin.create_topic(topic, 1)
        admin.set_schema(topic, json.dumps(schema), type=kind)


def read(spark: SparkSession, broker: BrokerProcess, topic: str, **options: str) -> DataFrame:
    source = spark.read.format("equeue").option("broker", broker.address).option("topic", topic)
    for key, value in options.items():
        source = source.option(key, value)
    return source.load()


@pytest.mark.timeout(240)
def test_evolution_within_a_stream(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Any
) -> None:
    schema_topic(broker.address, "evo", V1)
    rows: list[Any] = []
    lock = threading.Lock()

    def collect(batch: DataFrame, batch_id: int) -> None:
        got = batch.collect()
        with lock:
            rows.extend(got)

    stream = (
        spark.readStream.format("equeue")
        .option("broker", broker.address)
        .option("topic", "evo")
        .option("startingOffsets", "earliest")
        .option("valueFormat", "avro")
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        send_validated(broker.address, "evo", [{"id": i, "item": f"a{i}"} for i in range(100)])
        wait_for("100 v1 rows", lambda: len(rows) >= 100, 90)
        with Admin(broker.address) as admin:
            assert admin.set_schema("evo", json.dumps(V2), type="avro").latest_version == 2
        v2 = [{"id": 100 + i, "item": "b", "note": f"n{i}"} for i in range(100)]
        send_validated(broker.address, "evo", v2)
        wait_for("200 rows", lambda: len(rows) >= 200, 90)
        assert query.exception() is None
    finally:
        query.stop()
    by_offset = sorted(rows, key=lambda r: r.offset)
    assert len(by_offset) == 200
    assert [r.valueSchemaVersion for r in by_offset] == [1] * 100 + [2] * 100
    assert set(by_offset[0].value.asDict()) == {"id", "item"}  # the query's v1 struct
    assert [r.value.id for r in by_offset] == list(range(200))
    later = read(spark, broker, "evo", valueFormat="avro").orderBy("offset").collect()
    assert [r.value.note for r in later] == [None] * 100 + [f"n{i}" for i in range(100)]
    assert [r.valueSchemaVersion for r in later] == [1] * 100 + [2] * 100


@pytest.mark.timeout(60)
def test_incompatible_version_is_refused(broker: BrokerProcess) -> None:
    schema_topic(broker.address, "incompat", V1)
    with Admin(broker.address) as admin, pytest.raises(EqueueError, match="qty"):
        admin.set_schema("incompat", json.dumps(V3_BAD), type="avro")
    with Admin(broker.address) as admin:
        assert admin.get_schema("incompat").latest_version == 1


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["avro", "json"])
def test_corrupt_record_in_each_mode(spark: SparkSession, broker: BrokerProcess, kind: str) -> None:
    topic = f"corrupt_{kind}"
    if kind == "avro":
        schema_topic(broker.address, topic, V1)
        good = [avro(V1, {"id": 1, "item": "a"}), avro(V1, {"id": 3, "item": "c"})]
        bad = b"\x02"  # a long, then nothing: the string is missing
    else:
        schema_topic(broker.address, topic, JSON_V1, "json")
        good = [b'{"id":1,"item":"a"}', b'{"id":3,"item":"c"}']
        bad = b'{"id":"x"}'
    send(broker.address, topic, [good[0], bad, good[1]], 1)

    with pytest.raises(SparkError) as caught:
        read(spark, broker, topic, valueFormat=kind).collect()
    text = str(caught.value)
    assert f"{topic}/0 offset 1" in text and "version 1" in text
    assert "mode=PERMISSIVE" in text

    rows = read(spark, broker, topic, valueFormat=kind, mode="PERMISSIVE").orderBy("offset")
    got = rows.collect()
    assert [r.value.id if r.value else None for r in got] == [1, None, 3]
    assert got[1]._corrupt_record.bytes == bad and got[1]._corrupt_record.part == "value"
    assert got[0]._corrupt_record is None

    dropped = read(spark, broker, topic, valueFormat=kind, mode="DROPMALFORMED").collect()
    assert sorted(r.value.id for r in dropped) == [1, 3]


@pytest.mark.timeout(240)
def test_explicit_reader_schema_and_string_format(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """Records without a version header decode with the reader schema (here
    the explicit valueSchema); valueFormat=string checks UTF-8."""
    send(broker.address, "plain", [b'{"id":7,"item":"x","more":1}', b"\xff"], None)
    schema = json.dumps(JSON_V1)
    rows = read(spark, broker, "plain", valueFormat="json", valueSchema=schema,
                mode="PERMISSIVE").orderBy("offset").collect()  # fmt: skip
    assert rows[0].value.asDict() == {"id": 7, "item": "x"}
    assert rows[0].valueSchemaVersion is None
    assert rows[1].value is None and "not UTF-8" in rows[1]._corrupt_record.error
    text = read(spark, broker, "plain", valueFormat="string", mode="DROPMALFORMED").collect()
    assert [r.value for r in text] == ['{"id":7,"item":"x","more":1}']


@pytest.mark.timeout(240)
@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_sink_round_trip(spark: SparkSession, broker: BrokerProcess, delivery: str) -> None:
    topic = f"sink_{delivery}"
    schema_topic(broker.address, topic, V2)
    df = spark.createDataFrame([(1, "a", None), (2, "b", "n")], "id long, item string, note string")
    writer = (
        df.select(sf.struct("id", "item", "note").alias("value"))
        .write.format("equeue")
        .option("broker", broker.address)
        .option("topic", topic)
        .option("valueFormat", "avro")
        .option("delivery", delivery)
        .mode("append")
    )
    writer.save()
    # Two tasks write concurrently: offsets follow no row order.
    got = read(spark, broker, topic, valueFormat="avro").orderBy("value.id").collect()
    assert [r.value.asDict() for r in got] == [
        {"id": 1, "item": "a", "note": None},
        {"id": 2, "item": "b", "note": "n"},
    ]
    assert [r.valueSchemaVersion for r in got] == [1, 1]
    extra = spark.createDataFrame([(1, "a", 5)], "id long, item string, qty int")
    with pytest.raises(SparkError, match="field 'qty' that the topic's value schema"):
        extra.select(sf.struct("id", "item", "qty").alias("value")).write.format("equeue").option(
            "broker", broker.address
        ).option("topic", topic).option("valueFormat", "avro").mode("append").save()
    assert read(spark, broker, topic).count() == 2  # nothing written by the refused one


@pytest.mark.timeout(240)
def test_json_sink_round_trip(spark: SparkSession, broker: BrokerProcess) -> None:
    schema_topic(broker.address, "sink_json", JSON_V1, "json")
    df = spark.createDataFrame([(1, "a"), (2, None)], "id long, item string")
    df.select(sf.struct("id", "item").alias("value")).write.format("equeue").option(
        "broker", broker.address
    ).option("topic", "sink_json").option("valueFormat", "json").mode("append").save()
    got = read(spark, broker, "sink_json", valueFormat="json").orderBy("value.id").collect()
    assert [r.value.asDict() for r in got] == [{"id": 1, "item": "a"}, {"id": 2, "item": None}]
    assert [r.valueSchemaVersion for r in got] == [1, 1]
    raw = read(spark, broker, "sink_json").collect()
    assert sorted(r.value for r in raw) == [b'{"id":1,"item":"a"}', b'{"id":2}']


@pytest.mark.timeout(300)
def test_restart_mode_stops_at_a_new_version_and_restarts_with_it(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Any
) -> None:
    schema_topic(broker.address, "restart", V1)
    send(broker.address, "restart", [avro(V1, {"id": i, "item": "a"}) for i in range(10)], 1)
    rows: list[Any] = []
    lock = threading.Lock()

    def collect(batch: DataFrame, batch_id: int) -> None:
        got = batch.collect()
        with lock:
            rows.extend(got)

    def start() -> Any:
        stream = (
            spark.readStream.format("equeue")
            .option("broker", broker.address)
            .option("topic", "restart")
            .option("startingOffsets", "earliest")
            .option("valueFormat", "avro")
            .option("schemaEvolutionMode", "restart")
            .load()
        )
        return (
            stream.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    query = start()
    try:
        wait_for("10 v1 rows", lambda: len(rows) >= 10, 90)
        with Admin(broker.address) as admin:
            admin.set_schema("restart", json.dumps(V2), type="avro")
        v2 = [avro(V2, {"id": 10 + i, "item": "b", "note": "n"}) for i in range(10)]
        send(broker.address, "restart", v2, 2)
        with pytest.raises(SparkError, match="restart the query to read with version 2"):
            query.awaitTermination(90)
    finally:
        query.stop()
    assert len(rows) == 10
    query = start()
    try:
        wait_for("the v2 rows", lambda: len(rows) >= 20, 90)
    finally:
        query.stop()
    later = sorted(rows[10:], key=lambda r: r.offset)
    assert [(r.value.id, r.value.note, r.valueSchemaVersion) for r in later] == [
        (10 + i, "n", 2) for i in range(10)
    ]


@pytest.mark.timeout(300)
def test_assigned_queues_of_a_cluster_decode(spark: SparkSession, tmp_path: Any) -> None:
    """Over two broker groups: the schema registered on both, records of
    ``a/0`` and ``b/1`` read with ``assign`` and decoded."""
    equeue = LocalCluster(tmp_path / "equeue", broker_flags=("--register-interval-ms", "300"))
    try:
        equeue.start(1, ("a", "b"))
        with Admin(namesrv=equeue.namesrv) as admin:
            admin.create_topic("corders", 2)
            admin.set_schema("corders", json.dumps(V1), type="avro")
        # Keyed: the key hash spreads them over every (broker, queue), the same each run.
        with Producer(namesrv=equeue.namesrv, validate=True) as producer:
            futures = [
                producer.send("corders", value={"id": i, "item": "x"}, key=b"k%d" % i)
                for i in range(40)
            ]
        for future in futures:
            future.result(timeout=30)
        assign = json.dumps({"corders": ["a/0", "b/1"]})

        def load(**options: str) -> list[Any]:
            source = spark.read.format("equeue").option("namesrv", equeue.namesrv)
            for key, value in {"assign": assign, **options}.items():
                source = source.option(key, value)
            return source.load().collect()

        raw = load()
        decoded = load(valueFormat="avro")
        parsed = fastavro.parse_schema(V1)
        expected = {
            (r.broker, r.queue, r.offset): fastavro.schemaless_reader(
                io.BytesIO(r.value), parsed, parsed
            )
            for r in raw
        }
        assert {(r.broker, r.queue) for r in raw} == {("a", 0), ("b", 1)}
        assert {(r.broker, r.queue, r.offset): r.value.asDict() for r in decoded} == expected
        assert {r.valueSchemaVersion for r in decoded} == {1}
    finally:
        equeue.stop()
