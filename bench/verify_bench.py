"""What verifying sealed log data on the way out costs a pull (issue 15).

Fills a store with sealed chunks, then times ``store.reads.read_records`` over the
whole queue: as the first reader of each chunk (``MessageLog.first_damaged``
runs CRC32C over every byte served: what verifying every pull would cost), as
a later reader (the chunk's watermark says it was verified), and with the
check disabled. Usage::

    .venv/bin/python -m bench.verify_bench [--values 100,1000,10000] [--mib 64] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from equeue_broker.storage import MessageBatch, StorageConfig, Store
from equeue_broker.storage.log.chunk import HEADER_SIZE
from equeue_broker.storage.log.message_log import MessageLog
from equeue_proto import accel


def _fill(store: Store, value_size: int, total: int) -> int:
    store.create_topic("bench", 1)
    batch = MessageBatch([bytes([7]) * value_size] * max(1, (256 << 10) // value_size))
    count = 0
    while count * value_size < total:
        count += store.append("bench", 0, batch).count
    return count


def _pull_all(store: Store, count: int) -> tuple[float, int]:
    offset, served = 0, 0
    started = time.perf_counter()
    while offset < count:
        result = store.reads.read_records(
            "bench", 0, offset, max_messages=10_000, max_bytes=4 << 20
        )
        offset, served = result.next_offset, served + len(result.records)
    return time.perf_counter() - started, served


def measure(value_size: int, mib: int, rounds: int = 7) -> dict[str, float]:
    """MB/s of a full pull of the queue, best of ``rounds`` (interleaved):
    "first read" (every chunk's watermark reset: the verification a first
    reader pays, the cost of verifying every pull), "verified before" (the
    watermarks at the end: later readers), "no check" (check disabled)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = StorageConfig(data_dir=Path(tmp), chunk_capacity_bytes=16 << 20)
        with Store(config, background=False) as store:
            count = _fill(store, value_size, mib << 20)
            store.flush()
            chunks = store._state.log.chunks
            checked = MessageLog.first_damaged
            best = {"first read": 1e9, "verified before": 1e9, "no check": 1e9}
            served = 0
            for _ in range(rounds):
                for chunk in chunks:
                    chunk.verified_end = HEADER_SIZE
                seconds, served = _pull_all(store, count)
                best["first read"] = min(best["first read"], seconds)
                best["verified before"] = min(best["verified before"], _pull_all(store, count)[0])
                MessageLog.first_damaged = lambda *_: None  # type: ignore[method-assign]
                try:
                    best["no check"] = min(best["no check"], _pull_all(store, count)[0])
                finally:
                    MessageLog.first_damaged = checked  # type: ignore[method-assign]
            return {mode: served / seconds / 1e6 for mode, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--values", default="100,1000,10000")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 20 MiB per size (a sealed chunk), one round",
    )
    args = parser.parse_args()
    rounds = 7
    if args.quick:
        args.mib, rounds = 20, 1
    print(f"codec: {accel.IMPLEMENTATION}, {args.mib} MiB of values per size")
    for size in (int(v) for v in args.values.split(",")):
        rates = measure(size, args.mib, rounds)
        print(f"value {size:>6} B: " + ", ".join(f"{m} {r:6.0f} MB/s" for m, r in rates.items()))


if __name__ == "__main__":
    main()
