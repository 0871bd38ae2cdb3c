"""What a topic holds, read back through the client, for tests that compare copies."""

from __future__ import annotations

import collections

from equeue_spark.client import read_range


def topic_contents(
    address: str, topic: str, queues: int
) -> collections.Counter[tuple[bytes | None, bytes]]:
    """Every (key, value) of ``topic``'s queues ``0..queues-1`` on one broker, counted."""
    return collections.Counter(
        (m.key, m.value)
        for q in range(queues)
        for batch in read_range(topic, q, 0, broker=address, batch_messages=5_000)
        for m in batch
    )
