"""Kafka's "offsets behind latest" figures for an equeue streaming query.

Spark's Kafka source reports ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``
and ``avgOffsetsBehindLatest`` in ``StreamingQueryProgress.sources[i].metrics``
(``KafkaMicroBatchStream.metrics``). A Python data source cannot: in pyspark
4.3 the JVM wrapper of a Python streaming source does not implement
``ReportsSourceMetrics`` and the Python runner has no call for it, so
``metrics`` stays empty for ``format("equeue")``. What does reach the progress
is the source's ``endOffset`` (where the batch ended) and ``latestOffset``
(what the broker had, from ``reportLatestOffset``): Kafka computes its three
figures from exactly these, and ``offsets_behind`` does the same here, for a
``StreamingQueryListener.onQueryProgress`` or ``query.lastProgress``::

    offsets_behind(query.lastProgress.sources[0])
    # {'minOffsetsBehindLatest': '0', 'maxOffsetsBehindLatest': '5001',
    #  'avgOffsetsBehindLatest': '1250.5'}

Pyspark-free: it takes the source entry as a mapping (``SourceProgress`` is a
dict) or its JSON (``json.loads(query.lastProgress.json)["sources"][0]``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from equeue_spark.spark.offsets import QueueKey, from_json

NAMES = ("minOffsetsBehindLatest", "maxOffsetsBehindLatest", "avgOffsetsBehindLatest")
"""Kafka's metric names, in the order Kafka's source reports them."""


def offsets_behind(source: Mapping[str, Any]) -> dict[str, str]:
    """Kafka's three figures (string values, as in ``SourceProgress.metrics``)
    for one source entry of a streaming query's progress: per queue in
    ``latestOffset``, the latest offset minus the batch's ``endOffset`` (a
    queue the end does not have yet, new since, counts from 0; a queue whose
    latest is below the end, a topic recreated in between, counts 0). Empty
    when either offset is missing (before the first batch), as Kafka's."""
    end = _offsets(source.get("endOffset"))
    latest = _offsets(source.get("latestOffset"))
    if end is None or latest is None or not latest:
        return {}
    behind = [max(offset - end.get(key, 0), 0) for key, offset in sorted(latest.items())]
    return {
        "minOffsetsBehindLatest": str(min(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
        "avgOffsetsBehindLatest": str(sum(behind) / len(behind)),
    }


def _offsets(value: object) -> dict[QueueKey, int] | None:
    """Our source offset (offsets.py's JSON: queues per topic, a cluster's
    ``BROKER/QUEUE``, incarnations skipped) as text or parsed; None if absent."""
    if isinstance(value, str):
        if value.strip() in ("", "null", "None"):
            return None
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    try:
        return from_json(value)
    except (AttributeError, TypeError, ValueError):  # not an equeue source's offset
        return None
