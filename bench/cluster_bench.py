"""Cluster throughput (1, 2 and 3 brokers) and replicated groups (catch-up, sync, failover).

    python bench/cluster_bench.py [--messages 300000] [--size 100] [--pin] [--no-spark]
    python bench/cluster_bench.py --scenarios catchup sync failover [--quick]

``--scenarios`` picks what runs: ``brokers`` (the default, below), and the
replication scenarios of issue 18, described exactly in
``bench/_cluster_replication.py``: ``catchup`` (an empty replica's catch-up
rate beside a consumer's PullStream of the same data), ``sync`` (produce with
``--replication sync`` and one in-sync replica beside a lone master, at 100 B
and 1 KiB) and ``failover`` (SIGKILL the master of a 3-broker ZooKeeper
group with the default settings, beside one with ``--no-zk-fast-failover``:
seconds to the first read served and the first acknowledged write, median
of ``--kills``, for each ``--load``). A scenario whose broker flags this checkout lacks
prints NOT MEASURED and the script exits 1. ``--quick`` runs every scenario
(unless ``--scenarios`` says otherwise) as a smoke run: 1 and 2 brokers,
20,000 messages, one Spark read each, 5 MB to catch up, 2 MB of sync produce
at 100 B, one SIGKILL per group, no load.

For each broker count N the script starts one name server and N brokers
(async flush) on 127.0.0.1, creates a topic with ``--queues`` queues on each
broker, and measures:

- **produce, routed**: ``Producer(namesrv=...)``, one thread per broker, each
  sending keyless batches of ``--batch`` messages (``send_batch``: the
  producer picks a broker per batch, round robin): what a cluster client does.
- **produce, streaming**: one ``ProduceStream`` per broker (``send_batches``
  on each broker's address, one thread each), the pipelined path the Spark
  writer and ``equeue produce`` use: the brokers' own aggregate ceiling.
- **Spark read**: ``spark.read.format("equeue").option("namesrv", ...)`` of
  the whole topic on ``local[2]`` (a count, so the rows cross into the JVM).

Every figure is printed beside the single-broker one of the same run.
``--pin`` runs broker i under ``taskset -c (i mod cores)``: on a 2-core
machine the brokers, the client and Spark compete for the same cores, so the
figures show contention, not how a cluster of machines scales (docs/cluster.md
works that out on paper).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench import _cluster_replication as repl
from equeue_broker.server.config import BrokerConfig
from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_broker.testing_group import MissingFeature
from equeue_broker.testing_report import table as markdown_table
from equeue_spark.client import Admin, NotFoundError, Producer

TOPIC = "bench"


class PinnedBroker(BrokerProcess):
    """A broker run under ``taskset -c CORE``."""

    def __init__(self, core: int, data_dir: Path, *flags: str) -> None:
        super().__init__(data_dir, *flags)
        self.core = core

    def command(self) -> list[str]:
        return ["taskset", "-c", str(self.core), *super().command()]


@dataclass
class Row:
    brokers: int
    pinned: bool
    routed: float = 0.0
    streaming: float = 0.0
    spark: float = 0.0


def start_cluster(root: Path, brokers: int, pin: bool) -> LocalCluster:
    cluster = LocalCluster(root, broker_flags=("--flush", "async"))
    cluster.start(namesrvs=1, brokers=())
    cores = os.cpu_count() or 1
    for i in range(brokers):
        name = f"b{i}"
        if pin:
            flags = ("--broker-name", name, "--namesrv", cluster.namesrv, "--flush", "async")
            process: BrokerProcess = PinnedBroker(i % cores, root / f"broker-{name}", *flags)
            process.start()
            cluster.brokers[name] = process
        else:
            cluster.add_broker(name)
    return cluster


def wait_route(namesrv: str, queues: int) -> dict[str, str]:
    with Admin(namesrv=namesrv) as admin:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                route = admin.route(TOPIC)
            except NotFoundError:  # the brokers' registrations are on their way
                time.sleep(0.05)
                continue
            if len(route.queues()) == queues:
                return {b.broker_name: b.address for b in route.brokers}
            time.sleep(0.05)
    raise RuntimeError("the route did not appear")


def batches(count: int, size: int, batch: int) -> Iterator[list[bytes]]:
    value = b"x" * size
    for start in range(0, count, batch):
        yield [value] * min(batch, count - start)


def in_threads(work: list[Any]) -> float:
    """Run the callables at once; the wall-clock seconds until all are done."""
    threads = [threading.Thread(target=w) for w in work]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def produce_routed(namesrv: str, brokers: int, count: int, size: int, batch: int) -> float:
    share = count // brokers

    def work() -> None:
        with Producer(namesrv=namesrv) as producer:
            for values in batches(share, size, batch):
                producer.send_batch(TOPIC, values)

    seconds = in_threads([work for _ in range(brokers)])
    return share * brokers / seconds


def produce_streaming(addresses: dict[str, str], count: int, size: int, batch: int) -> float:
    share = count // len(addresses)

    def work(address: str) -> None:
        with Producer(address) as producer:
            for _ in producer.send_batches(TOPIC, batches(share, size, batch)):
                pass

    seconds = in_threads([lambda a=a: work(a) for a in addresses.values()])
    return share * len(addresses) / seconds


def spark_read(spark: Any, namesrv: str, expected: int) -> float:
    started = time.perf_counter()
    count = (
        spark.read.format("equeue").option("namesrv", namesrv).option("topic", TOPIC).load().count()
    )
    seconds = time.perf_counter() - started
    if count != expected:
        raise RuntimeError(f"Spark read {count} rows, expected {expected}")
    return float(count) / seconds


def measure(args: argparse.Namespace, brokers: int, pin: bool, spark: Any) -> Row:
    row = Row(brokers, pin)
    with tempfile.TemporaryDirectory(prefix="equeue-cluster-bench-") as scratch:
        cluster = start_cluster(Path(scratch), brokers, pin)
        try:
            with Admin(namesrv=cluster.namesrv) as admin:
                admin.create_topic(TOPIC, queues=args.queues)
            addresses = wait_route(cluster.namesrv, args.queues * brokers)
            row.routed = produce_routed(
                cluster.namesrv, brokers, args.messages, args.size, args.batch
            )
            row.streaming = produce_streaming(addresses, args.messages, args.size, args.batch)
            if spark is not None:
                stored = (args.messages // brokers) * brokers * 2
                if not args.quick:  # a smoke run reads once: its own warm-up
                    spark_read(spark, cluster.namesrv, stored)  # warm-up (JIT, workers)
                reads = 1 if args.quick else 2
                row.spark = max(spark_read(spark, cluster.namesrv, stored) for _ in range(reads))
        finally:
            cluster.stop()
    return row


def table(rows: list[Row]) -> str:
    base = {r.pinned: r for r in rows if r.brokers == 1}

    def cell(value: float, one: float) -> str:
        ratio = f" ({value / one:.2f}x)" if one and value else ""
        return f"{value:,.0f}{ratio}" if value else "-"

    lines = [
        "| brokers | pinned | produce routed msg/s | produce streaming msg/s | Spark read rows/s |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        one = base.get(r.pinned, r)
        lines.append(
            f"| {r.brokers} | {'yes' if r.pinned else 'no'} | {cell(r.routed, one.routed)} | "
            f"{cell(r.streaming, one.streaming)} | {cell(r.spark, one.spark)} |"
        )
    return "\n".join(lines)


def run_brokers(args: argparse.Namespace) -> None:
    spark = None
    if not args.no_spark:
        from equeue_spark.spark.testing import local_session

        spark = local_session("equeue-cluster-bench", master="local[2]")
    rows = []
    for pin in (False, True) if args.pin else (False,):
        for brokers in args.brokers:
            rows.append(measure(args, brokers, pin, spark))
            print(f"done: {brokers} broker(s), pinned={pin}", flush=True)
    print(f"\n{args.messages:,} messages of {args.size} B, batches of {args.batch}, "
          f"{args.queues} queues per broker, {os.cpu_count()} cores\n")  # fmt: skip
    print(table(rows))
    if spark is not None:
        spark.stop()


def run_catch_up(args: argparse.Namespace, scratch: Path) -> None:
    result = repl.catch_up(scratch / "catchup", args.catchup_mb, args.catchup_size, args.repeat)
    print(f"\n### Catch-up of an empty replica: {result.log_bytes / 1e6:,.1f} MB of log "
          f"({args.catchup_size} B values), median of {args.repeat}\n")  # fmt: skip
    print(markdown_table(repl.CATCH_UP_HEADERS, result.rows()), flush=True)


def run_sync(args: argparse.Namespace, scratch: Path) -> None:
    rows = repl.sync_produce(scratch / "sync", args.sync_sizes, args.sync_mb, args.batch,
                             args.repeat)  # fmt: skip
    print(f"\n### Produce with sync replication: {args.sync_mb} MB per run, batches of "
          f"{args.batch}, median of {args.repeat} (target: >= 0.5x)\n")  # fmt: skip
    print(markdown_table(repl.SYNC_HEADERS, repl.sync_rows(rows)), flush=True)


def run_failover(args: argparse.Namespace, scratch: Path) -> bool:
    loads = tuple(args.load)
    before = _loadavg()
    kills = repl.failover(
        scratch / "failover",
        args.kills,
        session_timeout_ms=args.zk_session_timeout_ms,
        replication=args.replication,
        via_namesrv=args.read_via == "namesrv",
        loads=loads,
    )
    session_ms = args.zk_session_timeout_ms or DEFAULT_SESSION_MS
    session = f"default session timeout ({session_ms} ms)"
    if args.zk_session_timeout_ms:
        session = f"--zk-session-timeout-ms {args.zk_session_timeout_ms}"
    print(
        f"\n### Failover: 3 brokers, --replication {args.replication or '(default)'}, "
        f"{session}, {args.kills} SIGKILL(s) per group and load, load {' '.join(map(str, loads))} "
        f"(busy-loop processes; {os.cpu_count()} cores; load average before: {before}, "
        f"after: {_loadavg()})\n"
    )
    print(markdown_table(repl.FAILOVER_HEADERS, repl.kill_rows(kills)))
    print()
    summary = repl.failover_summary(kills, session_ms)
    print(markdown_table(repl.FAILOVER_SUMMARY_HEADERS, summary), flush=True)
    expected = args.kills * len(loads) * len(repl.PATHS)
    return len(kills) == expected and not any(k.problems for k in kills)


def _loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


DEFAULT_SESSION_MS: int = next(
    f.default for f in dataclasses.fields(BrokerConfig) if f.name == "zk_session_timeout_ms"
)  # type: ignore[assignment]
"""The brokers' session timeout when ``--zk-session-timeout-ms`` is not given."""


