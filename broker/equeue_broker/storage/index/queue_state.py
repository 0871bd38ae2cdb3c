"""The in-memory state of one open queue: its index and how far readers may go.

The store, recovery, reads and retention all work on these; they live here,
below all of them, so that none of those modules has to import another for it.
A ``QueueState`` is guarded by the store lock: change its fields only with the
lock held (``visible_end`` alone is also read without it, as a snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from equeue_broker.storage.index.index_files import IndexFiles
from equeue_broker.storage.index.queue_index import Deferred, QueueIndex

QueueKey = tuple[str, int]
"""(topic, queue id)."""


@dataclass
class QueueState:
    topic: str
    topic_bytes: bytes
    queue_id: int
    index: QueueIndex
    visible_end: int = 0
    producer_visible: bool = True
    """Cached from the topic metadata, for the append hot path."""
    notified_end: int = 0
    """Highest visible end announced to listeners."""
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Full index chunk number -> (lowest, highest) log position its entries
    point at: retention's cache (retention.py; a full chunk never changes)."""


def open_queue(
    data_dir: Path,
    entries_per_chunk: int,
    topic: str,
    queue_id: int,
    max_open_files: int = 0,
    *,
    files: IndexFiles | None = None,
    deferred: Deferred | None = None,
) -> QueueState:
    """Open (creating if need be) the index of ``topic``/``queue_id`` under
    ``data_dir``; ``max_open_files`` > 0: the store's index files share that
    descriptor budget (index_files.py), or ``files``, that budget already
    looked up. ``deferred``: open its files at first use (queue_index.py)."""
    # A string, not a Path (several times the cost): a restart makes one per queue.
    directory = f"{data_dir}/index/{topic}/{queue_id}"
    if files is None and max_open_files > 0:
        files = IndexFiles.for_dir(data_dir, max_open_files)
    index = QueueIndex(directory, entries_per_chunk, files, deferred=deferred)
    return QueueState(topic, topic.encode(), queue_id, index)


def first_offset_at(queue: QueueState, position: int) -> int:
    """The first readable offset of ``queue`` whose record lies at or after log
    ``position`` (its ``visible_end`` if none): a queue's records are in log
    order, so a binary search over its index (lock held)."""
    low, high = queue.index.earliest, queue.visible_end
    while low < high:
        middle = (low + high) // 2
        if queue.index.entry(middle)[0] - 1 < position:  # an entry holds position + 1
            low = middle + 1
        else:
            high = middle
    return low
