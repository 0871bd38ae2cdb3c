"""Metrics on against off: what ``--http-port`` and its scrapes cost the broker.

Run ``python bench/metrics_bench.py`` (``make bench-metrics``; about 9 minutes
with the defaults: 5 rounds of 4 arms of ~25 s), ``--quick`` for a smoke run of
a few seconds. Each round starts a fresh broker per arm, the order rotated
from round to round, so that drift on a shared machine hits every arm alike:

* **off**: no ``--http-port`` (neither aiohttp nor prometheus_client loaded);
* **on**: ``--http-port``, a scraper thread in this process fetching
  ``/metrics`` every 15 s (the shipped Prometheus interval; the first scrape
  when the produce phase starts);
* **on-1s**: the same, scraped every second (the stress figure);
* **on-idle**: ``--http-port`` and nobody scraping: the hot path's own cost
  (byte counters, the RPC timer), which no scrape cost can hide.

Every arm with the port is scraped once before the preload, untimed (the
first render), and once more after the workloads, for the series count (that
scrape's time is on-idle's only scrape figure).

Every broker is first loaded with ``topics`` x ``queues`` (100 x 8) holding a
few messages each and ``groups`` (10) with committed offsets on ten topics
each (about 4,000 series: a mid-size exposition), then runs
``bench/broker_bench.py``'s workloads (its functions): produce batches of
1,000 x 100 B with ``Producer.send_batch`` for ``--seconds`` in async flush
mode, then pull them back raw (``Pull`` RPCs, records counted, not decoded).

Reported per arm: the median msg/s of produce and pull over the rounds and its
ratio to off's median (target: "on" >= 0.95x), the broker's CPU seconds per
million messages (``/proc/<pid>/stat`` utime + stime around each phase;
steadier than msg/s on a shared machine), scrape duration p50/p99 as this
process saw it, and the series count of the last scrape. The load average at
the start is printed with the table: other processes on the machine move
every figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._broker_measure import QUEUES, RPC_TIMEOUT_S, Plan, percentile
from bench._measure import progress
from bench._servers import START_TIMEOUT_S, free_port
from bench.broker_bench import equeue_produce, equeue_pull
from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.connection import Connection

SIZE = 100
ARMS = ("off", "on", "on-1s", "on-idle")
INTERVALS = {"on": 15.0, "on-1s": 1.0}
"""Scrape interval per arm (the others are not scraped while measuring)."""
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Preload:
    topics: int
    queues: int
    groups: int
    topics_per_group: int


FULL_PRELOAD = Preload(100, 8, 10, 10)
QUICK_PRELOAD = Preload(4, 2, 2, 2)


@dataclass
class Arm:
    name: str
    produce: list[float] = field(default_factory=list)
    """msg/s per round."""
    pull: list[float] = field(default_factory=list)
    produce_cpu: list[float] = field(default_factory=list)
    """Broker CPU seconds per million messages, per round."""
    pull_cpu: list[float] = field(default_factory=list)
    scrapes_ms: list[float] = field(default_factory=list)
    series: int = 0


def broker_cpu(pid: int) -> float:
    """The broker's CPU seconds so far (user + system; its threads included)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def fetch_metrics(url: str) -> tuple[float, int]:
    """(ms to fetch /metrics, series in it)."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as reply:
        body = reply.read()
    elapsed = (time.perf_counter() - started) * 1000
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return elapsed, series


class Scraper:
    """A thread fetching ``url`` every ``interval_s`` (the first at once), as
    Prometheus would; keeps each scrape's duration."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self.durations: list[float] = []
        self.series = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                ms, self.series = fetch_metrics(self.url)
                self.durations.append(ms)
            except OSError:
                self.failures += 1
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def preload(config: ClientConfig, shape: Preload) -> None:
    """``shape.topics`` topics of ``shape.queues`` queues with one message per
    queue, and groups with committed offsets (1 of 2 per queue: lag 1)."""
    per_queue = list(range(shape.queues))
    with Admin(config=config) as admin, Producer(config=config) as producer:
        for t in range(shape.topics):
            topic = f"pre-{t:03d}"
            admin.create_topic(topic, queues=shape.queues)
            producer.send_batch(topic, [b"x" * SIZE] * 2 * shape.queues, queue_ids=per_queue * 2)
        for g in range(shape.groups):
            topics = [f"pre-{(g + i) % shape.topics:03d}" for i in range(shape.topics_per_group)]
            admin.commit_offsets(f"group-{g:02d}", {(t, q): 1 for t in topics for q in per_queue})


def start_broker(name: str, root: Path) -> tuple[BrokerProcess, str, int | None]:
    """A fresh broker for arm ``name``: (process, address, HTTP port or None).
    The HTTP port is picked here (the log level hides the line naming a port
    0 chose); another process may take it first on a shared machine: retried."""
    for attempt in range(3):
        http_port = free_port() if name != "off" else None
        flags = ["--flush", "async", "--log-level", "WARNING"]
        if http_port is not None:
            flags += ["--http-port", str(http_port)]
        data_dir = root / name / f"data{attempt}"
        data_dir.mkdir(parents=True)
        broker = BrokerProcess(data_dir, *flags, log_path=root / name / f"broker{attempt}.log")
        try:
            return broker, broker.start(START_TIMEOUT_S), http_port
        except RuntimeError as exc:
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
            progress(f"  {name}: port taken meanwhile, starting again")
    raise AssertionError("unreachable")


