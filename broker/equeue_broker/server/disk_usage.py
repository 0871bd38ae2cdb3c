"""The data directory's size and its file system's room, cheap enough to poll.

``GetStats`` (and a metrics scrape every 15 s) report the bytes the data
directory uses: a walk of every file (``os.walk`` + ``stat``), fine for a
CLI call but not with 10^5 files every few seconds, so the figure is cached
for ``ttl_s`` (30 s). The file system's free and total bytes are one
``statvfs`` and are read every time.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

DISK_USAGE_TTL_S = 30.0
"""How long a measured data-directory size is reported again before a new walk."""


class DiskUsage:
    """The cached size of data directories (one per broker: its own)."""

    def __init__(self, ttl_s: float = DISK_USAGE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()  # admin calls and scrapes run on several threads
        self._cached: dict[Path, tuple[float, int]] = {}

    def used(self, root: Path) -> int:
        """Bytes allocated to files under ``root``, measured at most ``ttl_s`` ago."""
        now = time.monotonic()
        with self._lock:
            found = self._cached.get(root)
        if found is not None and now - found[0] < self.ttl_s:
            return found[1]
        size = walk_usage(root)  # outside the lock: a walk may take a while
        with self._lock:
            self._cached[root] = (now, size)
        return size


def walk_usage(root: Path) -> int:
    """Bytes allocated to files under ``root`` (sparse chunks count what they use)."""
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:  # deleted by retention meanwhile
                continue
    return total


def filesystem(root: Path) -> tuple[int, int]:
    """(bytes a non-root writer may still use, total bytes) of ``root``'s file
    system (``statvfs``: ``f_bavail``, ``f_blocks`` times ``f_frsize``)."""
    fs = os.statvfs(root)
    return fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
