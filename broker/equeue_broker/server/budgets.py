"""Byte budgets: how much memory requests in flight may pin at once.

A ``ByteBudget`` is an asyncio semaphore counted in bytes. A request takes
its size before it allocates (a produce before decoding its batch, a pull
stream before reading its next reply from the log, a woken parked pull before
its read) and gives it back when the memory is free again. Over budget a
caller waits, first come first served, for at most ``wait_s``, then gets
``LimitExceeded`` (RESOURCE_EXHAUSTED): back-pressure, never growth.

A request larger than the whole budget takes the whole budget (it waits until
it is alone), so a legal request is never refused for its size alone.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from equeue_broker.storage.errors import LimitExceeded


class ByteBudget:
    def __init__(self, name: str, limit: int, wait_s: float, unit: str = "bytes") -> None:
        self.name = name
        """The setting that sizes it, named in the refusal."""
        self.unit = unit
        """What it counts, for the refusal (a count of requests works the same way)."""
        self.limit = limit
        self.wait_s = wait_s
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, nbytes: int, wait_s: float | None = None) -> int:
        """Take ``nbytes`` (at most the whole budget); returns what was taken,
        to give back with ``release``. ``LimitExceeded`` after ``wait_s``."""
        taken = max(0, min(nbytes, self.limit))
        if not self._waiting and self.used + taken <= self.limit:
            self.used += taken
            return taken
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (taken, future)
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(future, self.wait_s if wait_s is None else wait_s)
        except TimeoutError:
            raise LimitExceeded(
                f"{self.name}: {self.used} of {self.limit} {self.unit} in use by other requests;"
                " retry later"
            ) from None
        except BaseException:
            if future.done() and not future.cancelled():
                self.release(taken)  # granted just as we were cancelled
            raise
        finally:
            if entry in self._waiting:
                self._waiting.remove(entry)
                self._wake()  # a large waiter leaving may unblock smaller ones
        return taken

    def release(self, taken: int) -> None:
        self.used -= taken
        self._wake()

    def _wake(self) -> None:
        """Grant waiters in order while they fit (FIFO: a large one is not starved)."""
        while self._waiting:
            taken, future = self._waiting[0]
            if future.done():
                self._waiting.popleft()
                continue
            if self.used + taken > self.limit:
                return
            self._waiting.popleft()
            self.used += taken
            future.set_result(None)

    @asynccontextmanager
    async def hold(self, nbytes: int, wait_s: float | None = None) -> AsyncIterator[int]:
        taken = await self.acquire(nbytes, wait_s)
        try:
            yield taken
        finally:
            self.release(taken)


class Held:
    """Bytes taken from a budget, given back at most once (shrunk once the real
    size is known: a read may return less than it was allowed)."""

    def __init__(self, budget: ByteBudget, taken: int) -> None:
        self._budget = budget
        self.taken = taken

    @classmethod
    async def take(cls, budget: ByteBudget, nbytes: int, wait_s: float | None = None) -> Held:
        return cls(budget, await budget.acquire(nbytes, wait_s))

    def shrink_to(self, nbytes: int) -> None:
        if nbytes < self.taken:
            self._budget.release(self.taken - nbytes)
            self.taken = nbytes

    def release(self) -> None:
        self.shrink_to(0)
