"""A descriptor budget for queue index files: ``IndexFiles``.

Every queue keeps its index chunk files open for appends and reads, so a
broker with tens of thousands of queues would run out of descriptors (which
connections and the log need too). ``IndexFiles`` counts the index files one
store has open and, past ``limit``, closes the least recently used; the index
opens it again when it needs it (``QueueIndex._fd``).

Safe because every index call runs under the store lock (queue_state.py), one
store per data directory, and each caller uses the descriptor ``_fd`` returned
before asking for another: a descriptor is never closed under its user. A
dirty chunk closed before its fsync is opened again for that fsync (Linux
flushes a file's dirty pages whichever descriptor asks).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import ClassVar, Protocol


class Evictable(Protocol):
    def _evict(self, number: int) -> None: ...


class IndexFiles:
    _by_dir: ClassVar[dict[Path, IndexFiles]] = {}

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: collections.OrderedDict[tuple[int, int], Evictable] = collections.OrderedDict()

    @classmethod
    def for_dir(cls, data_dir: Path, limit: int) -> IndexFiles:
        """The one budget of the store over ``data_dir``."""
        files = cls._by_dir.setdefault(data_dir.resolve(), cls(limit))
        files.limit = limit
        return files

    def __len__(self) -> int:
        return len(self._open)

    def used(self, index: Evictable, number: int) -> None:
        self._open.move_to_end((id(index), number))

    def opened(self, index: Evictable, number: int) -> None:
        """Count a new descriptor; close the least recently used past the limit
        (never this one: it is the most recent)."""
        self._open[(id(index), number)] = index
        while len(self._open) > max(1, self.limit):
            (_, victim_number), victim = self._open.popitem(last=False)
            victim._evict(victim_number)

    def closed(self, index: Evictable, number: int) -> None:
        self._open.pop((id(index), number), None)
