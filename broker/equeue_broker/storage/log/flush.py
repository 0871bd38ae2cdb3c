"""Group commit: making log positions durable with as few fsyncs as possible.

A writer that needs position P durable calls ``make_durable(P)``. If no fsync
is running, it becomes the leader: it asks the log what an fsync would cover
now (the write position, which includes every record written so far by any
writer), fsyncs outside any lock, and publishes the new durable position.
Writers arriving while the leader is in ``fsync`` wait; when it returns, those
already covered are done and the first uncovered one leads the next fsync.
So N concurrent writers pay for about two fsyncs, not N. The leader also runs
``on_durable(position)`` (the store makes the records readable) before it
wakes the waiters.
"""

from __future__ import annotations

import bisect
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

SyncTarget = Callable[[], tuple[int, int]]
"""Returns (write position, fd to fsync) consistently, under the store's lock."""


FSYNC_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
"""Upper bounds (seconds) of the fsync-duration buckets; a last bucket counts the rest."""


class FsyncTimes:
    """How long the log's fsyncs took: counts per bucket and their sum.

    Updated by the fsync leader only (one at a time, ``GroupCommit``), so it
    needs no lock; readers take ``snapshot()`` (list copies are atomic under
    the GIL). Plain numbers: storage imports no metrics library, the server's
    collector converts them (a Prometheus histogram's cumulative buckets)."""

    def __init__(self, buckets: Sequence[float] = FSYNC_BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self._counts = [0] * (len(self.buckets) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self._sum += seconds

    def snapshot(self) -> tuple[list[int], float]:
        """(counts per bucket, not cumulative, the last one above every bound;
        the sum of the durations in seconds)."""
        return list(self._counts), self._sum


class GroupCommit:
    def __init__(
        self,
        target: SyncTarget,
        durable: int,
        on_durable: Callable[[int], None],
        sticky_errors: bool = False,
    ) -> None:
        self._target = target
        self._on_durable = on_durable
        self._cond = threading.Condition()
        self._leader = False
        self.durable = durable
        """Every log byte below this position has been fsynced."""
        self.fsyncs = 0
        self.prefill_syncs = 0
        self.times = FsyncTimes()
        """The duration of each fsync ``_sync_once`` ran."""
        self.sticky_errors = sticky_errors
        """After a failed fsync, fail every later call too: Linux may drop the
        dirty pages of a failed fsync and report success next time, so a later
        "success" proves nothing (sync mode; async mode logs and retries)."""
        self.error: OSError | None = None

    def make_durable(self, position: int, *, again: bool = False) -> int:
        """Return once ``position`` is durable; return the durable position.
        ``again``: sync the file even if ``position`` already is (what was
        written past the data end since, e.g. ``MessageLog.prefill``'s zeros)."""
        with self._cond:
            while self.durable < position or again:
                if self.error is not None and self.sticky_errors:
                    raise self.error
                if self._leader:
                    self._cond.wait(timeout=1.0)  # re-check; the leader always notifies
                    continue
                self._leader = True
                self._cond.release()
                covered = -1
                counted = not again
                again = False
                try:
                    covered = self._sync_once(counted)
                    # Publish before waking the waiters, so that each of them can
                    # return at once instead of taking more locks on the way out.
                    self._on_durable(covered)
                except OSError as exc:
                    self.error = exc
                    raise
                finally:
                    self._cond.acquire()
                    self._leader = False
                    self.durable = max(self.durable, covered)
                    self._cond.notify_all()
            return self.durable

    def _sync_once(self, counted: bool = True) -> int:
        """Sync the log; ``counted`` False: a sync of prefilled zeros, counted in
        ``prefill_syncs`` rather than ``fsyncs`` and the fsync times (what an
        append waits for)."""
        position, fd = self._target()
        started = time.perf_counter()
        # fdatasync: the chunk's size is fixed when it is created (sealing
        # fsyncs), and fdatasync still flushes what reading the data back needs
        # (block allocation, size); it skips the timestamps, whose journal
        # commit would cost as much as the data when the blocks are prefilled.
        os.fdatasync(fd)
        if not counted:
            self.prefill_syncs += 1
            return position
        self.times.observe(time.perf_counter() - started)
        self.fsyncs += 1
        return position


Then = Callable[[object], None]
"""Called on the committer thread with a request's outcome: its result, or the
exception it failed with."""


class _Request:
    __slots__ = ("done", "error", "result", "then", "work")

    def __init__(self, work: Callable[[], object], then: Then | None = None) -> None:
        self.work = work
        self.then = then
        # A bare lock, acquired now and released when the request is done: the
        # cheapest one-shot wake-up CPython has (threading.Event is pure Python).
        # A request with ``then`` has nobody blocked on it: no lock.
        self.done = threading.Lock()
        if then is None:
            self.done.acquire()
        self.result: object = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        if self.then is None:
            self.done.release()
            return
        try:
            self.then(self.result if self.error is None else self.error)
        except Exception:  # a caller's hand-off must not stop the committer
            log.exception("a sync append's completion callback failed")


class SyncCommitter:
    """Sync-mode appends, committed in rounds by one thread (RocketMQ's GroupCommitService).

    A caller submits its append as a callable and blocks. The committer thread
    takes every request queued so far, runs them back to back (no lock
    contention between appenders), makes the round durable with one fsync via
    ``make_durable``, then wakes each caller once. While the fsync runs, the
    next round queues up, so concurrent appenders share fsyncs without paying
    for a convoy on the store's locks.
    """

    MAX_ROUND = 4096
    """Requests per round: bounds the latency a round adds to its first request."""

    def __init__(
        self,
        run_round: Callable[[list[Callable[[], object]]], list[object]],
        after_round: Callable[[], object] | None = None,
    ) -> None:
        self._run_round = run_round
        self._after_round = after_round
        """Run once a round's callers are told, when no request is queued:
        work the next round need not wait for (the log's prefill)."""
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="equeue-commit", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], object], timeout_s: float) -> object:
        """Run ``work`` on the committer thread; return its result once durable."""
        if self._closed:
            raise RuntimeError("committer is closed")
        request = _Request(work)
        self._queue.put(request)
        if not request.done.acquire(timeout=timeout_s):
            raise TimeoutError(f"append not durable after {timeout_s} s")
        if request.error is not None:
            raise request.error
        return request.result

    def submit_then(self, work: Callable[[], object], then: Then) -> None:
        """Queue ``work`` without waiting: ``then(outcome)`` is called on the
        committer thread once it is durable (or failed). An event loop hands
        its appends over so, without a thread of its own blocked per append."""
        if self._closed:
            raise RuntimeError("committer is closed")
        self._queue.put(_Request(work, then))

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.MAX_ROUND:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # finish this round, then stop
                    break
                batch.append(item)
            self._commit(batch)
            if self._after_round is not None and self._queue.empty():
                try:
                    self._after_round()
                except Exception:  # its failure is the next round's (sticky fsync errors)
                    log.exception("work after a sync round failed")

    def _commit(self, batch: list[_Request]) -> None:
        try:
            outcomes = self._run_round([r.work for r in batch])
        except BaseException as exc:  # the fsync failed: nobody's append is durable
            for request in batch:
                request.error = exc
                request.finish()
            return
        for request, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                request.error = outcome
            else:
                request.result = outcome
            request.finish()

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish queued requests and stop the thread."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout_s)
