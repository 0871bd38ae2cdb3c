"""Retention: which sealed log chunks may go, and deleting them with their index chunks.

The policy (``RetentionConfig``): delete the oldest sealed chunks while there
are more than ``max_chunks`` of them or the oldest was sealed more than
``max_age_ms`` ago; never the active chunk; with ``keep_unconsumed``, keep a
chunk while some group has committed on a queue but not consumed a record in
it or before it. Once log chunks are gone, index chunks that only point into
them go too. ``Store.apply_retention`` (run by the store's maintenance thread)
flushes first, then calls ``delete_expired`` under the store lock.

Locking: every function here must be called with the store lock held.
"""

from __future__ import annotations

from equeue_broker.storage.config import RetentionConfig
from equeue_broker.storage.message_log import MessageLog
from equeue_broker.storage.offsets import OffsetStore
from equeue_broker.storage.queue_state import QueueKey, QueueState
from equeue_broker.storage.results import RetentionReport


def delete_expired(
    rules: RetentionConfig,
    message_log: MessageLog,
    queues: dict[QueueKey, QueueState],
    offsets: OffsetStore,
    now_ms: int,
) -> RetentionReport:
    """Delete the log chunks ``rules`` let go at ``now_ms``, then the index
    chunks that only point into deleted log chunks (lock held)."""
    needed = (
        oldest_unconsumed_position(message_log, queues, offsets) if rules.keep_unconsumed else None
    )
    deleted = 0
    while len(message_log.chunks) > 1:
        chunk = message_log.chunks[0]
        sealed = len(message_log.chunks) - 1
        by_count = rules.max_chunks is not None and sealed > rules.max_chunks
        by_age = (
            rules.max_age_ms is not None and now_ms - (chunk.sealed_ms or now_ms) > rules.max_age_ms
        )
        if not (by_count or by_age):
            break
        if needed is not None and message_log.start_of(chunk) + chunk.data_size > needed:
            break
        message_log.delete_oldest()
        deleted += 1
    index_deleted = 0
    if deleted:
        for queue in queues.values():
            index_deleted += queue.index.delete_chunks_below(message_log.start_position)
    return RetentionReport(deleted, index_deleted, message_log.start_position)


def oldest_unconsumed_position(
    message_log: MessageLog, queues: dict[QueueKey, QueueState], offsets: OffsetStore
) -> int:
    """Lowest log position of a record some group committed on but has not
    consumed (the write position if there is none; lock held)."""
    needed = message_log.write_position
    for (topic, queue_id), queue in queues.items():
        low = offsets.min_committed(topic, queue_id)
        if low is not None and max(low, queue.index.earliest) < queue.index.end:
            needed = min(needed, queue.index.entry(max(low, queue.index.earliest))[0] - 1)
    return needed
