"""Byte budgets over a queue's index: where a read of at most N stored bytes stops.

The index entries carry each record's size (queue_index.py), so a budget is
laid over a range of offsets without reading the log. ``Reads.offset_for_bytes``
(reads.py) takes the engine lock and calls ``bytes_stop``.
"""

from __future__ import annotations

import bisect
import itertools

from equeue_broker.storage.errors import InvalidArgument
from equeue_broker.storage.index.queue_state import QueueState

_SIZES_PER_ROUND = 65_536
"""Index entries whose sizes one round reads: bounds the memory of one lookup."""


def bytes_stop(queue: QueueState, start: int, end: int, max_bytes: int) -> tuple[int, int]:
    """``(stop, bytes)`` with ``stop`` the largest offset <= ``end`` (clipped to
    the readable end) such that the records of ``[start, stop)`` total at most
    ``max_bytes`` stored bytes, but at least one record past ``start`` when
    there is one, so a budget smaller than a record still makes progress
    (engine lock held)."""
    earliest, visible = queue.index.earliest, queue.visible_end
    if not earliest <= start <= visible:
        raise InvalidArgument(
            f"start offset {start} for {queue.topic}/{queue.queue_id} outside "
            f"[{earliest}, {visible}]"
        )
    end = min(max(end, start), visible)
    offset, total = start, 0
    while offset < end:  # bounded: every round consumes >= 1 entry
        sizes = queue.index.record_sizes(offset, min(end - offset, _SIZES_PER_ROUND))
        if not sizes:
            break
        # sums[k] = bytes of [start, offset + k): a C-speed prefix sum + bisect.
        sums = list(itertools.accumulate(sizes, initial=total))
        taken = bisect.bisect_right(sums, max_bytes) - 1
        if offset == start:
            taken = max(taken, 1)
        if taken < len(sizes):
            return offset + taken, sums[taken]
        offset, total = offset + len(sizes), sums[-1]
    return offset, total
