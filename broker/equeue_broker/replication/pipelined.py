"""A stream's writes in order, their confirmations overlapping (sync replication).

With ``--replication sync`` a produce is acknowledged only once the in-sync
replicas have it. Written and confirmed one batch at a time, a ``ProduceStream``
would wait a whole replica round trip per batch, with the master idle. Here
the stream's batches are written one after the other, as they arrive, and each
write's confirmation (``InSyncSet.begin``'s task) is waited for beside the next
writes: replies still leave in request order, each only when confirmed.

At most ``window`` writes of a stream wait for confirmation at once; then the
stream reads no further request until the oldest is confirmed (gRPC's flow
control then holds the client back). The first failure (a refused or failed
write, a confirmation that did not come) ends the stream after the replies of
the batches before it, as the serial loop did; no later request is written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

Request = TypeVar("Request")
Reply = TypeVar("Reply")

WINDOW = 16
"""Default: most writes of one stream waiting for their confirmation."""


async def confirmed_in_order(
    requests: AsyncIterator[Request],
    write: Callable[[Request], Awaitable[asyncio.Future[Reply]]],
    window: int = WINDOW,
) -> AsyncGenerator[Reply, None]:
    """For each request, ``write(request)`` (in order, one at a time), which
    returns the future of its confirmed reply; yield the replies in order."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(window)  # taken before a request is read, back when confirmed
    waiting: asyncio.Queue[asyncio.Future[Reply] | None] = asyncio.Queue()

    async def write_all() -> None:
        try:
            while True:
                await slots.acquire()
                try:
                    request = await anext(requests)
                except StopAsyncIteration:
                    break
                waiting.put_nowait(await write(request))
        except Exception as exc:  # reported in its turn, after the earlier replies
            failed: asyncio.Future[Reply] = loop.create_future()
            failed.set_exception(exc)
            waiting.put_nowait(failed)
            return
        waiting.put_nowait(None)

    writer = asyncio.ensure_future(write_all())
    try:
        while (future := await waiting.get()) is not None:
            try:
                reply = await future
            finally:
                slots.release()
            yield reply
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        while not waiting.empty():  # the stream ended early: nobody awaits these
            left = waiting.get_nowait()
            if left is not None and not left.done():
                left.cancel()
            elif left is not None and not left.cancelled():
                left.exception()  # retrieved: no "never retrieved" warning