SCENARIOS = ("brokers", "catchup", "sync", "failover")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--scenarios", nargs="+", choices=SCENARIOS, default=None,
        help="default: brokers (--quick: all of them)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a short smoke run of each scenario")
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=4, help="queues per broker")
    parser.add_argument(
        "--brokers", type=int, nargs="+", default=None, help="default: 1 2 3 (--quick: 1 2)"
    )
    parser.add_argument("--pin", action="store_true", help="also run with taskset pinning")
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="catchup, sync: rounds (median)")
    parser.add_argument("--catchup-mb", type=int, default=200, help="catchup: MB in the log")
    parser.add_argument("--catchup-size", type=int, default=1024, help="catchup: value bytes")
    parser.add_argument("--sync-mb", type=int, default=50, help="sync: MB produced per run")
    parser.add_argument(
        "--sync-sizes", type=int, nargs="+", default=None, help="default: 100 1024 (--quick: 100)"
    )
    parser.add_argument("--kills", type=int, default=10, help="failover: master kills")
    parser.add_argument(
        "--zk-session-timeout-ms", type=int, default=None,
        help="failover: the brokers' session timeout (default: the broker's default)",
    )  # fmt: skip
    parser.add_argument(
        "--load", type=int, nargs="+", default=[0],
        help="failover: busy-loop processes during the rounds; several: one run each",
    )  # fmt: skip
    parser.add_argument("--replication", default="sync", help="failover: sync, async or ''")
    parser.add_argument(
        "--read-via",
        choices=["members", "namesrv"],
        default="namesrv",
        help="failover: namesrv also times a Consumer and a Producer via a name server",
    )
    args = parser.parse_args(argv)
    if args.quick:  # every scenario in seconds: what the test suite runs
        args.messages, args.repeat, args.kills = min(args.messages, 20_000), 1, min(args.kills, 1)
        args.catchup_mb, args.sync_mb = min(args.catchup_mb, 5), min(args.sync_mb, 2)
        args.load = args.load[:1]
    if args.scenarios is None:
        args.scenarios = list(SCENARIOS) if args.quick else ["brokers"]
    if args.brokers is None:
        args.brokers = [1, 2] if args.quick else [1, 2, 3]
    if args.sync_sizes is None:
        args.sync_sizes = [100] if args.quick else [100, 1024]
    print(f"cluster bench: {' '.join(args.scenarios)} ({os.cpu_count()} cores)", flush=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="equeue-cluster-bench-") as tmp:
        scratch = Path(tmp)
        for scenario in args.scenarios:
            try:
                if scenario == "brokers":
                    run_brokers(args)
                elif scenario == "catchup":
                    run_catch_up(args, scratch)
                elif scenario == "sync":
                    run_sync(args, scratch)
                else:
                    ok = run_failover(args, scratch) and ok
            except MissingFeature as exc:
                print(f"\n### {scenario}: NOT MEASURED\n\n{exc}", flush=True)
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
