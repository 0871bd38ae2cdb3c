"""Broker-side filters (issue 28): pull throughput unfiltered, by tag, and by expression.

Run ``python bench/filter_bench.py`` (``make bench-filter``). For each
implementation of the evaluator, C (``_codec.select_frames``) and pure Python
(the broker started with ``EQUEUE_PURE_PYTHON=1``), one real ``python -m
equeue_broker`` process on 127.0.0.1 (``--flush async``, a temporary directory
removed at the end) holds three topics of ``--messages`` 100 B records on one
queue, with headers ``region`` and ``amount`` and a tag equal to the region,
such that ``region = 'eu' AND amount > 100`` (and the tag ``eu``) selects about
1%, 10% and 100% of each. A reader drains each topic with ``PullStream``
(1,000 records a reply) with: no filter (the baseline), ``tags=["eu"]``, and
the expression; the median of ``--repeat`` rounds per case. The table gives
records inspected per second (the topic's size over the time), records sent,
and the time against the unfiltered read of the same topic in the same run.
The client decodes nothing (replies are counted), so the figures are the
broker's read path and the wire.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.connection import Connection
from equeue_spark.client.reader import stream_replies

EXPRESSION = "region = 'eu' AND amount > 100"
SELECTIVITY = {"1%": 0.01, "10%": 0.10, "100%": 1.0}
BATCH = 1_000


def _fill(address: str, topic: str, messages: int, share: float, seed: int) -> None:
    """``messages`` records of which about ``share`` pass the expression and the tag."""
    rnd = random.Random(seed)
    value = b"x" * 100
    with Admin(address) as admin, Producer(address) as producer:
        admin.create_topic(topic, queues=1)
        for start in range(0, messages, BATCH):
            n = min(BATCH, messages - start)
            tags, headers = [], []
            for _ in range(n):
                hit = rnd.random() < share
                region = b"eu" if hit or rnd.random() < 0.3 else b"us"
                amount = b"150" if hit else str(rnd.randint(0, 100)).encode()
                tags.append(region.decode() if hit else "us")
                headers.append([("region", region), ("amount", amount)])
            producer.send_batch(topic, [value] * n, tags=tags, headers=headers, queue_ids=[0] * n)


def _drain(conn: Connection, topic: str, tags: list[str], expression: str) -> tuple[float, int]:
    """(seconds, records sent) to read the whole queue with PullStream."""
    began = time.perf_counter()
    sent = 0
    for reply in stream_replies(
        conn, topic, 0, 0, batch_messages=BATCH, tags=tags, filter=expression
    ):
        sent += reply.count
    return time.perf_counter() - began, sent


def _measure(address: str, topics: dict[str, str], repeat: int, messages: int) -> list[list[str]]:
    rows = []
    config = ClientConfig(broker=address, timeout_s=600)
    with Connection(config) as conn:
        for label, topic in topics.items():
            cases = {"none": ([], ""), "tag": (["eu"], ""), "expression": ([], EXPRESSION)}
            times: dict[str, list[float]] = {name: [] for name in cases}
            sent: dict[str, int] = {}
            for _ in range(repeat):
                for name, (tags, expression) in cases.items():
                    seconds, count = _drain(conn, topic, tags, expression)
                    times[name].append(seconds)
                    sent[name] = count
            base = statistics.median(times["none"])
            for name in cases:
                median = statistics.median(times[name])
                rows.append([
                    label, name, f"{messages / median:,.0f}", f"{sent[name]:,}",
                    f"{median:.3f}", f"{median / base:.2f}x",
                ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="records per topic")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per case (median)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10,000 records, one round")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.repeat = 10_000, 1
    print(f"{args.messages:,} records of 100 B per topic, one queue; medians of {args.repeat}")
    for implementation, env in (("C", {}), ("python", {"EQUEUE_PURE_PYTHON": "1"})):
        with tempfile.TemporaryDirectory(prefix="filter-bench-", dir="/tmp") as tmp:
            broker = BrokerProcess(Path(tmp) / "data", "--flush", "async", env=env)
            broker.start()
            try:
                topics = {}
                for i, (label, share) in enumerate(SELECTIVITY.items()):
                    topic = f"sel-{i}"
                    print(f"[{implementation}] filling {topic} ({label})", file=sys.stderr)
                    _fill(broker.address, topic, args.messages, share, seed=i)
                    topics[label] = topic
                rows = _measure(broker.address, topics, args.repeat, args.messages)
            finally:
                broker.stop()
        print(f"\n### evaluator: {implementation}\n")
        header = ["selectivity", "filter", "inspected/s", "sent", "seconds", "vs none"]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
