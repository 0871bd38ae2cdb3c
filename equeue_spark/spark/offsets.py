"""Source offsets: ``{topic: {queue_id: next offset}}`` and the arithmetic on them.

Spark stores a source's offsets as JSON and decides "is there new data?" by
comparing the JSON *text* of two offsets, so the encoding must be canonical:
topics sorted, queue ids sorted numerically, nothing else in the object.
Example: ``{"orders": {"0": 120, "1": 98, "incarnation": 5147350139251307010}}``
(queue ids are JSON keys, so strings). ``incarnation`` is the topic's, as the
broker listed it with the offsets (see ``TopicInfo.incarnation``): offsets of a
deleted topic mean nothing in a new topic of the same name. It comes after the
queues, and is left out when the broker reports none; offsets written before
incarnations existed have none, and ``incarnations`` then says nothing of them.

Over a cluster (option ``namesrv``) a queue is (broker name, queue id), and
each broker has its own incarnation of a topic. The JSON names a queue
``"BROKER/QUEUE"`` and an incarnation ``"incarnation/BROKER"``:
``{"orders": {"a/0": 120, "a/1": 98, "b/0": 7, "incarnation/a": 51, "incarnation/b": 90}}``
(brokers by name, queues by id within each). Inside the connector such a queue's
key is ``("BROKER/TOPIC", queue id)``: topic and broker names cannot contain
``/``, so a single-broker key (a bare topic) never looks like a cluster's, and
the single-broker JSON above is unchanged.

Pyspark-free: the planning logic is tested without a Spark session.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

QueueKey = tuple[str, int]
"""(topic, queue id)"""
Offsets = dict[QueueKey, int]
"""Next offset to read per queue (exclusive end of what was read)."""
Incarnations = dict[str, int]
"""A topic's incarnation per topic name (0 or missing: unknown)."""
INCARNATION = "incarnation"
"""The key of a topic's incarnation among its queue ids (which are numbers)."""


def cluster_key(broker: str, topic: str) -> str:
    """The connector's name for ``topic`` on ``broker`` (``BROKER/TOPIC``); the
    bare topic on one broker (a cluster of one group, named ``""``)."""
    return f"{broker}/{topic}" if broker else topic


def split_key(name: str) -> tuple[str, str]:
    """(broker, topic) of a ``cluster_key``; ("", topic) for a bare topic."""
    broker, sep, topic = name.partition("/")
    return (broker, topic) if sep else ("", name)


def to_json(
    offsets: Mapping[QueueKey, int], incarnations: Mapping[str, int] | None = None
) -> dict[str, dict[str, int]]:
    """The canonical JSON-able form (sorted topics, numerically sorted queues,
    then the topic's incarnation when it is known)."""
    out: dict[str, dict[str, int]] = {}
    brokers: dict[str, list[str]] = {}
    for name, queue in sorted(offsets, key=lambda k: (split_key(k[0])[::-1], k[1])):
        broker, topic = split_key(name)
        if broker and broker not in brokers.setdefault(topic, []):
            brokers[topic].append(broker)
        out.setdefault(topic, {})[f"{broker}/{queue}" if broker else str(queue)] = offsets[
            (name, queue)
        ]
    for topic, queues in out.items():
        for broker in brokers.get(topic, ()):
            incarnation = (incarnations or {}).get(cluster_key(broker, topic), 0)
            if incarnation:
                queues[f"{INCARNATION}/{broker}"] = incarnation
        incarnation = (incarnations or {}).get(topic, 0)
        if incarnation:
            queues[INCARNATION] = incarnation
    return out


