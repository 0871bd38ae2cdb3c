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
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc

from equeue_broker.server.errors import abort
from equeue_broker.storage.errors import LimitExceeded

log = logging.getLogger("equeue.broker")


class ByteBudget:
    def __init__(self, name: str, limit: int, wait_s: float, unit: str = "bytes") -> None:
        self.name = name
        """The setting that sizes it, named in the refusal."""
        self.unit = unit
        """What it counts, for the refusal (a count of requests works the same way)."""
        self.limit = limit
        self.wait_s = wait_s
        self.used = 0
        self.waited = 0
        """Requests that had to wait for room (contention only: not the fast path)."""
        self.refused = 0
        """Requests refused after waiting ``wait_s`` (``LimitExceeded``)."""
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
        self.waited += 1
        try:
            await asyncio.wait_for(future, self.wait_s if wait_s is None else wait_s)
        except TimeoutError:
            self.refused += 1
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


class StalledStream:
    """Ends a reply stream whose client does not take a reply in time.

    gRPC resumes a streaming handler only once its client has taken the last
    reply, so a client that never reads would keep that reply's bytes (and
    budget) for as long as the call lives. ``watch`` starts a timer when a
    reply is handed to gRPC and ``taken`` stops it when the handler is
    resumed. If it fires first, the call is aborted with RESOURCE_EXHAUSTED
    (from a task of its own: the handler's is blocked in gRPC's write), and,
    because gRPC's Python server cannot cancel a call and would keep the
    unsent reply queued in front of that status for as long as the client
    stays connected, the client's connection is shut down (``close``); only
    then do the bytes go back to the budget.
    """

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any], timeout_s: float,
                 what: str, close: Callable[[str], bool]) -> None:  # fmt: skip
        self.context = context
        self.close = close
        """Shuts down the connection of a peer (``context.peer()``)."""
        self.timeout_s = timeout_s
        self.what = what
        """The stream's topic and queue, for the log and the status."""
        self.stalled = False
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._ending: asyncio.Task[None] | None = None
        self._held: Held | None = None
        """The reply handed to gRPC and not taken yet (None: none)."""
        self._since = 0.0

    def watch(self, held: Held) -> None:
        """A reply was handed to gRPC now. One timer serves many replies: it is
        set only when none is pending and, when it fires for a reply that was
        taken meanwhile, set again for the one watched now (a timer per reply,
        set and cancelled, was a measurable part of a streamed reply's cost)."""
        self._held = held
        self._since = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(self._since + self.timeout_s, self._check)

    def taken(self) -> None:
        self._held = None

    def stop(self) -> None:
        """The stream ended: no more checks."""
        self._held = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        held = self._held
        if held is None:  # nothing waits in gRPC now: the next watch sets the timer
            return
        due = self._since + self.timeout_s
        if self._loop.time() < due:  # a later reply, watched since less long
            self._timer = self._loop.call_at(due, self._check)
            return
        self._stall(held)

    def _stall(self, held: Held) -> None:
        self.stalled = True
        log.warning(
            "ending the pull stream of %s and closing its connection %s: its client took no"
            " reply for %g s (stream_send_timeout_ms); %d bytes of max_reply_bytes given back",
            self.what, self.context.peer(), self.timeout_s, held.taken,
        )  # fmt: skip
        self._ending = self._loop.create_task(self._end(held))

    async def _end(self, held: Held) -> None:
        # The status waits behind the unsent reply, so the abort does not end
        # before the connection does: close it without waiting.
        aborting = self._loop.create_task(self._abort())
        try:
            await asyncio.to_thread(self.close, self.context.peer())
            await asyncio.wait_for(aborting, self.timeout_s)
        except TimeoutError:
            log.warning("the pull stream of %s did not end after its connection closed", self.what)
        finally:
            held.release()

    async def _abort(self) -> None:
        refusal = LimitExceeded(
            f"max_reply_bytes: the client took no reply of the pull stream of {self.what} for"
            f" {self.timeout_s:g} s (stream_send_timeout_ms); read the stream as it comes,"
            " or ask for smaller batch_bytes"
        )
        with contextlib.suppress(grpc.aio.AbortError, grpc.aio.UsageError):
            await abort(self.context, refusal)
