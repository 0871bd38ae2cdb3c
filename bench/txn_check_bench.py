"""Transaction check-back benchmark: one round of checks over 10,000 open
transactions of a producer group whose producers are all gone.

Run ``python bench/txn_check_bench.py`` (``make bench-txn-check``; a few
seconds; ``--transactions N`` for another count; ``--quick``: 2,000, two
ticks). In one process, on a real
``Store`` in a temporary directory: N transactions of one 100 B message each are
staged with producer group "dead-svc", then the broker's own
``TransactionChecker`` (server/txn_checks.py) ticks with a clock past their
first check until every one is checked once (at most 1,000 checks a tick: the
broker ticks once a second, so a round of 10,000 takes 10 ticks there). Two
cases: nobody connected (every check record says "none") and one producer's
stream connected (a task drains it, as gRPC would). Reported: the storage and
scheduling time of the round (the ticks' own time, not the 1 s between
them), checks per second, and the log bytes the check records took.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from equeue_broker.server.txn_checks import CheckStreams, TransactionChecker
from equeue_broker.storage import MessageBatch, Store
from equeue_broker.storage.config import StorageConfig, TransactionConfig

GROUP = "dead-svc"


async def _to_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def _staged(directory: Path, count: int) -> Store:
    config = StorageConfig(
        data_dir=directory, transactions=TransactionConfig(max_open=max(count, 10_000))
    )
    store = Store(config, background=False)
    store.create_topic("orders", 4)
    value = b"x" * 100
    for i in range(count):
        store.transactions.stage(
            f"txn-{i}", "orders", [(i % 4, MessageBatch([value]))], group=GROUP
        )
    return store


async def _round(store: Store, connected: bool) -> tuple[float, int, int]:
    """(seconds in ticks, ticks, checks sent) of one round of first checks."""
    streams = CheckStreams(1024)
    checker = TransactionChecker(store, streams, "bench", _to_thread)
    checker.set_active(True)  # a master's checker
    drain = None
    if connected:
        stream = streams.open(GROUP, "bench", "")

        async def drained() -> None:
            while True:
                await stream.queue.get()

        drain = asyncio.ensure_future(drained())
    now = int(time.time() * 1000) + store.transactions.config.check_after_ms + 1
    spent, ticks = 0.0, 0
    for _ in range(10_000):  # bounded: a round needs count / 1,000 ticks
        if not any(t.checks == 0 for t in store.transactions.list_open()):
            break
        started = time.perf_counter()
        await checker.tick(now)
        spent += time.perf_counter() - started
        ticks += 1
        await asyncio.sleep(0)  # the drain runs between ticks, as on the broker
    if drain is not None:
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drain
    return spent, ticks, checker.sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 transactions")
    args = parser.parse_args()
    count = 2_000 if args.quick else args.transactions
    rows = []
    for connected in (False, True):
        with tempfile.TemporaryDirectory(prefix="equeue-txn-check-") as tmp:
            store = _staged(Path(tmp) / "data", count)
            before = store.log_end
            spent, ticks, sent = asyncio.run(_round(store, connected))
            used = store.log_end - before
            store.close()
        case = "one producer connected" if connected else "nobody connected"
        rows.append((case, count, ticks, spent, count / spent, used, used / count, sent))
    header = ("case", "transactions", "ticks", "tick time s", "checks/s", "log bytes",
              "B/check", "sent")  # fmt: skip
    widths = [24, 12, 6, 11, 10, 10, 8, 6]
    print(
        "  ".join(
            h.rjust(w) if i else h.ljust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    for case, n, ticks, spent, rate, used, per, sent in rows:
        cells = (case.ljust(24), f"{n:12,}", f"{ticks:6}", f"{spent:11.3f}", f"{rate:10,.0f}",
                 f"{used:10,}", f"{per:8.1f}", f"{sent:6,}")  # fmt: skip
        print("  ".join(cells))


if __name__ == "__main__":
    main()
