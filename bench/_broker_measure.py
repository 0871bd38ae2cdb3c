"""The broker benchmark's plan, results and measurement helpers.

Shared by ``bench/broker_bench.py`` (equeue) and ``bench/_redis_nats.py`` (Redis
Streams, NATS JetStream): the workload constants, the plan (how long each
scenario runs), one sample and the rows of the tables, and the helpers that
time produce batches and stamp values for latency. Nothing here is imported by
the broker or the client.
"""

from __future__ import annotations

import math
import random
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench._measure import progress, size_label

SIZES = (100, 1024)
BATCH = 1_000
QUEUES = 4
PULL_MAX_BYTES = 8 << 20
"""Pull byte limit, high enough that max_messages=1000 is what bounds a pull."""
LONG_POLL_MS = 1_000
RPC_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 10.0
"""After the last latency send, how long the consumer may take to see everything."""
STAMP = struct.Struct(">q")
LATENCY_SIZE = 100

EQUEUE = "equeue"
REDIS = "Redis Streams"
NATS = "NATS JetStream"


@dataclass(frozen=True)
class Plan:
    produce_s: float
    """Each produce scenario runs this long ..."""
    produce_max_bytes: int
    """... or until it has sent this many value bytes (a memory bound for Redis)."""
    pull_s: float
    """A pull scenario stops after this long even if it has not read everything."""
    latency_s: float
    latency_rate: int
    latency_warmup: int


FULL = Plan(5.0, 300_000_000, 5.0, 5.0, 200, 20)
QUICK = Plan(0.5, 20_000_000, 0.5, 0.75, 200, 5)


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    messages: int
    seconds: float
    value_bytes: int
    capped: bool = False
    """Stopped by the time cap before reading everything."""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mbps(self) -> float:
        return self.value_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass
class Row:
    system: str
    workload: str
    size: int
    flush: str
    method: str
    versus: str | None
    """The equeue workload this row's ratio is taken against (None: no ratio)."""
    samples: list[Sample] = field(default_factory=list)

    def rate(self) -> float:
        return statistics.median(s.rate for s in self.samples)

    def mbps(self) -> float:
        return statistics.median(s.mbps for s in self.samples)


Parts = dict[str, list[float]]
"""A latency run's breakdown: per part (``PARTS``), each message's ms."""

PARTS = ("produce call", "ack to reply", "decode")
"""Where a message's latency goes, as the client sees it: the produce call (the
stamp to the send call's return: the client's work, the request's way, the
broker's append, the acknowledgement's way back), from that return to the
consumer's reply leaving its receive call (the broker's wake-up of the parked
read, its reply; negative when the read returned first), and the decode."""


@dataclass
class LatencyRow:
    system: str
    flush: str
    method: str
    runs: list[list[float]] = field(default_factory=list)
    """Per run: latencies in ms."""
    parts: list[Parts] = field(default_factory=list)
    """Per run with a breakdown: the parts' ms."""

    def stat(self, q: float) -> float:
        return statistics.median(percentile(run, q) for run in self.runs)

    def part(self, name: str, q: float) -> float:
        runs = [p[name] for p in self.parts if p.get(name)]
        return statistics.median(percentile(r, q) for r in runs) if runs else math.nan


RowKey = tuple[str, str, int, str]


class Results:
    def __init__(self) -> None:
        self.rows: dict[RowKey, Row] = {}
        self.latency: dict[tuple[str, str], LatencyRow] = {}
        self.notes: list[str] = []

    def add(self, key: RowKey, method: str, sample: Sample, versus: str | None = None) -> None:
        system, workload, size, flush = key
        row = self.rows.setdefault(key, Row(system, workload, size, flush, method, versus))
        row.samples.append(sample)
        capped = " (time-capped)" if sample.capped else ""
        progress(
            f"{system:15} {workload:14} {size_label(size):6} {flush:5} "
            f"{sample.rate:12,.0f} msgs/s {sample.mbps:8.1f} MB/s "
            f"({sample.messages:,} msgs in {sample.seconds:.2f} s){capped}"
        )

    def add_latency(
        self, system: str, flush: str, method: str, run: list[float], parts: Parts | None = None
    ) -> None:
        row = self.latency.setdefault((system, flush), LatencyRow(system, flush, method))
        row.runs.append(run)
        if parts:
            row.parts.append(parts)
        progress(
            f"{system:15} latency        {flush:5} n={len(run)} "
            f"p50={percentile(run, 0.5):.2f} ms p99={percentile(run, 0.99):.2f} ms"
        )

    def row(self, system: str, workload: str, size: int, flush: str) -> Row | None:
        return self.rows.get((system, workload, size, flush))

    def ratio(self, row: Row) -> float | None:
        """equeue's rate on the comparable workload over this row's rate."""
        if row.versus is None:
            return None
        ours = self.row(EQUEUE, row.versus, row.size, row.flush)
        if ours is None or row.rate() == 0:
            return None
        return ours.rate() / row.rate()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in (0, 1])."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def values_for(size: int) -> list[bytes]:
    rng = random.Random(size)
    return [rng.randbytes(size) for _ in range(BATCH)]


def stamped(size: int) -> bytes:
    """A value whose first 8 bytes are the current perf_counter_ns."""
    return STAMP.pack(time.perf_counter_ns()) + bytes(size - STAMP.size)


def age_ms(value: bytes, now_ns: int) -> float:
    sent_ns: int = STAMP.unpack_from(value)[0]
    return (now_ns - sent_ns) / 1e6


def pace(total: int, rate: int, send: Callable[[bytes], object]) -> dict[int, int]:
    """Call ``send`` with a fresh stamped value ``total`` times at ``rate``/s;
    {each value's stamp: perf_counter_ns when its send returned}."""
    acked: dict[int, int] = {}
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        value = stamped(LATENCY_SIZE)
        send(value)
        acked[STAMP.unpack_from(value)[0]] = time.perf_counter_ns()
    return acked


Seen = tuple[int, int, int]
"""A message as its consumer saw it: (its stamp, when its reply was received,
when it was decoded), perf_counter_ns."""


def latencies(seen: list[Seen], acked: dict[int, int], warmup: int) -> tuple[list[float], Parts]:
    """The latencies in ms of ``seen`` after the first ``warmup``, and their breakdown."""
    kept = seen[warmup:]
    total = [(decoded - sent) / 1e6 for sent, _received, decoded in kept]
    parts: Parts = {name: [] for name in PARTS}
    for sent, received, decoded in kept:
        ack = acked.get(sent)
        if ack is None:
            continue
        parts["produce call"].append((ack - sent) / 1e6)
        parts["ack to reply"].append((received - ack) / 1e6)
        parts["decode"].append((decoded - received) / 1e6)
    return total, parts


def stamp_of(value: bytes) -> int:
    sent_ns: int = STAMP.unpack_from(value)[0]
    return sent_ns


def timed_batches(plan: Plan, batch_bytes: int, send_batch: Callable[[int], object]) -> Sample:
    """Call ``send_batch(n)`` (n = 0, 1, ...) for ``plan.produce_s`` seconds or
    until ``plan.produce_max_bytes`` are sent; the produce sample."""
    max_batches = max(1, plan.produce_max_bytes // batch_bytes)
    sent = 0
    start = time.perf_counter()
    deadline = start + plan.produce_s
    while sent < max_batches and time.perf_counter() < deadline:
        send_batch(sent)
        sent += 1
    elapsed = time.perf_counter() - start
    return Sample(sent * BATCH, elapsed, sent * batch_bytes)


def wait_for(done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
