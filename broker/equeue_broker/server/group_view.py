"""A consumer group's progress per queue: the one definition of lag.

``AdminService.DescribeGroup`` (service_admin.py) builds its ``GroupInfo``
from ``group_queues``, and so does a metrics collector (plain tuples, no
protobuf: a scrape walks every group). Per queue of every topic the group
committed on or its live members subscribe to:

- ``lag``: end - committed, or end - earliest when the group never committed
  there or retention removed what it had not consumed yet (what it will
  consume next is the earliest retained message);
- ``lag_ms``: how old the first unconsumed message is, ``now_ms`` minus its
  store time (one index entry read, ``Reads.store_time``); 0 when lag is 0.

Storage reads take the store lock per queue, briefly; call it on a thread,
not on the event loop.
"""

from __future__ import annotations

from typing import NamedTuple

from equeue_broker.server.groups import ConsumerRegistry
from equeue_broker.storage import NotFound, Store
from equeue_proto.protocol import allocate_average


class GroupQueueView(NamedTuple):
    topic: str
    queue_id: int
    committed: int
    """The next offset the group will consume; -1 if it never committed."""
    earliest: int
    end: int
    lag: int
    lag_ms: int
    consumer_id: str
    """The live consumer the average allocation gives the queue; "" if none."""


class StoreTimes:
    """Store times of offsets, remembered across calls (the metrics thread's
    scrapes; one thread only): the message at an offset keeps its store time
    for as long as its topic's incarnation and the log's epoch last (a
    recreated topic, or a log truncated by a failover, starts a new one), so
    a scrape reads the index only for queues whose first unconsumed offset
    moved. At most ``limit`` entries; past it the memory starts afresh."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self.epoch = -1
        """The log epoch the entries belong to; a new one forgets them."""
        self._known: dict[tuple[str, int, int, int], int] = {}

    def in_epoch(self, epoch: int) -> StoreTimes:
        """Itself, having forgotten everything if the log's epoch changed."""
        if epoch != self.epoch:
            self._known.clear()
            self.epoch = epoch
        return self

    def get(self, store: Store, topic: str, incarnation: int, queue_id: int, offset: int) -> int:
        """The store time (ms) of ``offset``; -1 if it is not readable (yet)."""
        key = (topic, incarnation, queue_id, offset)
        found = self._known.get(key)
        if found is not None:
            return found
        try:
            stored = store.reads.store_time(topic, queue_id, offset)
        except NotFound:
            return -1
        if stored is None:
            return -1
        if len(self._known) >= self.limit:
            self._known.clear()
        self._known[key] = stored
        return stored


def group_queues(
    store: Store,
    consumers: ConsumerRegistry,
    group: str,
    now_ms: int,
    times: StoreTimes | None = None,
) -> list[GroupQueueView]:
    """Every queue of ``group``'s topics (sorted by topic, then as the topic
    lists its queues); [] for a group with no offsets and no live member.
    Topics deleted meanwhile are left out. ``times``: store times remembered
    between calls (the metrics' collector)."""
    committed = store.committed_offsets(group)
    views: list[GroupQueueView] = []
    for topic in sorted(set(committed) | consumers.topics(group)):
        try:
            meta = store.topic_admin.describe(topic)
        except NotFound:
            continue
        visible = [q.queue_id for q in meta.queues if q.consumer_visible]
        owners = {
            queue_id: consumer
            for consumer, queues in allocate_average(visible, consumers.live(group, topic)).items()
            for queue_id in queues
        }
        offsets = committed.get(topic, {})
        for q in meta.queues:
            try:
                info = store.topic_admin.queue_info(topic, q.queue_id)
            except NotFound:  # deleted meanwhile
                continue
            offset = offsets.get(q.queue_id)
            first = info.earliest if offset is None else max(offset, info.earliest)
            lag = info.end - first
            views.append(GroupQueueView(
                topic, q.queue_id, -1 if offset is None else offset, info.earliest, info.end,
                lag,
                _age(store, times, meta.incarnation, q.queue_id, first, now_ms, topic)
                if lag > 0 else 0,
                owners.get(q.queue_id, ""),
            ))  # fmt: skip
    return views


def _age(  # noqa: PLR0917 (one queue's coordinates)
    store: Store, times: StoreTimes | None, incarnation: int, queue_id: int, offset: int,
    now_ms: int, topic: str,
) -> int:  # fmt: skip
    """``_age_ms``, through ``times`` when given."""
    if times is None:
        return _age_ms(store, topic, queue_id, offset, now_ms)
    stored = times.get(store, topic, incarnation, queue_id, offset)
    return 0 if stored < 0 else max(0, now_ms - stored)


def _age_ms(store: Store, topic: str, queue_id: int, offset: int, now_ms: int) -> int:
    """How long ago the message at ``offset`` was stored (0 if it is gone or
    not there yet: the queue changed since its end was read)."""
    try:
        stored = store.reads.store_time(topic, queue_id, offset)
    except NotFound:
        return 0
    return 0 if stored is None else max(0, now_ms - stored)
