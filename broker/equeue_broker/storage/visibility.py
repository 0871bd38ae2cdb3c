"""When a written record becomes readable.

A record is readable once it is durable here (the flush mode's meaning:
fsynced with ``--flush sync``, written with ``--flush async``) AND ends at or
below the limit the server sets for sync replication: on a master, the lowest
log end of its in-sync replicas; on a replica, the high watermark its master
sent. Without a limit (None: async replication, or no replica in sync) a
record is readable once durable. The storage layer knows nothing of replicas.

``Visibility`` keeps the records written but not readable yet, as
``(log position after them, queue, the queue's index end)`` in log order,
and releases them as the durable end and the limit allow. Every call is made
with the store's lock held.
"""

from __future__ import annotations

from collections import deque

from equeue_broker.storage.index.queue_state import QueueState

Change = tuple[QueueState, int]
"""A queue whose readable end moved, and the new end."""


class Visibility:
    def __init__(self) -> None:
        self._held: deque[tuple[int, QueueState, int]] = deque()
        self.limit: int | None = None
        """The high-watermark limit (sync replication); None: none."""
        self.durable_seen = 0
        """Sync flush: the log position fsynced last (the store sets it)."""

    def hold(self, position: int, queue: QueueState, end: int) -> None:
        """``queue``'s records below offset ``end`` become readable once the
        log is durable and allowed up to ``position``."""
        self._held.append((position, queue, end))

    def cut(self, position: int) -> None:
        """The log was cut at ``position``: forget what was held beyond it."""
        self._held = deque(h for h in self._held if h[0] <= position)

    def high_watermark(self, durable_end: int) -> int:
        """Every record below it may be read: ``durable_end`` capped by the limit."""
        return durable_end if self.limit is None else min(durable_end, self.limit)

    def release(self, durable_end: int) -> list[Change]:
        """Make held records readable up to the high watermark; the queues whose
        readable end moved."""
        limit = self.high_watermark(durable_end)
        changed = []
        while self._held and self._held[0][0] <= limit:
            _, queue, end = self._held.popleft()
            if end > queue.visible_end:
                queue.visible_end = end
                changed.append((queue, end))
        return changed
