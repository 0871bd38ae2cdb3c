"""A stream's writes in order with overlapping confirmations (replication/pipelined.py),
run on a real event loop: replies in request order, each only once confirmed,
at most ``window`` unconfirmed, the first failure after the earlier replies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from equeue_broker.replication.pipelined import confirmed_in_order


async def numbers(count: int, fail_at: int | None = None) -> AsyncIterator[int]:
    for i in range(count):
        if i == fail_at:
            raise ValueError(f"request {i} is bad")
        yield i


class Writes:
    """Writes that record their order; confirmed when the test says."""

    def __init__(self, refuse: int | None = None) -> None:
        self.written: list[int] = []
        self.pending: dict[int, asyncio.Future[str]] = {}
        self.refuse = refuse

    async def write(self, i: int) -> asyncio.Future[str]:
        if i == self.refuse:
            raise RuntimeError(f"write {i} refused")
        self.written.append(i)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending[i] = future
        return future

    def confirm(self, i: int) -> None:
        self.pending[i].set_result(f"reply {i}")


def test_replies_in_order_each_once_confirmed_at_most_window_waiting() -> None:
    async def run() -> None:
        writes = Writes()
        replies: list[str] = []

        async def consume() -> None:
            async for reply in confirmed_in_order(numbers(10), writes.write, window=3):
                replies.append(reply)

        task = asyncio.ensure_future(consume())
        for _ in range(50):  # bounded: let the writer run until the window is full
            await asyncio.sleep(0)
        assert writes.written == [0, 1, 2] and replies == []  # the window: 3 unconfirmed
        writes.confirm(1)  # out of order: reply 1 must wait for reply 0
        for _ in range(20):
            await asyncio.sleep(0)
        assert replies == []
        writes.confirm(0)
        for _ in range(20):
            await asyncio.sleep(0)
        assert replies == ["reply 0", "reply 1"]
        assert writes.written == [0, 1, 2, 3, 4]
        for i in range(2, 10):
            for _ in range(20):
                await asyncio.sleep(0)
            writes.confirm(i)
        await asyncio.wait_for(task, 5)
        assert replies == [f"reply {i}" for i in range(10)]

    asyncio.run(run())


@pytest.mark.parametrize("failure", ["write", "request"])
def test_the_first_failure_ends_the_stream_after_the_earlier_replies(failure: str) -> None:
    async def run() -> None:
        writes = Writes(refuse=3 if failure == "write" else None)
        replies: list[str] = []
        requests = numbers(10, fail_at=3 if failure == "request" else None)
        stream = confirmed_in_order(requests, writes.write, window=8)

        async def consume() -> None:
            async for reply in stream:
                replies.append(reply)

        task = asyncio.ensure_future(consume())
        for _ in range(50):
            await asyncio.sleep(0)
        assert writes.written == [0, 1, 2]  # nothing after the failure is written
        for i in range(3):
            writes.confirm(i)
        with pytest.raises((RuntimeError, ValueError), match="3"):
            await asyncio.wait_for(task, 5)
        assert replies == ["reply 0", "reply 1", "reply 2"]

    asyncio.run(run())


def test_a_stream_closed_early_cancels_the_waits_it_leaves() -> None:
    async def run() -> None:
        writes = Writes()
        stream = confirmed_in_order(numbers(5), writes.write, window=8)
        writes_done = asyncio.ensure_future(stream.__anext__())
        for _ in range(50):
            await asyncio.sleep(0)
        assert writes.written == [0, 1, 2, 3, 4]
        writes.confirm(0)
        assert await asyncio.wait_for(writes_done, 5) == "reply 0"
        await stream.aclose()  # the client went away
        assert all(writes.pending[i].cancelled() for i in range(1, 5))

    asyncio.run(run())
