"""``progress.offsets_behind``: Kafka's offsets-behind-latest figures from a
streaming query's progress (pyspark 4.3's Python sources cannot report metrics)."""

from __future__ import annotations

import json

from pyspark.sql.streaming.listener import SourceProgress

from equeue_spark.spark.progress import NAMES, offsets_behind


def _source(end: object, latest: object) -> dict[str, object]:
    return {"description": "equeue", "startOffset": None, "endOffset": end,
            "latestOffset": latest, "numInputRows": 0, "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 0.0, "metrics": {}}  # fmt: skip


def test_single_broker_figures_are_kafkas() -> None:
    end = {"orders": {"0": 100, "1": 40, "incarnation": 51}, "audit": {"0": 7}}
    latest = {"orders": {"0": 100, "1": 5041, "incarnation": 51}, "audit": {"0": 7}}
    figures = offsets_behind(_source(json.dumps(end), json.dumps(latest)))
    assert figures == {
        "minOffsetsBehindLatest": "0",
        "maxOffsetsBehindLatest": "5001",
        "avgOffsetsBehindLatest": str(5001 / 3),
    }
    assert tuple(figures) == NAMES


def test_cluster_keys_and_parsed_offsets() -> None:
    end = {"orders": {"a/0": 10, "b/0": 20, "incarnation/a": 1, "incarnation/b": 2}}
    latest = {"orders": {"a/0": 15, "b/0": 20, "b/1": 3, "incarnation/a": 1, "incarnation/b": 2}}
    # b/1 is new since the batch's end: all of it is behind.
    assert offsets_behind(_source(end, latest)) == {
        "minOffsetsBehindLatest": "0",
        "maxOffsetsBehindLatest": "5",
        "avgOffsetsBehindLatest": str(8 / 3),
    }


def test_a_pyspark_source_progress_and_its_json() -> None:
    end = '{"orders":{"0":1,"1":2}}'
    latest = '{"orders":{"0":4,"1":2}}'
    progress = SourceProgress.fromJson(_source(json.loads(end), json.loads(latest)))
    expected = {
        "minOffsetsBehindLatest": "0",
        "maxOffsetsBehindLatest": "3",
        "avgOffsetsBehindLatest": "1.5",
    }
    assert offsets_behind(progress) == expected
    assert offsets_behind(json.loads(json.dumps(dict(progress)))) == expected


def test_nothing_before_the_first_batch_or_for_another_source() -> None:
    assert offsets_behind(_source(None, '{"t":{"0":3}}')) == {}
    assert offsets_behind(_source("null", '{"t":{"0":3}}')) == {}
    assert offsets_behind(_source('{"t":{"0":3}}', "{}")) == {}
    assert offsets_behind(_source('{"t":{"0":3}}', "not json")) == {}
    assert offsets_behind(_source('{"t":{"x":3}}', '{"t":{"x":4}}')) == {}  # not ours
    assert offsets_behind({}) == {}


def test_a_recreated_topic_counts_zero_not_negative() -> None:
    figures = offsets_behind(_source('{"t":{"0":500}}', '{"t":{"0":20}}'))
    assert figures["minOffsetsBehindLatest"] == "0" == figures["maxOffsetsBehindLatest"]
