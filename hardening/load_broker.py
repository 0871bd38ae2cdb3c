"""Load: 100 long-polling consumers and 8 producers on loopback, for minutes.

Run ``python hardening/load_broker.py --seconds 600`` (``make load``): starts a
broker on 127.0.0.1 in a temporary directory, one topic with a queue per
consumer, and prints a table: messages, errors, losses, duplicates, latency
percentiles and the broker's memory. Exit code 1 on any error, loss or
duplicate. ``tests/hardening/test_load.py`` runs it for 30 s.

- Consumers (this process, ``grpc.aio``, one task per consumer, ten per
  channel): each long-polls its own queue with ``Pull(max_wait_ms)`` and
  continues from ``next_offset``; every record's checksum is verified by the
  decoder, offsets must be contiguous, and no message may arrive twice.
- Producers (a second process, so that their CPU does not delay the
  consumers; ``grpc.aio``, one channel each): together ``--rate`` messages/s,
  paced on an absolute schedule, one message per ``Produce``, spread over all
  queues, so each consumer is parked most of the time when its message comes.
- Latency: the producer stamps ``time.monotonic_ns()`` into the value just
  before the call and notes when the acknowledgement arrived; the consumer
  notes when the pull reply arrived (CLOCK_MONOTONIC is the same clock in both
  processes). Reported: *send to receive* (what a consumer waits) and *ack to
  receive*, the long-poll wake-up after the producer's reply (negative when
  the parked pull answered before the producer saw its ack). The first
  ``--warmup-s`` seconds are left out.
- Memory: the broker's VmRSS sampled every second and VmHWM (peak) at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import queue
import struct
import sys
import tempfile
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.queues import Queue as ProcessQueue
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `hardening` as a package

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_checks import details_of, status_of
from equeue_broker.testing_report import table
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.records import decode_records

TOPIC = "load"
STAMP = struct.Struct(">HIq")
"""producer u16, sequence u32, send time (monotonic ns) i64: the head of every value."""
CONSUMERS_PER_CHANNEL = 10
MiB = 1 << 20


@dataclass(frozen=True)
class LoadConfig:
    seconds: float = 600.0
    consumers: int = 100
    producers: int = 8
    rate: float = 400.0
    """Messages per second over all producers."""
    value_bytes: int = 100
    max_wait_ms: int = 5_000
    """Long-poll wait; long, so that a missed wake-up shows as seconds of latency."""
    flush: str = "async"
    warmup_s: float = 2.0
    drain_s: float = 20.0
    """After the producers stop: how long the consumers may take to see everything."""
    rpc_timeout_s: float = 10.0


@dataclass
class ProducerResult:
    """Columns, one entry per acknowledged message (picklable, compact)."""

    producer: array[int] = field(default_factory=lambda: array("q"))
    seq: array[int] = field(default_factory=lambda: array("q"))
    sent_ns: array[int] = field(default_factory=lambda: array("q"))
    acked_ns: array[int] = field(default_factory=lambda: array("q"))
    queue_id: array[int] = field(default_factory=lambda: array("q"))
    errors: list[str] = field(default_factory=list)
    behind_s: float = 0.0
    """How far the slowest producer fell behind its schedule at the end (seconds)."""


# -- producers (their own process) ---------------------------------------------------------


def run_producers(address: str, config: LoadConfig, out: ProcessQueue[Any]) -> None:
    """Entry point of the producer process: produce, then put a ProducerResult."""
    try:
        out.put(asyncio.run(_produce_all(address, config)))
    except BaseException as exc:  # the parent must hear about it, not wait in vain
        failed = ProducerResult()
        failed.errors.append(f"producer process failed: {exc!r}")
        out.put(failed)


async def _produce_all(address: str, config: LoadConfig) -> ProducerResult:
    result = ProducerResult()
    start = time.monotonic() + 0.2
    end = start + config.seconds
    behind = await asyncio.gather(
        *(
            _produce(address, config, p, start=start, end=end, result=result)
            for p in range(config.producers)
        )
    )
    result.behind_s = max(behind, default=0.0)
    return result


async def _produce(
    address: str, config: LoadConfig, p: int, *, start: float, end: float, result: ProducerResult
) -> float:
    interval = config.producers / config.rate
    padding = b"x" * max(0, config.value_bytes - STAMP.size)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        for seq in range(10**9):  # bounded by the end time below
            due = start + (seq + p / config.producers) * interval
            now = time.monotonic()
            if due >= end:
                return max(0.0, now - due)
            if due > now:
                await asyncio.sleep(due - now)
            queue_id = (seq * config.producers + p) % config.consumers
            sent = time.monotonic_ns()
            value = STAMP.pack(p, seq, sent) + padding
            columns = pb.MessageColumns(count=1, values=value, value_lengths=[len(value)])
            request = pb.ProduceRequest(topic=TOPIC, messages=columns, queue_ids=[queue_id])
            try:
                await stub.Produce(request, timeout=config.rpc_timeout_s)
            except grpc.aio.AioRpcError as exc:
                result.errors.append(f"Produce: {exc.code().name} {exc.details()}")
                continue
            acked = time.monotonic_ns()
            for column, v in (
                (result.producer, p), (result.seq, seq), (result.sent_ns, sent),
                (result.acked_ns, acked), (result.queue_id, queue_id),
            ):  # fmt: skip
                column.append(v)
    return 0.0


# -- consumers (this process) ---------------------------------------------------------------


@dataclass
class Consumers:
    config: LoadConfig
    received: dict[int, int] = field(default_factory=dict)
    """(producer << 32 | seq) -> receive time, ns."""
    latency_ns: array[int] = field(default_factory=lambda: array("q"))
    duplicates: int = 0
    errors: list[str] = field(default_factory=list)
    pulls: int = 0
    empty_pulls: int = 0
    """Pulls that waited the whole max_wait_ms and came back empty."""
    expected: int | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    drained: asyncio.Event = field(default_factory=asyncio.Event)

    async def consume(self, stub: pb_grpc.BrokerAsyncStub, queue_id: int) -> None:
        config = self.config
        offset = 0
        while not self.stop.is_set():
            request = pb.PullRequest(
                topic=TOPIC, queue_id=queue_id, offset=offset, max_messages=1000,
                max_wait_ms=config.max_wait_ms,
            )  # fmt: skip
            try:
                reply = await stub.Pull(
                    request, timeout=config.max_wait_ms / 1000 + config.rpc_timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                if self.stop.is_set():
                    return
                self.errors.append(f"Pull {queue_id}@{offset}: {exc.code().name} {exc.details()}")
                if len(self.errors) > 100:
                    return
                continue
            now = time.monotonic_ns()
            self.pulls += 1
            if reply.count == 0:
                self.empty_pulls += 1
            for i, message in enumerate(decode_records(reply.records, reply.broker_id)):
                if message.offset != offset + i:
                    self.errors.append(
                        f"queue {queue_id}: offset {message.offset}, not {offset + i}"
                    )
                p, seq, sent = STAMP.unpack_from(message.value)
                key = p << 32 | seq
                if key in self.received:
                    self.duplicates += 1
                self.received[key] = now
                self.latency_ns.append(now - sent)
            offset = reply.next_offset
            if self.expected is not None and len(self.received) >= self.expected:
                self.drained.set()


@dataclass
class LoadResult:
    config: LoadConfig
    produced: int = 0
    received: int = 0
    lost: int = 0
    duplicates: int = 0
    producer_errors: list[str] = field(default_factory=list)
    consumer_errors: list[str] = field(default_factory=list)
    pulls: int = 0
    empty_pulls: int = 0
    send_to_receive_ms: dict[str, float] = field(default_factory=dict)
    ack_to_receive_ms: dict[str, float] = field(default_factory=dict)
    rss_start: int = 0
    rss_end: int = 0
    rss_peak: int = 0
    """VmHWM at the end."""
    rss_anon_end: int = 0
    rss_samples: list[int] = field(default_factory=list)
    behind_s: float = 0.0
    seconds: float = 0.0

    @property
    def achieved_rate(self) -> float:
        """Messages/s the producers sustained: they send the whole schedule, late if
        the broker cannot keep up, so lateness stretches the time taken."""
        return self.produced / max(self.config.seconds + self.behind_s, 1e-9)

    @property
    def errors(self) -> int:
        return len(self.producer_errors) + len(self.consumer_errors)


def percentiles(values: list[int] | array[int]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "p99.9": at(0.999),
            "max": ordered[-1] / 1e6}  # fmt: skip


async def _run(broker: BrokerProcess, config: LoadConfig, result: LoadResult) -> None:
    consumers = Consumers(config)
    channels = [
        grpc.aio.insecure_channel(broker.address)
        for _ in range(-(-config.consumers // CONSUMERS_PER_CHANNEL))
    ]
    tasks = [
        asyncio.create_task(
            consumers.consume(pb_grpc.BrokerStub(channels[q // CONSUMERS_PER_CHANNEL]), q)
        )
        for q in range(config.consumers)
    ]

    async def sample_rss() -> None:
        while True:  # cancelled at the end
            result.rss_samples.append(broker.rss_bytes())
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample_rss())
    context = multiprocessing.get_context("spawn")
    out: ProcessQueue[Any] = context.Queue()
    process = context.Process(
        target=run_producers, args=(broker.address, config, out), name="equeue-load-producers"
    )
    started = time.monotonic()
    process.start()
    loop = asyncio.get_running_loop()
    try:
        produced: ProducerResult = await loop.run_in_executor(
            None, lambda: out.get(timeout=config.seconds + 120)
        )
    except queue.Empty:
        produced = ProducerResult(errors=["the producer process sent no result in time"])
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(30)
    result.seconds = time.monotonic() - started
    consumers.expected = len(produced.seq)
    if len(consumers.received) >= consumers.expected:
        consumers.drained.set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(consumers.drained.wait(), config.drain_s)
    consumers.stop.set()
    sampler.cancel()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, sampler, return_exceptions=True)
    for channel in channels:
        await channel.close(None)
    _summarise(config, produced, consumers, result)


def _summarise(
    config: LoadConfig, produced: ProducerResult, consumers: Consumers, result: LoadResult
) -> None:
    result.produced = len(produced.seq)
    result.received = len(consumers.received)
    result.duplicates = consumers.duplicates
    result.producer_errors = produced.errors
    result.consumer_errors = consumers.errors
    result.pulls = consumers.pulls
    result.empty_pulls = consumers.empty_pulls
    result.behind_s = produced.behind_s
    warm = min(produced.sent_ns, default=0) + int(config.warmup_s * 1e9)
    send_to_receive: list[int] = []
    ack_to_receive: list[int] = []
    for p, seq, sent, acked in zip(
        produced.producer, produced.seq, produced.sent_ns, produced.acked_ns, strict=True
    ):
        got = consumers.received.get(p << 32 | seq)
        if got is None:
            result.lost += 1
            continue
        if sent >= warm:
            send_to_receive.append(got - sent)
            ack_to_receive.append(got - acked)
    result.send_to_receive_ms = percentiles(send_to_receive)
    result.ack_to_receive_ms = percentiles(ack_to_receive)


def run(config: LoadConfig, work_dir: Path | None = None) -> LoadResult:
    """Start a broker in ``work_dir`` (default: a temporary directory), load it, stop it."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="equeue-load-") as tmp:
            return run(config, Path(tmp))
    result = LoadResult(config)
    broker = BrokerProcess(
        work_dir / "data", "--flush", config.flush, "--max-wait-ms", str(config.max_wait_ms),
        "--log-level", "WARNING",
    )  # fmt: skip
    broker.start()
    try:
        with grpc.insecure_channel(broker.address) as channel:
            pb_grpc.AdminStub(channel).CreateTopic(
                pb.CreateTopicRequest(name=TOPIC, queue_count=config.consumers),
                timeout=config.rpc_timeout_s,
            )
        result.rss_start = broker.rss_bytes()
        asyncio.run(_run(broker, config, result))
        result.rss_end = broker.rss_bytes()
        # VmHWM can trail a sample by a few pages (per-thread RSS counters are
        # folded in lazily), so the peak is the larger of the two.
        result.rss_peak = max(broker.peak_rss_bytes(), *result.rss_samples, result.rss_end)
        result.rss_anon_end = int(broker.proc_status().get("RssAnon", "0 kB").split()[0]) * 1024
        if not broker.alive():
            result.consumer_errors.append(f"the broker died:\n{broker.log_tail()}")
        elif (code := broker.stop()) != 0:
            result.consumer_errors.append(f"broker exited with {code} on SIGTERM")
    except grpc.RpcError as exc:
        result.consumer_errors.append(f"setup: {status_of(exc).name} {details_of(exc)}")
    finally:
        broker.kill()
    return result


