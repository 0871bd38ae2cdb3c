"""Group commit: making log positions durable with as few fsyncs as possible.

A writer that needs position P durable calls ``make_durable(P)``. If no fsync
is running, it becomes the leader: it asks the log what an fsync would cover
now (the write position, which includes every record written so far by any
writer), fsyncs outside any lock, and publishes the new durable position.
Writers arriving while the leader is in ``fsync`` wait; when it returns, those
already covered are done and the first uncovered one leads the next fsync.
So N concurrent writers pay for about two fsyncs, not N.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

SyncTarget = Callable[[], tuple[int, int]]
"""Returns (write position, fd to fsync) consistently, under the store's lock."""


class GroupCommit:
    def __init__(self, target: SyncTarget, durable: int) -> None:
        self._target = target
        self._cond = threading.Condition()
        self._leader = False
        self.durable = durable
        """Every log byte below this position has been fsynced."""
        self.fsyncs = 0

    def make_durable(self, position: int) -> int:
        """Return once ``position`` is durable; return the durable position."""
        with self._cond:
            while self.durable < position:
                if self._leader:
                    self._cond.wait(timeout=1.0)  # re-check; the leader always notifies
                    continue
                self._leader = True
                self._cond.release()
                covered = -1
                try:
                    covered = self._sync_once()
                finally:
                    self._cond.acquire()
                    self._leader = False
                    self.durable = max(self.durable, covered)
                    self._cond.notify_all()
            return self.durable

    def _sync_once(self) -> int:
        position, fd = self._target()
        os.fsync(fd)
        self.fsyncs += 1
        return position
