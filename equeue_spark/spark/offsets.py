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

Pyspark-free: the planning logic is tested without a Spark session.
"""

from __future__ import annotations

from collections.abc import Mapping

QueueKey = tuple[str, int]
"""(topic, queue id)"""
Offsets = dict[QueueKey, int]
"""Next offset to read per queue (exclusive end of what was read)."""
Incarnations = dict[str, int]
"""A topic's incarnation per topic name (0 or missing: unknown)."""
INCARNATION = "incarnation"
"""The key of a topic's incarnation among its queue ids (which are numbers)."""


def to_json(
    offsets: Mapping[QueueKey, int], incarnations: Mapping[str, int] | None = None
) -> dict[str, dict[str, int]]:
    """The canonical JSON-able form (sorted topics, numerically sorted queues,
    then the topic's incarnation when it is known)."""
    out: dict[str, dict[str, int]] = {}
    for topic, queue in sorted(offsets):
        out.setdefault(topic, {})[str(queue)] = offsets[(topic, queue)]
    for topic, queues in out.items():
        incarnation = (incarnations or {}).get(topic, 0)
        if incarnation:
            queues[INCARNATION] = incarnation
    return out


def from_json(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    """Parse what ``to_json`` produced (as Spark hands it back from its checkpoint)."""
    return {
        (topic, int(q)): int(o)
        for topic, queues in data.items()
        for q, o in queues.items()
        if q != INCARNATION
    }


def incarnations(data: Mapping[str, Mapping[str, int]]) -> Incarnations:
    """The topics' incarnations in what ``to_json`` produced (none in offsets
    written before incarnations existed)."""
    return {topic: int(q[INCARNATION]) for topic, q in data.items() if q.get(INCARNATION)}


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