def run_arm(name: str, root: Path, plan: Plan, shape: Preload, arm: Arm) -> None:
    broker, address, http_port = start_broker(name, root)
    url = f"http://127.0.0.1:{http_port}/metrics"
    try:
        config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)
        if http_port is not None:  # warm-up, not kept: the first render sets up its thread
            fetch_metrics(url)  # (before the preload: its rendering is no longer cached after)
        preload(config, shape)
        interval = INTERVALS.get(name)
        scraper = Scraper(url, interval) if interval is not None else None
        with Admin(config=config) as admin, Producer(config=config) as producer:
            admin.create_topic("bench", queues=QUEUES)
            with Connection(config) as conn:
                if scraper is not None:
                    scraper.__enter__()
                try:
                    cpu = broker_cpu(broker.pid)
                    stored, produced = equeue_produce(producer, "bench", SIZE, plan)
                    cpu_produce = broker_cpu(broker.pid) - cpu
                    cpu = broker_cpu(broker.pid)
                    pulled = equeue_pull(conn, "bench", SIZE, stored, plan, decode=False)
                    cpu_pull = broker_cpu(broker.pid) - cpu
                finally:
                    if scraper is not None:
                        scraper.__exit__()
        arm.produce.append(produced.rate)
        arm.pull.append(pulled.rate)
        arm.produce_cpu.append(cpu_produce / produced.messages * 1e6)
        arm.pull_cpu.append(cpu_pull / max(1, pulled.messages) * 1e6)
        if scraper is not None:
            arm.scrapes_ms += scraper.durations
            if scraper.failures:
                progress(f"  {name}: {scraper.failures} scrapes failed")
        if http_port is not None:  # after the workloads: the exposition's size
            ms, arm.series = fetch_metrics(url)
            if scraper is None:
                arm.scrapes_ms.append(ms)
        progress(
            f"  {name}: produce {produced.rate:,.0f}/s ({arm.produce_cpu[-1]:.2f} CPU-s/M), "
            f"pull {pulled.rate:,.0f}/s ({arm.pull_cpu[-1]:.2f} CPU-s/M)"
        )
    finally:
        broker.stop()


def _ratio(values: list[float], base: list[float]) -> str:
    return f"{statistics.median(values) / statistics.median(base):.3f}x" if base else "-"


def table(arms: dict[str, Arm]) -> str:
    off = arms["off"]
    lines = [
        "| arm | produce msg/s | x off | pull msg/s | x off | broker CPU-s/M produced "
        "| broker CPU-s/M pulled | scrapes | scrape p50 ms | scrape p99 ms | series |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in arms.values():
        scraped = arm.scrapes_ms
        cells = [
            arm.name,
            f"{statistics.median(arm.produce):,.0f}",
            _ratio(arm.produce, off.produce),
            f"{statistics.median(arm.pull):,.0f}",
            _ratio(arm.pull, off.pull),
            f"{statistics.median(arm.produce_cpu):.2f}",
            f"{statistics.median(arm.pull_cpu):.2f}",
            str(len(scraped)) if arm.name in INTERVALS else "-",
            f"{percentile(scraped, 0.5):.0f}" if scraped else "-",
            f"{percentile(scraped, 0.99):.0f}" if scraped else "-",
            f"{arm.series:,}" if arm.series else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every arm (default 5)")
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="produce phase per arm (default 15)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: one round, 1 s phases, tiny preload"
    )
    args = parser.parse_args(argv)
    rounds, seconds, shape = args.rounds, args.seconds, FULL_PRELOAD
    if args.quick:
        rounds, seconds, shape = 1, 1.0, QUICK_PRELOAD
    if rounds < 1 or seconds <= 0:
        parser.error("--rounds must be at least 1 and --seconds above 0")
    # Pull reads back everything produced, capped at twice the produce time.
    plan = Plan(seconds, 10**12, 2 * seconds, 0.0, 1, 0)
    load = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    progress(f"metrics bench: {rounds} rounds x {len(ARMS)} arms, {seconds:g} s produce, "
             f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    arms = {name: Arm(name) for name in ARMS}
    root = Path(tempfile.mkdtemp(prefix="equeue-metrics-bench-"))
    try:
        for r in range(rounds):
            progress(f"round {r + 1}/{rounds}")
            # Rotated each round: no arm always follows the same one (the one
            # before leaves its writes to the kernel's writeback).
            for name in ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]:
                run_arm(name, root / f"round{r}", plan, shape, arms[name])
                shutil.rmtree(root / f"round{r}", ignore_errors=True)  # ~1 GB an arm
            progress(table(arms))  # so far: a failure later loses no round
    finally:
        shutil.rmtree(root, ignore_errors=True)
    end_load = os.getloadavg()
    print(
        f"metrics on against off, {started}, {rounds} rounds, produce {seconds:g} s per arm, "
        f"preload {shape.topics} topics x {shape.queues} queues, {shape.groups} groups; "
        f"load average at start {load[0]:.2f} (1 min), at end {end_load[0]:.2f}, "
        f"{os.cpu_count()} cores\n"
    )
    print(table(arms))


if __name__ == "__main__":
    main()
