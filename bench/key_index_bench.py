"""The key index (issue 28): produce with keys indexed beside without, and queries by key.

Run ``python bench/key_index_bench.py`` (``make bench-keys``). Brokers are real
``python -m equeue_broker`` processes on 127.0.0.1 (``--flush async``, the
producer's defaults: idempotent), over a temporary directory under /tmp that
is removed at the end; the client is this one Python process. Tables go to
stdout (markdown), progress to stderr.

Scenarios:

* ``produce``: two brokers of the same run, one with the key index (default)
  and one with ``--no-key-index``; 100 B values with a distinct key each, in
  batches of 1,000 over 4 queues, ``--seconds`` per run on a fresh topic,
  through ``send_batch`` (one request at a time) and through ``send_requests``
  (pipelined ProduceStream, the fastest path); the two brokers alternate which
  runs first from round to round; medians of ``--repeat`` rounds; the ratio
  indexed / not (target >= 0.8x).
* ``query``: ``--messages`` (default 10,000,000) 100 B messages with
  ``--distinct`` keys (default 1,000,000: 10 messages per key) through
  ProduceStream into one broker, then ``--queries`` (default 10,000)
  ``Admin.query_messages`` by a random key over one connection: p50 / p99 / max
  latency (target p99 < 50 ms on an idle machine); each answer is checked
  (10 messages of that key). Again after a restart (SIGTERM), with the page
  cache as the restart left it; and the broker's RSS.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._broker_measure import percentile
from bench._measure import progress
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.batches import BatchColumns

BATCH = 1_000
QUEUES = 4
SIZE = 100
RPC_TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0
PRODUCE_TARGET = 0.8
P99_TARGET_MS = 50.0


def start_broker(root: Path, name: str, *flags: str) -> BrokerProcess:
    data = root / name / "data"
    data.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(
        data, "--flush", "async", "--log-level", "WARNING", *flags,
        log_path=root / name / "broker.log",
    )  # fmt: skip
    broker.start(START_TIMEOUT_S)
    return broker


def config_for(broker: BrokerProcess) -> ClientConfig:
    return ClientConfig(broker=broker.address, timeout_s=RPC_TIMEOUT_S)


def keyed_batch(first: int, distinct: int) -> BatchColumns:
    """1,000 values of 100 B, keys ``order-<i % distinct>`` from ``first`` on."""
    keys = [b"order-%d" % (i % distinct) for i in range(first, first + BATCH)]
    values = [(b"%d:" % i).ljust(SIZE, b"x") for i in range(first, first + BATCH)]
    return BatchColumns(values, keys=keys)


# -- produce with keys indexed beside without ---------------------------------------------------


POOL = 200
"""Batches built before a timed run and sent in turn (200,000 distinct keys): the
client's own work per batch stays out of the measurement."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce_once(
    broker: BrokerProcess, topic: str, seconds: float, pipelined: bool
) -> tuple[float, float]:
    """(msgs/s, broker CPU s per million messages) of one timed run on a fresh topic."""
    pool = [keyed_batch(i * BATCH, 1 << 62) for i in range(POOL)]
    requests_pool = [b.request(topic) for b in pool]
    with Admin(config=config_for(broker)) as admin, Producer(config=config_for(broker)) as producer:
        admin.create_topic(topic, queues=QUEUES)
        producer.send_batch(topic, pool[0].values, keys=pool[0].keys)  # InitProducer, chunks
        sent = 0
        cpu = cpu_seconds(broker.pid)
        start = time.perf_counter()
        deadline = start + seconds
        if pipelined:

            def requests() -> Iterator[pb.ProduceRequest]:
                i = 0
                while time.perf_counter() < deadline:
                    yield requests_pool[i % POOL]
                    i += 1

            for results in producer.send_requests(requests()):
                sent += len(results)
        else:
            i = 0
            while time.perf_counter() < deadline:
                batch = pool[i % POOL]
                sent += len(producer.send_batch(topic, batch.values, keys=batch.keys))
                i += 1
        rate = sent / (time.perf_counter() - start)
        return rate, (cpu_seconds(broker.pid) - cpu) / sent * 1e6