def report(result: LoadResult) -> str:
    c = result.config
    s2r, a2r = result.send_to_receive_ms, result.ack_to_receive_ms

    def ms(d: dict[str, float], key: str) -> str:
        return f"{d[key]:.2f} ms" if key in d else "-"

    samples = result.rss_samples or [0]
    rows: list[list[object]] = [
        ["duration (producers), s", round(result.seconds, 1)],
        ["consumers (long-polling, one queue each) / producers", f"{c.consumers} / {c.producers}"],
        ["flush mode / max_wait_ms", f"{c.flush} / {c.max_wait_ms}"],
        ["messages produced (acknowledged)", result.produced],
        ["produce rate achieved, msgs/s", round(result.achieved_rate, 1)],
        ["producers behind schedule at the end, s", round(result.behind_s, 3)],
        ["messages received", result.received],
        ["lost / duplicated", f"{result.lost} / {result.duplicates}"],
        ["errors (producers / consumers)",
         f"{len(result.producer_errors)} / {len(result.consumer_errors)}"],
        ["pulls answered / of them empty after the full wait",
         f"{result.pulls:,} / {result.empty_pulls:,}"],
        ["latency send -> receive p50 / p99 / p99.9 / max",
         " / ".join(ms(s2r, k) for k in ("p50", "p99", "p99.9", "max"))],
        ["long-poll wake-up ack -> receive p50 / p99 / max",
         " / ".join(ms(a2r, k) for k in ("p50", "p99", "max"))],
        ["broker RSS at start / end",
         f"{result.rss_start / MiB:.1f} / {result.rss_end / MiB:.1f} MiB"],
        ["broker RSS max sampled / peak (VmHWM)",
         f"{max(samples) / MiB:.1f} / {result.rss_peak / MiB:.1f} MiB"],
        ["broker anonymous RSS at end", f"{result.rss_anon_end / MiB:.1f} MiB"],
    ]  # fmt: skip
    return table(("figure", "value"), rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--consumers", type=int, default=100)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--rate", type=float, default=400.0, help="messages/s, all producers")
    parser.add_argument("--flush", choices=["sync", "async"], default="async")
    parser.add_argument("--max-wait-ms", type=int, default=5_000)
    args = parser.parse_args(argv)
    config = LoadConfig(
        seconds=args.seconds, consumers=args.consumers, producers=args.producers,
        rate=args.rate, flush=args.flush, max_wait_ms=args.max_wait_ms,
    )  # fmt: skip
    print(f"load: {config}", flush=True)
    result = run(config)
    print(f"\n## Load ({result.seconds:.0f} s)\n")
    print(report(result))
    for error in (result.producer_errors + result.consumer_errors)[:20]:
        print(f"ERROR: {error}")
    return 1 if result.errors or result.lost or result.duplicates else 0


if __name__ == "__main__":
    sys.exit(main())
