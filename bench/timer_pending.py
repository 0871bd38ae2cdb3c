"""Delayed delivery at rest: memory and reopen time of a store holding many pending messages.

Run ``python bench/timer_pending.py`` (10 million pending messages of 100 B,
due over 7 days: a few minutes and about 2 GB of disk per store; ``--count
N`` for another volume, ``--quick`` for 200,000). Three stores: plain (not
delayed) messages, delayed ones with one due time per batch of 1,000, and
delayed ones each with its own due time (the worst case for the timer index:
every entry in another slot); the difference to plain is what pending
messages cost. Each figure is taken in a fresh process (``RssAnon`` of
/proc/self/status: the anonymous memory the broker's budget counts; the timer
index is files and a shared map, page cache only).

Rows: append rate (messages/s, async mode, batches of 1,000), RssAnon after
the last append, reopen time (``Store(...)`` until it returns, after a clean
close) and RssAnon after the reopen and a ``delayed_summary()``. Target
(issue 27): 10 M pending within 512 MiB RssAnon, reopen < 2 s beside the
store without them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from equeue_broker.storage import FlushMode, MessageBatch, StorageConfig, Store

SPREAD_MS = 7 * 24 * 3600 * 1000 - 3_600_000
"""Due times spread over (nearly) the default maximum delay of 7 days."""
BATCH = 1000
QUEUES = 4


def rss_anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def config(directory: Path) -> StorageConfig:
    return StorageConfig(data_dir=directory, flush_mode=FlushMode.ASYNC)


def fill(directory: Path, count: int, delayed: str) -> dict[str, float]:
    """Append ``count`` messages (delayed "message": each its own due time over
    the next 7 days; "batch": one per batch)."""
    store = Store(config(directory), background=False)
    store.create_topic("t", QUEUES)
    values = [os.urandom(100) for _ in range(BATCH)]
    now = int(time.time() * 1000)
    started = time.monotonic()
    for i in range(0, count, BATCH):
        due = None
        if delayed == "message":  # spread over the week
            due = [now + 60_000 + (j * 7919 * 613) % SPREAD_MS for j in range(i, i + BATCH)]
        elif delayed == "batch":
            due = [now + 60_000 + (i * 7919) % SPREAD_MS]
        store.append("t", i // BATCH % QUEUES, MessageBatch(values), deliver_at_ms=due)
        if i // BATCH % 100 == 99:
            store.flush()  # what the background thread does every 100 ms
    seconds = time.monotonic() - started
    rss = rss_anon_mib()
    pending = store.delayed_summary()[0]
    store.close()
    return {"append_per_s": count / seconds, "rss_after_fill_mib": rss, "pending": pending}


def reopen(directory: Path) -> dict[str, float]:
    started = time.monotonic()
    store = Store(config(directory), background=False)
    seconds = time.monotonic() - started
    pending, _ = store.delayed_summary()
    store.delayed_summary("t")
    rss = rss_anon_mib()
    store.close()
    return {"reopen_s": seconds, "rss_after_reopen_mib": rss, "pending": pending}


def child(argv: list[str]) -> dict[str, float]:
    """Run one step in a fresh interpreter (so RssAnon is that step's)."""
    out = subprocess.run(
        [sys.executable, __file__, "--step", *argv], check=True, capture_output=True, text=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=10_000_000)
    parser.add_argument("--quick", action="store_true", help="200,000 messages")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go")
    parser.add_argument("--step", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        step, directory, count = args.step
        if step.startswith("fill-"):
            result = fill(Path(directory), int(count), step.removeprefix("fill-"))
        else:
            result = reopen(Path(directory))
        print(json.dumps(result))
        return 0
    count = 200_000 if args.quick else args.count
    root = Path(tempfile.mkdtemp(prefix="timer-bench-", dir=args.dir))
    try:
        rows = []
        steps = (
            ("plain", "fill-plain"),
            ("delayed, a time per batch", "fill-batch"),
            ("delayed, a time per message", "fill-message"),
        )
        for name, step in steps:
            directory = root / step
            filled = child([step, str(directory), str(count)])
            opened = child(["reopen", str(directory), str(count)])
            rows.append((name, filled, opened))
            shutil.rmtree(directory)
        print(f"{count:,} messages of 100 B, {QUEUES} queues; delayed: due over 7 days\n")
        print("| store | append msg/s | RssAnon after appends | reopen | RssAnon after reopen "
              "| pending |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|")
        for name, filled, opened in rows:
            print(
                f"| {name} | {filled['append_per_s']:,.0f} | {filled['rss_after_fill_mib']:.0f} "
                f"MiB | {opened['reopen_s']:.2f} s | {opened['rss_after_reopen_mib']:.0f} MiB "
                f"| {int(opened['pending']):,} |"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