def from_json(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    """Parse what ``to_json`` produced (as Spark hands it back from its checkpoint)."""
    out: Offsets = {}
    for topic, queues in data.items():
        for q, o in queues.items():
            if q == INCARNATION or q.startswith(INCARNATION + "/"):
                continue
            broker, sep, queue = q.partition("/")
            if sep:
                out[(cluster_key(broker, topic), int(queue))] = int(o)
            else:
                out[(topic, int(q))] = int(o)
    return out


def incarnations(data: Mapping[str, Mapping[str, int]]) -> Incarnations:
    """The topics' incarnations in what ``to_json`` produced (none in offsets
    written before incarnations existed)."""
    out = {topic: int(q[INCARNATION]) for topic, q in data.items() if q.get(INCARNATION)}
    for topic, queues in data.items():
        for key, value in queues.items():
            if key.startswith(INCARNATION + "/") and value:
                out[cluster_key(key.partition("/")[2], topic)] = int(value)
    return out


def recreated_topics(before: Mapping[str, int], now: Mapping[str, int]) -> set[str]:
    """Topics deleted and created again between two listings: their
    incarnations are known in both and differ."""
    return {t for t, i in before.items() if i and now.get(t, i) != i}


def rate_limit(limit: int, starts: Mapping[QueueKey, int], ends: Offsets) -> Offsets:
    """Cap the total records of ``[starts, ends)`` at about ``limit``, split over
    queues in proportion to their backlog, as Kafka's ``maxOffsetsPerTrigger``
    does: a queue's share is rounded down, but never to zero, so a small queue
    is not starved by a big one (the total may exceed ``limit`` by that rounding).
    """
    sizes = {key: end - starts.get(key, end) for key, end in ends.items()}
    total = sum(size for size in sizes.values() if size > 0)
    if total <= limit:
        return dict(ends)
    capped = dict(ends)
    for key, size in sizes.items():
        if size > 0:
            share = max(limit * size // total, 1)
            capped[key] = min(ends[key], starts[key] + share)
    return capped


def split_budget(budget: int, starts: Mapping[QueueKey, int], ends: Offsets) -> dict[QueueKey, int]:
    """Split a byte budget over the queues with records in ``[starts, ends)``, in
    proportion to their record backlog (each gets at least 1 byte)."""
    sizes = {key: end - starts.get(key, end) for key, end in ends.items()}
    total = sum(size for size in sizes.values() if size > 0)
    return {
        key: max(budget * size // total, 1) for key, size in sizes.items() if size > 0 and total
    }


def backlog(starts: Mapping[QueueKey, int], ends: Mapping[QueueKey, int]) -> int:
    """Records between two offsets (queues missing from ``starts`` count from ``ends``)."""
    return sum(max(end - starts.get(key, end), 0) for key, end in ends.items())


def split_range(start: int, end: int, max_records: int | None) -> list[tuple[int, int]]:
    """``[start, end)`` cut into pieces of at most ``max_records`` (one Spark task each)."""
    if end <= start:
        return []
    if not max_records:
        return [(start, end)]
    return [(lo, min(lo + max_records, end)) for lo in range(start, end, max_records)]


def min_partition_ranges(
    ranges: list[tuple[QueueKey, int, int]], min_partitions: int | None
) -> list[tuple[QueueKey, int, int]]:
    """Queue ranges ``(key, start, end)`` split for option ``minPartitions``,
    exactly as Kafka's source does (``KafkaOffsetRangeCalculator.getRanges``):
    empty ranges dropped; unchanged when there are already ``min_partitions``
    ranges; else each range gets ``round(size / total * min_partitions)``
    pieces (at least 1), the ranges of one piece are left whole and the others
    share what is left of ``min_partitions`` by size; a range's pieces are
    equal but for the last, which takes the remainder. So the count is about
    ``min_partitions`` (Kafka's rounding: 4 equal queues and 10 give 12)."""
    ranges = [r for r in ranges if r[2] > r[1]]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(end - start for _, start, end in ranges)
    unsplit = {r[0] for r in ranges if _part_count(r[2] - r[1], total, min_partitions) == 1}
    unsplit_total = sum(end - start for key, start, end in ranges if key in unsplit)
    split_total = total - unsplit_total
    split_min = max(min_partitions - len(unsplit), 1)
    out = []
    for key, start, end in ranges:
        parts = 1 if key in unsplit else _part_count(end - start, split_total, split_min)
        remaining, lo = end - start, start
        for part in range(parts):
            this = remaining // (parts - part)  # the last piece takes the remainder
            remaining -= this
            out.append((key, lo, min(lo + this, end)))
            lo = min(lo + this, end)
    return [r for r in out if r[2] > r[1]]


def _part_count(size: int, total: int, min_partitions: int) -> int:
    # Scala's math.round (half up) on a double, not Python's round (half to even).
    return max(math.floor(size / total * min_partitions + 0.5), 1)


Span = tuple[int, int]
"""``[lo, hi)`` of offsets (or of queue ids)."""
EVERYTHING: tuple[Span, ...] = ((0, 2**63),)
"""Every offset (and queue id) there is: offsets and ids are never negative."""


def normalized(spans: list[Span] | tuple[Span, ...]) -> tuple[Span, ...]:
    """``spans`` sorted, empty ones dropped and overlapping or adjacent ones
    merged: the canonical form the other span functions return."""
    merged: list[Span] = []
    for lo, hi in sorted(s for s in spans if s[0] < s[1]):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def intersect(a: tuple[Span, ...], b: tuple[Span, ...]) -> tuple[Span, ...]:
    """The offsets in both (each argument normalized)."""
    out: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def points(values: list[int] | tuple[int, ...] | set[int]) -> tuple[Span, ...]:
    """Single offsets as spans, adjacent ones grouped (``[3, 4, 5, 9]`` ->
    ``((3, 6), (9, 10))``)."""
    return normalized([(v, v + 1) for v in values])


def complement(spans: tuple[Span, ...]) -> tuple[Span, ...]:
    """Every offset not in ``spans`` (normalized), within ``EVERYTHING``."""
    out: list[Span] = []
    at = EVERYTHING[0][0]
    for lo, hi in spans:
        if lo > at:
            out.append((at, lo))
        at = max(at, hi)
    if at < EVERYTHING[0][1]:
        out.append((at, EVERYTHING[0][1]))
    return tuple(out)


def contains(spans: tuple[Span, ...], value: int) -> bool:
    return any(lo <= value < hi for lo, hi in spans)


def pack_spans(spans: list[Span], max_records: int | None) -> list[tuple[Span, ...]]:
    """Consecutive ``spans`` of one queue grouped into tasks of at most
    ``max_records`` offsets each (all in one without a limit): a span longer
    than the limit (``split_range`` cuts none) is a task alone."""
    groups: list[list[Span]] = []
    size = 0
    for lo, hi in spans:
        if groups and (max_records is None or size + hi - lo <= max_records):
            groups[-1].append((lo, hi))
            size += hi - lo
        else:
            groups.append([(lo, hi)])
            size = hi - lo
    return [tuple(g) for g in groups]
