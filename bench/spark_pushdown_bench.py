"""Spark filter pushdown benchmark: a batch read of 1% of a topic against a full read.

Run ``python bench/spark_pushdown_bench.py`` (``make bench-pushdown``; about 8
minutes here, most of it the full reads; ``--quick`` for a smoke run of 40,000
messages, one round, without the untimed run and row count of each scenario;
``--messages N``; ``--repeat N`` reports medians of N rounds, 3 by default).
It starts one broker (async flush) on 127.0.0.1 in a temporary directory and
one local Spark session (``local[2]``) with
``spark.sql.python.filterPushdown.enabled`` on; both are stopped and the
directory removed at the end.

The topic: ``--messages`` messages (default 20,000,000, so that a 1% read
takes well above Spark's fixed cost of a query) of 100 random bytes with
10-byte keys over 4 queues, produced as ``spark_bench.py`` fills its read
topic (10,000-message batches, queue round robin by batch; no producer
timestamps, so ``timestamp`` is the store time). Every scenario is one
``spark.read.format("equeue")`` batch query written to the ``noop`` sink
(every column materialized), timed from the action's start to its end:

* full read: no filter (the baseline, ``1.00x``);
* ``offset`` 1%: ``offset >= a and offset < b`` around the middle of every
  queue (pushed: the planner reads only ``[a, b)``);
* ``storeTimestamp`` 1%: a store-time window holding at least 1% of the
  records (pushed: offsets found with ``ListOffsets`` by timestamp);
* ``timestamp`` 1%: the same window on the producer time (pushed as a broker
  filter: the broker inspects every record in C and sends 1%), reported
  separately: it is not a range read;
* ``offset`` 1% with pushdown off: the same query as above, Spark filtering
  what the source reads (everything), for reference;
* nothing: ``queue < 0`` plans no partition: Spark's fixed cost of a query
  (planning in a Python worker, one empty task), the floor of every ratio.

Target (issue 28): the two 1% range reads take <= 0.1x the full read's time.
Before the timed rounds, one untimed run of every scenario (Python workers,
JIT, page cache); the rounds rotate the order of the scenarios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._measure import progress
from bench._spark_setup import QUEUES, RPC_TIMEOUT_S, fill_topic, settle
from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, Producer
from equeue_spark.spark.pushdown import CONF
from equeue_spark.spark.testing import local_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TOPIC = "pushdown"
SIZE = 100
SHARE = 0.01
TARGET = 0.1


@dataclass(frozen=True)
class Scenario:
    name: str
    where: str
    pushdown: bool = True
    target: float | None = None


def store_window(admin: Admin, total: int) -> tuple[int, int]:
    """``[lo, hi)`` ms of store time around the middle of the topic holding at
    least ``SHARE`` of its records (counted with ``ListOffsets`` by timestamp)."""
    queue = admin.list_topic_offsets(TOPIC).queues[0]
    middle = (queue.earliest_offset + queue.end_offset) // 2
    lo = admin.get_message_at(TOPIC, 0, middle).store_timestamp_ms
    last = admin.get_message_at(TOPIC, 0, queue.end_offset - 1).store_timestamp_ms + 1

    def selected(hi: int) -> int:
        at_lo = admin.list_topic_offsets(TOPIC, lo).queues
        at_hi = admin.list_topic_offsets(TOPIC, hi).queues
        pairs = zip(at_lo, at_hi, strict=True)
        return sum(b.timestamp_offset - a.timestamp_offset for a, b in pairs)

    low, high = lo + 1, last  # the smallest hi that selects enough: a binary search
    while low < high:
        mid = (low + high) // 2
        if selected(mid) >= total * SHARE:
            high = mid
        else:
            low = mid + 1
    return lo, low


def scenarios(admin: Admin, total: int) -> list[Scenario]:
    per_queue = total // QUEUES
    a = per_queue // 2
    b = a + max(1, int(per_queue * SHARE))
    lo, hi = store_window(admin, total)
    offsets = f"offset >= {a} and offset < {b}"
    return [
        Scenario("full read", ""),
        Scenario("offset 1% (pushed)", offsets, target=TARGET),
        Scenario(
            "storeTimestamp 1% (pushed)",
            f"storeTimestamp >= timestamp_millis({lo}) and storeTimestamp < timestamp_millis({hi})",
            target=TARGET,
        ),
        Scenario(
            "timestamp 1% (broker filter)",
            f"timestamp >= timestamp_millis({lo}) and timestamp < timestamp_millis({hi})",
        ),
        Scenario("offset 1%, pushdown off", offsets, pushdown=False),
        Scenario("nothing (queue < 0)", "queue < 0"),
    ]


def frame(spark: SparkSession, address: str, where: str) -> DataFrame:
    df = (
        spark.read.format("equeue")
        .option("broker", address)
        .option("topic", TOPIC)
        .option("timeoutMs", str(int(RPC_TIMEOUT_S * 1000)))
        .load()
    )
    return df.where(where) if where else df


def timed(spark: SparkSession, address: str, s: Scenario) -> float:
    spark.conf.set(CONF, "true" if s.pushdown else "false")
    df = frame(spark, address, s.where)
    settle(spark)
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def run(args: argparse.Namespace, workdir: Path) -> None:
    broker = BrokerProcess(workdir / "data")
    broker.start()
    spark = local_session(
        "equeue-pushdown-bench", **{"spark.ui.showConsoleProgress": "false", CONF: "true"}
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with Admin(broker.address) as admin, Producer(broker.address) as producer:
            progress(f"producing {args.messages:,} messages of {SIZE} B")
            fill_topic(admin, producer, TOPIC, SIZE, args.messages)
            plan = scenarios(admin, args.messages)
        rows: dict[str, int | None] = {s.name: None for s in plan}
        for s in plan if not args.quick else []:  # untimed: warm-up, the rows each selects
            spark.conf.set(CONF, "true" if s.pushdown else "false")
            rows[s.name] = frame(spark, broker.address, s.where).count()
            timed(spark, broker.address, s)
        times: dict[str, list[float]] = {s.name: [] for s in plan}
        for r in range(args.repeat):
            order = plan[r % len(plan) :] + plan[: r % len(plan)]
            for s in order:
                times[s.name].append(timed(spark, broker.address, s))
                progress(f"round {r + 1}: {s.name}: {times[s.name][-1]:.2f} s")
        report(plan, rows, {n: statistics.median(t) for n, t in times.items()}, args)
    finally:
        spark.stop()
        broker.kill()


def report(
    plan: list[Scenario], rows: dict[str, int | None], seconds: dict[str, float],
    args: argparse.Namespace,
) -> None:  # fmt: skip
    full = seconds[plan[0].name]
    print(f"\nSpark filter pushdown: {args.messages:,} messages of {SIZE} B, 4 queues, "
          f"median of {args.repeat} rounds, local[2], noop sink")  # fmt: skip
    print(f"{'query':32} {'rows':>11} {'seconds':>8} {'x full':>7}  target")
    for s in plan:
        ratio = seconds[s.name] / full
        verdict = ""
        if s.target is not None:
            verdict = f"<= {s.target:.1f}x " + ("met" if ratio <= s.target else "MISSED")
        n = rows[s.name]
        selected = "-" if n is None else f"{n:,}"  # --quick counts nothing
        print(f"{s.name:32} {selected:>11} {seconds[s.name]:>8.2f} {ratio:>7.3f}  {verdict}")
    print(f"queries: {'; '.join(f'{s.name}: {s.where}' for s in plan if s.where)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 40,000 messages, one round, no untimed run"
    )
    args = parser.parse_args()
    if args.quick:
        args.messages, args.repeat = 40_000, 1
    workdir = Path(tempfile.mkdtemp(prefix="equeue-pushdown-bench-", dir="/tmp"))
    try:
        run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
