"""Parked pulls: a pull that finds nothing waits on a future, not a thread.

The store calls ``notify_threadsafe`` from whichever thread made records
readable; the event loop then resolves the futures of pulls waiting on that
queue (at once when that thread is the loop's: an async-mode append). A wait
is bounded by its timeout and by ``max_parked``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from equeue_broker.server.errors import TooManyPulls

QueueKey = tuple[str, int]


class PullWaiters:
    def __init__(self, loop: asyncio.AbstractEventLoop, max_parked: int) -> None:
        self._loop = loop
        self._thread = threading.get_ident()
        """The loop's thread (this is built on it)."""
        self._max_parked = max_parked
        self._waiting: dict[QueueKey, list[tuple[int, asyncio.Future[None]]]] = {}
        self.parked = 0
        self.woken = False
        """Set when pulls were woken; a produce on the loop clears it and lets
        them answer before its own reply goes out (``yield_to_woken``)."""

    def notify_threadsafe(self, topic: str, queue_id: int, end: int) -> None:
        """Store listener: ``end`` is the queue's new readable end (any thread)."""
        if (topic, queue_id) not in self._waiting:  # racy read, re-checked on the loop
            return
        if threading.get_ident() == self._thread:
            # An append on the loop (async flush): wake the pulls now, without a
            # self-pipe write and a loop pass before they are even scheduled.
            self._notify((topic, queue_id), end)
        else:
            self._loop.call_soon_threadsafe(self._notify, (topic, queue_id), end)

    def _notify(self, key: QueueKey, end: int) -> None:
        waiters = self._waiting.get(key)
        if not waiters:
            return
        remaining = []
        for known_end, future in waiters:
            if end > known_end:
                if not future.done():
                    future.set_result(None)
                    self.woken = True
            else:
                remaining.append((known_end, future))
        if remaining:
            self._waiting[key] = remaining
        else:
            del self._waiting[key]

    async def yield_to_woken(self) -> None:
        """On the loop, after an append: if it woke parked pulls, one loop pass
        so that they read and answer first; the appender's own reply (which
        nobody waits for to see the records) follows. Free when none was woken."""
        if self.woken:
            self.woken = False
            await asyncio.sleep(0)

    async def wait(
        self, key: QueueKey, known_end: int, timeout_s: float, current_end: Callable[[], int]
    ) -> bool:
        """Wait until the queue's end passes ``known_end``; False on timeout.

        ``current_end`` is checked after registering, so records that arrived
        between the caller's read and this call are not missed.
        """
        if self.parked >= self._max_parked:
            raise TooManyPulls(
                f"max_parked_pulls: {self.parked} pulls are parked already ({self._max_parked}"
                " allowed); retry later or pull with a shorter max_wait_ms"
            )
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiting.setdefault(key, []).append((known_end, future))
        self.parked += 1
        try:
            if current_end() > known_end:
                return True
            # asyncio.timeout, not wait_for: woken, the pull runs on the next loop
            # pass, not after another one through wait_for's own waiter (issue 31).
            async with asyncio.timeout(timeout_s):
                await future
            return True
        except TimeoutError:
            return False
        finally:
            self.parked -= 1
            self._forget(key, future)

    def _forget(self, key: QueueKey, future: asyncio.Future[None]) -> None:
        waiters = self._waiting.get(key)
        if waiters is None:
            return
        waiters[:] = [(e, f) for e, f in waiters if f is not future]
        if not waiters:
            del self._waiting[key]
