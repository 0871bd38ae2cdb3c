"""Delayed delivery and retries (issue 27): four scenarios, each beside a baseline of the same run.

Run ``python bench/delay_bench.py --scenario NAME`` (``all`` runs the four in
turn). Every broker is a real ``python -m equeue_broker`` process on
127.0.0.1 (``--flush async``), over a temporary directory under /tmp that is
removed at the end; the client is this one Python process. Tables go to
stdout (markdown), progress to stderr.

Scenarios:

* ``produce``: ``Producer.send_batch`` of 1,000 values (100 B and 1 KiB,
  keyless, 4 queues, the producer's defaults: idempotent) with
  ``delay_s=3600`` (every message stays pending during the run) beside the
  same batches without a delay, ``--seconds`` each on a fresh topic after a
  warm-up batch; the two alternate which runs first from round to round;
  medians of ``--repeat`` rounds, the ratio delayed / plain (target >= 0.7x)
  and the broker's CPU seconds per million messages (/proc).
* ``pending``: two brokers get the same number (``--pending``, default
  10,000,000) of 100 B messages through pipelined ``ProduceStream`` requests
  (the fill is not timed for the table): broker "delayed" with delivery times
  spread over a day starting a day from now (so all stay pending), broker
  "plain" without delays (the same log size, nothing pending). Then, for each:
  its ``RssAnon`` (/proc/PID/status) while they wait, and ``--restarts``
  restarts after a clean stop (SIGTERM) and after ``kill -9``, each timed
  from spawning the process until a ``GetStats`` call is answered (and, for
  the delayed broker, reports every message still pending). Target: restart
  with 10 M pending < 2 s beside the plain broker's restart; RssAnon within
  512 MiB.
* ``lateness``: ``--messages`` (default 1,000,000) 100 B messages, each with
  its own delivery time (``deliver_at`` per message, ms), spread evenly over
  ``--window`` seconds (default 60) starting ``--lead`` seconds after the
  first send; the due time travels in the value. A consumer reads them as
  they are delivered; lateness = the delivered record's store timestamp (the
  broker's clock at delivery) minus its due time; also the consumer's clock
  at receipt minus the due time. p50 / p99 / max, and how many came early.
* ``nack``: ``--nack-messages`` (default 200,000) 100 B messages on 4 queues.
  Baseline: one ``Consumer`` (group "plain") polls them all, committing after
  each poll. Then one ``Consumer`` (group "retrying") polls the same messages,
  gives every original back with ``nack(batch, delay_s=--nack-delay)``
  (one Nack call per poll), and reads each copy back from ``%RETRY%retrying``
  (which it finds by itself), committing after each poll. Reported: the nack
  phase's rate (originals polled and nacked per second) and the whole cycle's
  (originals per second until every copy is read back, the delay included),
  each against plain consume.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._broker_measure import percentile, values_for
from bench._measure import progress, size_label
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Consumer, Producer
from equeue_spark.client.batches import BatchColumns
from equeue_spark.client.connection import Connection
from equeue_spark.client.records import Message

BATCH = 1_000
QUEUES = 4
RPC_TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0
"""A restart over gigabytes of log on a loaded machine may be slow: bounded, generously."""
PRODUCE_TARGET = 0.7
RESTART_TARGET_S = 2.0
RSS_BUDGET = 512 << 20
DUE = struct.Struct(">q")
SCENARIOS = ("produce", "pending", "lateness", "nack")


# -- common --------------------------------------------------------------------------------------


def start_broker(root: Path, name: str, log_level: str = "WARNING") -> BrokerProcess:
    data = root / name / "data"
    data.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(
        data, "--flush", "async", "--log-level", log_level, log_path=root / name / "broker.log"
    )
    broker.start(START_TIMEOUT_S)
    return broker


def config_for(broker: BrokerProcess) -> ClientConfig:
    return ClientConfig(broker=broker.address, timeout_s=RPC_TIMEOUT_S)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_anon(broker: BrokerProcess) -> int:
    """RssAnon of the broker in bytes (0 once it is gone)."""
    value = broker.proc_status().get("RssAnon", "0 kB")
    return int(value.split()[0]) * 1024


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_note() -> str:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
        cwd=Path(__file__).resolve().parent,
    ).stdout.strip()  # fmt: skip
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{now}, commit {commit or '?'}, {os.cpu_count()} cores ({model}), "
        f"Python {platform.python_version()}, load average {loadavg()}"
    )


def deadline_check(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(f"{what}: not done within its time budget")


# -- produce with a delay beside without -----------------------------------------------------------


@dataclass
class Cell:
    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def produce_once(producer: Producer, topic: str, size: int, seconds: float, *,
                 delay_s: float | None, broker_pid: int) -> tuple[float, float]:  # fmt: skip
    """(msgs/s, broker CPU s per million messages) of one timed run."""
    values = values_for(size)
    producer.send_batch(topic, values, delay_s=delay_s)  # warm-up: InitProducer, chunk
    cpu_before = cpu_seconds(broker_pid)
    sent = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        sent += len(producer.send_batch(topic, values, delay_s=delay_s))
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(broker_pid) - cpu_before
    return sent / elapsed, cpu / sent * 1e6


def run_produce(root: Path, args: argparse.Namespace) -> str:
    broker = start_broker(root, "produce")
    cells: dict[tuple[int, bool], Cell] = {}
    names = iter(range(1_000_000))
    try:
        with Admin(config=config_for(broker)) as admin, \
                Producer(config=config_for(broker)) as producer:  # fmt: skip
            for round_ in range(args.repeat):
                for size in args.sizes:
                    order = (True, False) if round_ % 2 == 0 else (False, True)
                    for delayed in order:
                        topic = f"produce-{next(names)}"
                        admin.create_topic(topic, queues=QUEUES)
                        rate, cpu = produce_once(
                            producer, topic, size, args.seconds,
                            delay_s=3600.0 if delayed else None, broker_pid=broker.pid,
                        )  # fmt: skip
                        cell = cells.setdefault((size, delayed), Cell())
                        cell.rates.append(rate)
                        cell.cpu.append(cpu)
                        progress(
                            f"produce round {round_ + 1} {size_label(size):6} "
                            f"{'delayed' if delayed else 'plain  '} {rate:10,.0f} msgs/s, "
                            f"broker {cpu:.2f} CPU s per M (load {loadavg()})"
                        )
        stats_note = timed_stats(broker)
    finally:
        broker.stop()
    lines = [
        f"produce: `send_batch` of {BATCH:,}, keyless, {QUEUES} queues, idempotent (default), "
        f"{args.seconds:g} s per run, medians of {args.repeat} round(s); delayed = "
        f"`delay_s=3600`; at the end, {stats_note}",
        "",
        "| size | plain msgs/s | delayed msgs/s | delayed / plain | target | broker CPU s per M "
        "msgs, plain / delayed |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for size in args.sizes:
        base, late = cells[(size, False)], cells[(size, True)]
        p, d = statistics.median(base.rates), statistics.median(late.rates)
        ratio = d / p
        met = "met" if ratio >= PRODUCE_TARGET else "**not met**"
        lines.append(
            f"| {size_label(size)} | {p:,.0f} | {d:,.0f} | {ratio:.3f}x | "
            f">= {PRODUCE_TARGET}x: {met} | {statistics.median(base.cpu):.2f} / "
            f"{statistics.median(late.cpu):.2f} |"
        )
    per_round = []
    for size in args.sizes:
        pairs = zip(cells[(size, False)].rates, cells[(size, True)].rates, strict=True)
        per_round.append(f"{size_label(size)}: " + ", ".join(f"{d / p:.2f}x" for p, d in pairs))
    lines += ["", "ratio per round: " + "; ".join(per_round)]
    return "\n".join(lines)


def timed_stats(broker: BrokerProcess, timeout_s: float = 60.0) -> str:
    """One GetStats call (no retry, at most ``timeout_s``), timed: with many
    messages due in the same second it has been slow (docs/benchmarks.md)."""
    start = time.monotonic()
    try:
        with Connection(config_for(broker)) as conn:
            stats = conn.admin.GetStats(pb.GetStatsRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        return f"GetStats gave no answer within {timeout_s:g} s ({exc.code().name})"
    took = time.monotonic() - start
    return f"{stats.delayed_pending:,} messages pending (GetStats answered in {took:.1f} s)"


# -- 10 M pending: memory and restart --------------------------------------------------------------


def fill(broker: BrokerProcess, topic: str, count: int, delayed: bool) -> float:
    """``count`` 100 B messages through one ProduceStream (delayed: due over a
    day starting a day from now, one due time per batch); seconds it took."""
    values = values_for(100)
    base_ms = int(time.time() * 1000) + 86_400_000
    batches = count // BATCH

    def requests() -> Iterator[pb.ProduceRequest]:
        for i in range(batches):
            due = (base_ms + (i * 86_400_000) // max(1, batches),) if delayed else ()
            yield BatchColumns(values, deliver_at_ms=due).request(topic)

    start = time.monotonic()
    done = 0
    with Admin(config=config_for(broker)) as admin, \
            Producer(config=config_for(broker), enable_idempotence=False) as producer:  # fmt: skip
        admin.create_topic(topic, queues=QUEUES)
        for results in producer.send_requests(requests()):
            done += len(results)
            if done % 1_000_000 == 0:
                progress(
                    f"pending: {'delayed' if delayed else 'plain'} broker {done:,} of {count:,} "
                    f"({time.monotonic() - start:.0f} s, RssAnon {mib(rss_anon(broker))}, "
                    f"load {loadavg()})"
                )
    return time.monotonic() - start


def answer_time(
    broker: BrokerProcess, kill: bool, expect_pending: int
) -> tuple[float, float, float]:
    """Stop (``kill``: SIGKILL, else SIGTERM) and start ``broker``; (seconds
    from spawn to its first GetStats answer, seconds from spawn to ready line,
    the store's open as it logged it: "store opened in X s")."""
    if kill:
        broker.kill()
    else:
        broker.stop()
    start = time.monotonic()
    broker.start(START_TIMEOUT_S)
    ready = time.monotonic() - start
    with Connection(config_for(broker)) as conn:
        stats: pb.BrokerStats = conn.admin.GetStats(pb.GetStatsRequest(), timeout=RPC_TIMEOUT_S)
    answered = time.monotonic() - start
    if stats.delayed_pending != expect_pending:
        raise RuntimeError(
            f"after the restart GetStats says {stats.delayed_pending:,} pending, "
            f"expected {expect_pending:,}"
        )
    return answered, ready, store_open_s(broker.log_since_start())


def store_open_s(log: str) -> float:
    """Seconds of "store opened in X s" in a broker's INFO log (nan if absent)."""
    found = re.search(r"store opened in ([0-9.]+) s", log)
    return float(found.group(1)) if found else float("nan")


@dataclass
class PendingResult:
    fill_s: float
    log_bytes: int
    rss_waiting: list[int]
    restarts: dict[str, list[tuple[float, float, float]]]
    rss_after: list[int]


def watch_rss(broker: BrokerProcess, seconds: float) -> list[int]:
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(rss_anon(broker))
        time.sleep(0.5)
    return samples


def log_bytes(broker: BrokerProcess) -> int:
    """The broker's log end position: bytes of log written."""
    with Admin(config=config_for(broker)) as admin:
        return int(admin.stats().log_end_position)


RSS_WATCH_S = (5.0, 2.0)
"""Seconds RssAnon is sampled: after the fill, and after each restart (--quick: less)."""


def pending_one(
    root: Path, name: str, count: int, delayed: bool, restarts: int,
    *, watch_s: tuple[float, float] = RSS_WATCH_S,
) -> PendingResult:  # fmt: skip
    broker = start_broker(root, name, "INFO")
    try:
        fill_s = fill(broker, "pending", count, delayed) if count else 0.0
        expect = count if delayed else 0
        rss_waiting = watch_rss(broker, watch_s[0])
        result = PendingResult(fill_s, log_bytes(broker), rss_waiting, {}, [])
        for kind in ("clean stop", "kill -9"):
            for _ in range(restarts):
                took = answer_time(broker, kind == "kill -9", expect)
                result.restarts.setdefault(kind, []).append(took)
                result.rss_after.append(max(watch_rss(broker, watch_s[1])))
                progress(
                    f"pending: {name} restart after {kind}: answered {took[0]:.2f} s "
                    f"(ready line {took[1]:.2f} s, store opened in {took[2]:.2f} s), "
                    f"RssAnon {mib(result.rss_after[-1])}, load {loadavg()}"
                )
        return result
    finally:
        if broker.alive():
            broker.stop()
        shutil.rmtree(root / name, ignore_errors=True)  # gigabytes: free them now


def run_pending(root: Path, args: argparse.Namespace) -> str:
    count = args.pending // BATCH * BATCH
    watch_s = (0.5, 0.5) if args.quick else RSS_WATCH_S
    results = {
        "empty": pending_one(root, "empty", 0, False, args.restarts, watch_s=watch_s),
        "plain": pending_one(root, "plain", count, False, args.restarts, watch_s=watch_s),
        "delayed": pending_one(root, "delayed", count, True, args.restarts, watch_s=watch_s),
    }
    lines = [
        f"pending: {count:,} messages of 100 B on {QUEUES} queues per broker (delayed: due over "
        f"a day starting a day ahead; empty: no message, the start-up cost alone); restarts "
        f"timed from spawn to the first GetStats answer, median (max) of {args.restarts}, "
        f"and the store's open as the broker logs it (median)",
        "",
        "| broker | fill s (ProduceStream) | log bytes written | RssAnon while waiting (max) "
        "| RssAnon after restarts (max) | restart after clean stop s | restart after kill -9 s "
        "| store open s, clean / kill -9 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        cells = []
        for kind in ("clean stop", "kill -9"):
            times = [t[0] for t in r.restarts[kind]]
            cells.append(f"{statistics.median(times):.2f} ({max(times):.2f})")
        opens = [statistics.median(t[2] for t in r.restarts[k]) for k in ("clean stop", "kill -9")]
        lines.append(
            f"| {name} | {r.fill_s:.0f} | {r.log_bytes:,} | {mib(max(r.rss_waiting))} | "
            f"{mib(max(r.rss_after))} | {cells[0]} | {cells[1]} | {opens[0]:.2f} / {opens[1]:.2f} |"
        )
    lines.append("")
    for kind in ("clean stop", "kill -9"):
        d = statistics.median(t[0] for t in results["delayed"].restarts[kind])
        p = statistics.median(t[0] for t in results["plain"].restarts[kind])
        od = statistics.median(t[2] for t in results["delayed"].restarts[kind])
        op = statistics.median(t[2] for t in results["plain"].restarts[kind])
        met = "met" if d - p < RESTART_TARGET_S else "**not met**"
        lines.append(
            f"- restart after {kind}: delayed {d:.2f} s, plain {p:.2f} s, difference "
            f"{d - p:+.2f} s (target < {RESTART_TARGET_S:g} s beside it: {met}); store open "
            f"{od:.2f} s against {op:.2f} s"
        )
    rss = max(results["delayed"].rss_waiting + results["delayed"].rss_after)
    met = "met" if rss <= RSS_BUDGET else "**not met**"
    lines.append(f"- delayed broker RssAnon max {mib(rss)} (budget {mib(RSS_BUDGET)}: {met})")
    return "\n".join(lines)


# -- delivery lateness -----------------------------------------------------------------------------


def run_lateness(root: Path, args: argparse.Namespace) -> str:
    count = args.messages // BATCH * BATCH
    broker = start_broker(root, "lateness")
    store_late: list[float] = []
    seen_late: list[float] = []
    try:
        with Admin(config=config_for(broker)) as admin, \
                Producer(config=config_for(broker)) as producer:  # fmt: skip
            admin.create_topic("late", queues=QUEUES)
            consumer = Consumer(
                config=config_for(broker), group="late", topics=["late"], start="earliest"
            )
            try:
                first_ms = int(time.time() * 1000) + int(args.lead * 1000)
                step = args.window * 1000 / count
                sent_s = send_spread(producer, count, first_ms, step)
                progress(f"lateness: {count:,} sent in {sent_s:.1f} s (load {loadavg()})")
                budget = time.monotonic() + args.lead + args.window + 300
                while len(store_late) < count:
                    deadline_check(budget, "lateness: reading the delivered messages")
                    messages = consumer.poll(1.0)
                    now_ms = time.time() * 1000
                    for m in messages:
                        due = DUE.unpack_from(m.value)[0]
                        store_late.append(m.store_timestamp_ms - due)
                        seen_late.append(now_ms - due)
                    if messages:
                        consumer.commit()
            finally:
                consumer.close()
    finally:
        broker.stop()
    early = sum(1 for v in store_late if v < 0)
    lines = [
        f"lateness: {count:,} messages of 100 B, {QUEUES} queues, due evenly over "
        f"{args.window:g} s starting {args.lead:g} s after the first send "
        f"({count / args.window:,.0f} due per second); sent in {sent_s:.1f} s",
        "",
        "| measured as | p50 ms | p99 ms | max ms | delivered before their time |",
        "|---|---:|---:|---:|---:|",
        f"| store timestamp of the delivered record - due time | "
        f"{percentile(store_late, 0.5):,.0f} | {percentile(store_late, 0.99):,.0f} | "
        f"{max(store_late):,.0f} | {early:,} |",
        f"| consumer's clock at receipt - due time | {percentile(seen_late, 0.5):,.0f} | "
        f"{percentile(seen_late, 0.99):,.0f} | {max(seen_late):,.0f} | - |",
    ]
    return "\n".join(lines)


def send_spread(producer: Producer, count: int, first_ms: int, step_ms: float) -> float:
    """Send ``count`` messages, message i due at ``first_ms + i * step_ms``
    (its due time in the first 8 bytes of its 100 B value); seconds taken."""
    pad = bytes(100 - DUE.size)
    start = time.monotonic()
    for b in range(count // BATCH):
        dues = [first_ms + int((b * BATCH + i) * step_ms) for i in range(BATCH)]
        values = [DUE.pack(d) + pad for d in dues]
        producer.send_batch("late", values, deliver_at=dues)
    return time.monotonic() - start


# -- nack and retry --------------------------------------------------------------------------------


def consume_all(consumer: Consumer, count: int, budget_s: float,
                handle: Callable[[list[Message]], int]) -> float:  # fmt: skip
    """Poll until ``handle`` has counted ``count``; seconds taken."""
    done = 0
    start = time.monotonic()
    deadline = start + budget_s
    while done < count:
        deadline_check(deadline, "nack: consuming")
        messages = consumer.poll(1.0)
        done += handle(messages)
        if messages:
            consumer.commit()
    return time.monotonic() - start


def run_nack(root: Path, args: argparse.Namespace) -> str:
    count = args.nack_messages // BATCH * BATCH
    broker = start_broker(root, "nack")
    config = config_for(broker)
    try:
        with Admin(config=config) as admin, Producer(config=config) as producer:
            admin.create_topic("work", queues=QUEUES)
            values = values_for(100)
            for _ in range(count // BATCH):
                producer.send_batch("work", values)
        rows = []
        for round_ in range(args.repeat):
            rows.append(nack_round(config, count, args.nack_delay, round_))
    finally:
        broker.stop()
    plain = statistics.median(r[0] for r in rows)
    nacked = statistics.median(r[1] for r in rows)
    cycle = statistics.median(r[2] for r in rows)
    return "\n".join(
        [
            f"nack: {count:,} messages of 100 B on {QUEUES} queues, one Consumer, "
            f"`max_messages=1000`, commit after each poll; nack with "
            f"`delay_s={args.nack_delay:g}`, one Nack call per poll; medians of "
            f"{args.repeat} round(s) (fresh groups each)",
            "",
            "| workload | msgs/s | against plain consume |",
            "|---|---:|---:|",
            f"| plain consume (poll + commit) | {plain:,.0f} | 1.00x |",
            f"| poll + nack every message (the nack phase) | {nacked:,.0f} | "
            f"{nacked / plain:.2f}x |",
            f"| poll + nack, then read every copy back from `%RETRY%` (whole cycle, "
            f"delay included) | {cycle:,.0f} | {cycle / plain:.2f}x |",
        ]
    )


def nack_round(config: ClientConfig, count: int, delay_s: float, round_: int) -> tuple[float, ...]:
    """(plain msgs/s, nack-phase msgs/s, whole-cycle msgs/s) of one round."""
    with Consumer(config=config, group=f"plain{round_}", topics=["work"],
                  start="earliest") as plain:  # fmt: skip
        plain_s = consume_all(plain, count, 600, len)
    nacked = [0]
    nack_done = [0.0]
    start = time.monotonic()
    with Consumer(config=config, group=f"retrying{round_}", topics=["work"],
                  start="earliest") as consumer:  # fmt: skip

        def handle(messages: list[Message]) -> int:
            originals = [m for m in messages if not m.retry]
            if originals:
                consumer.nack(originals, delay_s=delay_s)
                nacked[0] += len(originals)
                if nacked[0] >= count and not nack_done[0]:
                    nack_done[0] = time.monotonic() - start
            return len(messages) - len(originals)

        cycle_s = consume_all(consumer, count, 900, handle)
    progress(
        f"nack round {round_ + 1}: plain {count / plain_s:,.0f} msgs/s, nack phase "
        f"{count / nack_done[0]:,.0f} msgs/s, whole cycle {count / cycle_s:,.0f} msgs/s "
        f"(load {loadavg()})"
    )
    return count / plain_s, count / nack_done[0], count / cycle_s


# -- main ------------------------------------------------------------------------------------------


RUNNERS: dict[str, Callable[[Path, argparse.Namespace], str]] = {
    "produce": run_produce,
    "pending": run_pending,
    "lateness": run_lateness,
    "nack": run_nack,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (produce, nack)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each produce run")
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1024]
    )
    parser.add_argument("--pending", type=int, default=10_000_000, help="messages pending")
    parser.add_argument("--restarts", type=int, default=3, help="of each kind (pending)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="lateness messages")
    parser.add_argument("--window", type=float, default=60.0, help="lateness: due over (s)")
    parser.add_argument("--lead", type=float, default=10.0, help="lateness: first due after (s)")
    parser.add_argument("--nack-messages", type=int, default=200_000)
    parser.add_argument("--nack-delay", type=float, default=1.0, help="nack delay_s")
    parser.add_argument("--quick", action="store_true", help="a smoke run of every size cut down")
    args = parser.parse_args(argv)
    if args.quick:  # seconds in all: what the test suite runs
        args.repeat, args.seconds, args.pending, args.restarts = 1, 0.5, 20_000, 1
        args.messages, args.window, args.lead, args.nack_messages = 2_000, 2.0, 1.0, 2_000
        args.nack_delay = min(args.nack_delay, 0.2)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    chosen = SCENARIOS if args.scenario == "all" else (args.scenario,)
    root = Path(tempfile.mkdtemp(prefix="equeue-delay-bench-"))
    try:
        print(f"# delay_bench {' '.join(sys.argv[1:])}\n\n{machine_note()}\n")
        for name in chosen:
            started = time.monotonic()
            table = RUNNERS[name](root, args)
            print(f"## {name}\n\n{table}\n\n({time.monotonic() - started:.0f} s, load average "
                  f"after {loadavg()})\n", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