def run_produce(root: Path, args: argparse.Namespace) -> str:
    brokers = {
        "on": start_broker(root, "indexed"),
        "off": start_broker(root, "plain", "--no-key-index"),
    }
    rates: dict[tuple[str, bool], list[float]] = {}
    cpus: dict[tuple[str, bool], list[float]] = {}
    names = iter(range(1_000_000))
    try:
        for round_ in range(args.repeat):
            for pipelined in (False, True):
                order = ("on", "off") if round_ % 2 == 0 else ("off", "on")
                for which in order:
                    topic = f"p{next(names)}"
                    rate, cpu = produce_once(brokers[which], topic, args.seconds, pipelined)
                    rates.setdefault((which, pipelined), []).append(rate)
                    cpus.setdefault((which, pipelined), []).append(cpu)
                    way = "ProduceStream" if pipelined else "send_batch"
                    progress(
                        f"produce round {round_ + 1} {way:13} index {which:3} {rate:12,.0f} msgs/s "
                        f"broker {cpu:.2f} CPU s per M"
                    )
    finally:
        for broker in brokers.values():
            broker.stop()
    lines = [
        f"produce: {SIZE} B values, a distinct key each, batches of {BATCH:,}, {QUEUES} queues, "
        f"idempotent, `--flush async`, {args.seconds:g} s per run, medians of {args.repeat} "
        "round(s)",
        "",
        "| path | no key index msgs/s | key index msgs/s | indexed / not | target | broker CPU s "
        "per M msgs, not / indexed |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for pipelined in (False, True):
        off = statistics.median(rates[("off", pipelined)])
        on = statistics.median(rates[("on", pipelined)])
        ratio = on / off
        met = "met" if ratio >= PRODUCE_TARGET else "**not met**"
        way = "`send_requests` (ProduceStream)" if pipelined else "`send_batch`"
        cpu_off = statistics.median(cpus[("off", pipelined)])
        cpu_on = statistics.median(cpus[("on", pipelined)])
        lines.append(
            f"| {way} | {off:,.0f} | {on:,.0f} | {ratio:.3f}x | >= {PRODUCE_TARGET}x: {met} | "
            f"{cpu_off:.2f} / {cpu_on:.2f} |"
        )
    return "\n".join(lines)


# -- queries by key -------------------------------------------------------------------------------


def fill(broker: BrokerProcess, topic: str, count: int, distinct: int) -> float:
    start = time.monotonic()
    with Admin(config=config_for(broker)) as admin, \
            Producer(config=config_for(broker), enable_idempotence=False) as producer:  # fmt: skip
        admin.create_topic(topic, queues=QUEUES)
        done = 0

        def requests() -> Iterator[pb.ProduceRequest]:
            for first in range(0, count, BATCH):
                yield keyed_batch(first, distinct).request(topic)

        for results in producer.send_requests(requests()):
            done += len(results)
            if done % 1_000_000 == 0:
                progress(f"query: filled {done:,} of {count:,} ({time.monotonic() - start:.0f} s)")
    return time.monotonic() - start


def query_latencies(broker: BrokerProcess, topic: str, args: argparse.Namespace) -> list[float]:
    rng = random.Random(28)
    expected = args.messages // args.distinct
    out = []
    with Admin(config=config_for(broker)) as admin:
        admin.query_messages(topic, key=b"order-0")  # connect
        for _ in range(args.queries):
            key = b"order-%d" % rng.randrange(args.distinct)
            start = time.perf_counter()
            found = admin.query_messages(topic, key=key, limit=100)
            out.append((time.perf_counter() - start) * 1000)
            if len(found) != expected or any(m.key != key for m in found):
                raise RuntimeError(f"query {key!r}: {len(found)} messages, {expected} expected")
    return out


def latency_row(what: str, ms: list[float]) -> str:
    p99 = percentile(ms, 0.99)
    met = "met" if p99 < P99_TARGET_MS else "**not met**"
    return (
        f"| {what} | {len(ms):,} | {percentile(ms, 0.5):.2f} | {p99:.2f} | {max(ms):.2f} | "
        f"< {P99_TARGET_MS:g} ms: {met} |"
    )


def run_query(root: Path, args: argparse.Namespace) -> str:
    broker = start_broker(root, "query")
    try:
        filled = fill(broker, "q", args.messages, args.distinct)
        warm = query_latencies(broker, "q", args)
        rss = broker.rss_bytes()
        broker.stop()
        broker.start(START_TIMEOUT_S)
        restarted = query_latencies(broker, "q", args)
    finally:
        broker.stop()
    keys_bytes = sum(p.stat().st_blocks * 512 for p in (broker.data_dir / "keys").glob("*"))
    log_bytes = sum(p.stat().st_size for p in (broker.data_dir / "log").glob("*"))
    return "\n".join([
        f"query: {args.messages:,} messages of {SIZE} B with {args.distinct:,} distinct keys "
        f"(filled in {filled:.0f} s through ProduceStream), {args.queries:,} queries by a random "
        f"key over one connection, each answered with its {args.messages // args.distinct} "
        f"messages; broker RSS after the first run {rss / (1 << 20):,.0f} MiB; key index on disk "
        f"{keys_bytes / (1 << 20):,.0f} MiB beside a log of {log_bytes / (1 << 20):,.0f} MiB",
        "",
        "| run | queries | p50 ms | p99 ms | max ms | target p99 |",
        "|---|---:|---:|---:|---:|---|",
        latency_row("after the fill", warm),
        latency_row("after a restart", restarted),
    ])  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("produce", "query", "all"), default="all")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--distinct", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true",
                        help="1 round of 0.5 s, 20,000 messages, 200 queries")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:  # seconds in all: what the test suite runs
        args.repeat, args.seconds = 1, 0.5
        args.messages, args.distinct, args.queries = 20_000, 2_000, 200
    if args.messages % BATCH or args.messages % args.distinct:
        parser.error("--messages must be a multiple of 1,000 and of --distinct")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="equeue-keys-bench-"))
    try:
        tables = []
        if args.scenario in ("produce", "all"):
            tables.append(run_produce(root, args))
        if args.scenario in ("query", "all"):
            tables.append(run_query(root, args))
        print("\n\n".join(tables))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
