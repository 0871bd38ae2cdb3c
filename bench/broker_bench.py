"""Broker benchmark: equeue beside Redis Streams and NATS JetStream, same run, one client.

Run ``python bench/broker_bench.py`` (about 3 minutes here; ``--quick`` for a
~20 s smoke run; ``--repeat N`` reports the median of N runs). Every server is
started by the script on 127.0.0.1 in a temporary directory under /tmp (removed
at the end) and stopped at the end; Redis and NATS are skipped, with a note, when
``redis-server`` / ``nats-server`` are not installed. All clients live in this
one Python process, so every system pays the same Python client tax.

Workloads (values of 100 B and 1 KiB, random bytes generated once per size):

* produce: batches of 1,000 messages, one batch per round trip, for
  ``produce_s`` seconds (or until ``produce_max_bytes`` of values), one topic of
  4 queues, in both flush modes (a fresh server per mode).
  equeue: ``Producer.send_batch`` (keyless, so the broker round-robins whole
  batches over the 4 queues). Redis: 1,000 ``XADD`` in one non-transactional
  pipeline, the batches round-robin over 4 streams. NATS: 1,000
  ``publish_async`` then wait for the 1,000 acks. A diagnostic equeue row,
  "produce (raw)", sends one prebuilt request on the stub and ignores the reply
  (no SendResult per message): the broker's side alone.
* pull: everything the async produce scenario stored, read back queue by queue
  in requests of 1,000 (capped at ``pull_s`` seconds). equeue: raw ``Pull`` RPCs
  on the stub (max_messages=1000, max_bytes high enough not to bind), records
  decoded with ``decode_records`` (the fair figure: Redis and NATS clients hand
  back parsed messages), and again only counting records (labelled raw).
  Redis: ``XREADGROUP COUNT 1000`` with the previous batch's ``XACK`` pipelined
  into the same round trip; and plain ``XRANGE`` with an exclusive start. NATS:
  a durable pull consumer, ``fetch(1000)``, ack policy "all", the last message
  of each batch acked.
* latency: a consumer thread parked in a long poll while the producer sends
  single 100 B messages at ``latency_rate``/s for ``latency_s`` seconds (the
  first ``latency_warmup`` are dropped). Latency = consumer's clock after
  decoding minus the producer's clock just before the send call, both
  ``time.perf_counter_ns`` in this process (the stamp travels in the value).
  equeue: ``Pull(max_wait_ms=1000)``; Redis: ``XREAD BLOCK 1000``; NATS: a push
  consumer (ack policy none) on the same event loop as the publisher.

Flush modes: equeue async = fsync every 100 ms, sync = append returns after
fsync (shared by concurrent appends). Redis async = ``appendfsync everysec``,
sync = ``appendfsync always`` (AOF on, RDB and AOF rewrites off). NATS 2.9 has
no per-write fsync setting (``sync_interval`` arrived in 2.10): its file store is
measured once, labelled async, and is the least durable of the three.

Rates count messages; MB/s counts value bytes (10^6 B). "equeue / this" is the
equeue rate for the same workload, size and flush mode divided by the row's
rate, both medians of this run's repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import math
import os
import random
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._servers import (
    HOST,
    Server,
    server_version,
    start_equeue,
    start_nats,
    start_redis,
)
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.batches import build_request
from equeue_spark.client.connection import Connection
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.records import decode_records

if TYPE_CHECKING:  # imported where used, so that a missing client only skips its system
    import nats.js
    import redis

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
PRODUCE_TARGET = 5.0
PULL_TARGET = 10.0
NA = "-"

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


@dataclass
class LatencyRow:
    system: str
    flush: str
    method: str
    runs: list[list[float]] = field(default_factory=list)
    """Per run: latencies in ms."""

    def stat(self, q: float) -> float:
        return statistics.median(percentile(run, q) for run in self.runs)


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

    def add_latency(self, system: str, flush: str, method: str, run: list[float]) -> None:
        row = self.latency.setdefault((system, flush), LatencyRow(system, flush, method))
        row.runs.append(run)
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


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def values_for(size: int) -> list[bytes]:
    rng = random.Random(size)
    return [rng.randbytes(size) for _ in range(BATCH)]


def stamped(size: int) -> bytes:
    """A value whose first 8 bytes are the current perf_counter_ns."""
    return STAMP.pack(time.perf_counter_ns()) + bytes(size - STAMP.size)


def age_ms(value: bytes, now_ns: int) -> float:
    sent_ns: int = STAMP.unpack_from(value)[0]
    return (now_ns - sent_ns) / 1e6


def pace(total: int, rate: int, send: Callable[[bytes], object]) -> None:
    """Call ``send`` with a fresh stamped value ``total`` times at ``rate``/s."""
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(stamped(LATENCY_SIZE))


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


# -- equeue ------------------------------------------------------------------------------------


def run_equeue(root: Path, plan: Plan, results: Results, servers: list[Server]) -> None:
    for flush in ("async", "sync"):
        server, address = start_equeue(root / f"equeue-{flush}" / "data", flush)
        servers.append(server)
        config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)
        with Admin(config=config) as admin, Producer(config=config) as producer:
            with Connection(config) as conn:
                for size in SIZES:
                    topic = f"bench-{size}"
                    admin.create_topic(topic, queues=QUEUES)
                    stored, sample = equeue_produce(producer, topic, size, plan)
                    method = f"Producer.send_batch, {BATCH:,}/request, {QUEUES} queues"
                    results.add((EQUEUE, "produce", size, flush), method, sample)
                    admin.create_topic(f"{topic}-stream", queues=QUEUES)
                    sample = equeue_produce_stream(producer, f"{topic}-stream", size, plan)
                    method = f"Producer.send_batches: ProduceStream, {BATCH:,}/request, pipelined"
                    results.add((EQUEUE, "produce (stream)", size, flush), method, sample)
                    admin.create_topic(f"{topic}-raw", queues=QUEUES)
                    sample = equeue_produce_raw(conn, f"{topic}-raw", size, plan)
                    method = (
                        "Produce RPC on the stub, request built once, reply not turned "
                        "into SendResults (diagnostic: the broker's side alone)"
                    )
                    results.add((EQUEUE, "produce (raw)", size, flush), method, sample)
                    if flush != "async":
                        continue
                    for decode in (True, False):
                        sample = equeue_pull(conn, topic, size, stored, plan, decode=decode)
                        workload = "pull" if decode else "pull (raw)"
                        method = (
                            "Pull RPC, max_messages=1000, + decode_records"
                            if decode
                            else "Pull RPC, max_messages=1000, records counted, NOT decoded"
                        )
                        results.add((EQUEUE, workload, size, flush), method, sample)
                    sample = equeue_pull_stream(conn, topic, size, stored, plan)
                    method = "PullStream (server streaming), 1,000/reply, + decode_records"
                    results.add((EQUEUE, "pull (stream)", size, flush), method, sample)
            run = equeue_latency(admin, producer, address, plan)
            method = f"Pull(max_wait_ms={LONG_POLL_MS}) in a thread; send_batch of 1"
            results.add_latency(EQUEUE, flush, method, run)
        server.stop()


def equeue_produce(producer: Producer, topic: str, size: int, plan: Plan) -> tuple[int, Sample]:
    values = values_for(size)
    producer.send_batch(topic, values)  # warm-up: channel, first chunk, page faults
    sample = timed_batches(plan, size * BATCH, lambda _n: producer.send_batch(topic, values))
    return BATCH + sample.messages, sample


def equeue_produce_stream(producer: Producer, topic: str, size: int, plan: Plan) -> Sample:
    """The same batches, pipelined on one ProduceStream call."""
    values = values_for(size)
    max_batches = max(1, plan.produce_max_bytes // (size * BATCH))
    start = time.perf_counter()
    deadline = start + plan.produce_s

    def batches() -> Iterator[list[bytes]]:
        for _ in range(max_batches):
            if time.perf_counter() >= deadline:
                return
            yield values

    sent = sum(len(r) for r in producer.send_batches(topic, batches()))
    elapsed = time.perf_counter() - start
    return Sample(sent, elapsed, sent * size)


def equeue_produce_raw(conn: Connection, topic: str, size: int, plan: Plan) -> Sample:
    """The same batches as ``equeue_produce`` without the client library's
    per-message work: one prebuilt ProduceRequest sent again and again."""
    request = build_request(topic, values_for(size))
    conn.broker.Produce(request, timeout=RPC_TIMEOUT_S)  # warm-up
    return timed_batches(
        plan, size * BATCH, lambda _n: conn.broker.Produce(request, timeout=RPC_TIMEOUT_S)
    )


def equeue_pull(
    conn: Connection, topic: str, size: int, stored: int, plan: Plan, *, decode: bool
) -> Sample:
    count = 0
    capped = False
    start = time.perf_counter()
    deadline = start + plan.pull_s
    for queue_id in range(QUEUES):
        offset = 0
        while not capped:
            request = pb.PullRequest(
                topic=topic,
                queue_id=queue_id,
                offset=offset,
                max_messages=BATCH,
                max_bytes=PULL_MAX_BYTES,
            )
            reply = conn.pull(request, timeout=RPC_TIMEOUT_S)
            if reply.count == 0:
                break
            if decode:
                count += len(decode_records(reply.records, reply.broker_id))
            else:
                count += reply.count
            offset = reply.next_offset
            capped = time.perf_counter() >= deadline
    elapsed = time.perf_counter() - start
    if not capped and count != stored:
        raise RuntimeError(f"equeue pull read {count:,} messages of {stored:,} stored")
    return Sample(count, elapsed, count * size, capped)


def equeue_pull_stream(conn: Connection, topic: str, size: int, stored: int, plan: Plan) -> Sample:
    """Every queue read with one server-streaming call each, decoded."""
    count = 0
    capped = False
    start = time.perf_counter()
    deadline = start + plan.pull_s
    for queue_id in range(QUEUES):
        for reply in stream_replies(conn, topic, queue_id, 0, batch_messages=BATCH,
                                    batch_bytes=PULL_MAX_BYTES):  # fmt: skip
            count += len(decode_records(reply.records, reply.broker_id))
            if time.perf_counter() >= deadline:
                capped = True
                break
        if capped:
            break
    elapsed = time.perf_counter() - start
    if not capped and count != stored:
        raise RuntimeError(f"equeue stream read {count:,} messages of {stored:,} stored")
    return Sample(count, elapsed, count * size, capped)


def equeue_latency(admin: Admin, producer: Producer, address: str, plan: Plan) -> list[float]:
    topic = "latency"
    admin.create_topic(topic, queues=1)
    total = plan.latency_warmup + int(plan.latency_rate * plan.latency_s)
    latencies: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)

    def consume(conn: Connection) -> None:
        offset = 0
        try:
            while not stop.is_set():
                request = pb.PullRequest(
                    topic=topic,
                    queue_id=0,
                    offset=offset,
                    max_messages=BATCH,
                    max_wait_ms=LONG_POLL_MS,
                )
                reply = conn.broker.Pull(request, timeout=RPC_TIMEOUT_S + LONG_POLL_MS / 1000)
                if reply.count:
                    messages = decode_records(reply.records, reply.broker_id)
                    now = time.perf_counter_ns()
                    latencies.extend(age_ms(m.value, now) for m in messages)
                offset = reply.next_offset
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with Connection(config) as conn:
        request = pb.PullRequest(topic=topic, queue_id=0, offset=0, max_messages=1)
        conn.broker.Pull(request, timeout=RPC_TIMEOUT_S)  # connect before timing
        thread = threading.Thread(
            target=consume, args=(conn,), name="latency-consumer", daemon=True
        )
        thread.start()
        time.sleep(0.1)  # let the first pull park
        try:
            pace(total, plan.latency_rate, lambda value: producer.send_batch(topic, [value]))
            wait_for(lambda: len(latencies) >= total or bool(errors), DRAIN_TIMEOUT_S)
        finally:
            stop.set()
            thread.join(RPC_TIMEOUT_S + LONG_POLL_MS / 1000)
    if errors:
        raise errors[0]
    return latencies[plan.latency_warmup :]


# -- Redis Streams -----------------------------------------------------------------------------


def run_redis(root: Path, plan: Plan, results: Results, servers: list[Server]) -> bool:
    import redis

    for flush, appendfsync in (("async", "everysec"), ("sync", "always")):
        started = start_redis(root / f"redis-{appendfsync}", appendfsync)
        if started is None:
            return False
        server, port = started
        servers.append(server)
        with redis.Redis(host=HOST, port=port, socket_timeout=RPC_TIMEOUT_S) as client:
            for size in SIZES:
                streams = [f"bench-{size}:{q}" for q in range(QUEUES)]
                stored, sample = redis_produce(client, streams, size, plan)
                method = f"XADD x{BATCH:,} pipelined, {QUEUES} streams (appendfsync {appendfsync})"
                results.add((REDIS, "produce", size, flush), method, sample, versus="produce")
                if flush != "async":
                    continue
                sample = redis_pull_group(client, streams, size, stored, plan)
                method = "XREADGROUP COUNT 1000 + previous XACK, one round trip"
                results.add((REDIS, "pull", size, flush), method, sample, versus="pull")
                sample = redis_pull_range(client, streams, size, stored, plan)
                method = "XRANGE COUNT 1000, exclusive start"
                results.add((REDIS, "pull (XRANGE)", size, flush), method, sample, versus="pull")
            run = redis_latency(port, plan)
            method = f"XREAD BLOCK {LONG_POLL_MS} in a thread; XADD of 1"
            results.add_latency(REDIS, flush, method, run)
        server.stop()
    return True


Entry = tuple[bytes, dict[bytes, bytes]]


def range_entries(reply: object) -> list[Entry]:
    """XRANGE's reply: [(id, {field: value})] (bytes, as the client was not told to decode)."""
    return cast("list[Entry]", reply or [])


def stream_entries(reply: object) -> list[Entry]:
    """The entries of a one-stream XREAD/XREADGROUP reply (RESP2: [[name, entries]];
    RESP3: {name: [entries]}); empty when the read found nothing."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return range_entries(next(iter(reply.values())))
    return range_entries(cast("list[list[object]]", reply)[0][1])


def redis_produce(
    client: redis.Redis, streams: list[str], size: int, plan: Plan
) -> tuple[int, Sample]:
    values = values_for(size)

    def send_batch(n: int) -> None:
        stream = streams[n % len(streams)]
        pipe = client.pipeline(transaction=False)
        for value in values:
            pipe.xadd(stream, {b"v": value})
        pipe.execute()

    send_batch(len(streams) - 1)  # warm-up; the measured batches start at stream 0
    sample = timed_batches(plan, size * BATCH, send_batch)
    return BATCH + sample.messages, sample


def redis_pull_group(
    client: redis.Redis, streams: list[str], size: int, stored: int, plan: Plan
) -> Sample:
    group = "bench"
    for stream in streams:
        client.xgroup_create(stream, group, id="0")
    count = 0
    capped = False
    start = time.perf_counter()
    deadline = start + plan.pull_s
    for stream in streams:
        unacked: list[bytes] = []
        while not capped:
            pipe = client.pipeline(transaction=False)
            if unacked:
                pipe.xack(stream, group, *unacked)
            pipe.xreadgroup(group, "consumer-1", {stream: ">"}, count=BATCH)
            entries = stream_entries(pipe.execute()[-1])
            if not entries:
                break  # the previous batch was acked in this round trip
            count += len(entries)
            unacked = [entry_id for entry_id, _fields in entries]
            capped = time.perf_counter() >= deadline
    elapsed = time.perf_counter() - start
    if not capped and count != stored:
        raise RuntimeError(f"Redis XREADGROUP read {count:,} messages of {stored:,} stored")
    return Sample(count, elapsed, count * size, capped)


def redis_pull_range(
    client: redis.Redis, streams: list[str], size: int, stored: int, plan: Plan
) -> Sample:
    count = 0
    capped = False
    start = time.perf_counter()
    deadline = start + plan.pull_s
    for stream in streams:
        low: bytes = b"-"
        while not capped:
            entries = range_entries(client.xrange(stream, min=low, max=b"+", count=BATCH))
            if not entries:
                break
            count += len(entries)
            low = b"(" + entries[-1][0]
            capped = time.perf_counter() >= deadline
    elapsed = time.perf_counter() - start
    if not capped and count != stored:
        raise RuntimeError(f"Redis XRANGE read {count:,} messages of {stored:,} stored")
    return Sample(count, elapsed, count * size, capped)


def redis_latency(port: int, plan: Plan) -> list[float]:
    import redis

    stream = "latency"
    total = plan.latency_warmup + int(plan.latency_rate * plan.latency_s)
    latencies: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    timeout = RPC_TIMEOUT_S + LONG_POLL_MS / 1000

    def consume(client: redis.Redis) -> None:
        last: bytes = b"0-0"
        try:
            while not stop.is_set():
                reply = client.xread({stream: last}, count=BATCH, block=LONG_POLL_MS)
                entries = stream_entries(reply)
                if not entries:
                    continue
                now = time.perf_counter_ns()
                latencies.extend(age_ms(fields[b"v"], now) for _id, fields in entries)
                last = entries[-1][0]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with (
        redis.Redis(host=HOST, port=port, socket_timeout=timeout) as consumer,
        redis.Redis(host=HOST, port=port, socket_timeout=timeout) as producer,
    ):
        consumer.ping()
        producer.ping()
        thread = threading.Thread(
            target=consume, args=(consumer,), name="latency-consumer", daemon=True
        )
        thread.start()
        time.sleep(0.1)  # let the first XREAD block
        try:
            pace(total, plan.latency_rate, lambda value: producer.xadd(stream, {b"v": value}))
            wait_for(lambda: len(latencies) >= total or bool(errors), DRAIN_TIMEOUT_S)
        finally:
            stop.set()
            thread.join(timeout)
    if errors:
        raise errors[0]
    return latencies[plan.latency_warmup :]


# -- NATS JetStream ----------------------------------------------------------------------------


def run_nats(root: Path, plan: Plan, results: Results, servers: list[Server]) -> bool:
    started = start_nats(root / "nats")
    if started is None:
        return False
    server, port = started
    servers.append(server)
    asyncio.run(nats_workloads(port, plan, results))
    server.stop()
    return True


async def nats_workloads(port: int, plan: Plan, results: Results) -> None:
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(f"nats://{HOST}:{port}", connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=RPC_TIMEOUT_S)
        for attempt in range(100):  # JetStream may need a moment after the port opens
            try:
                await js.account_info()
                break
            except Exception:
                if attempt == 99:
                    raise
                await asyncio.sleep(0.05)
        for size in SIZES:
            name, subject = f"bench-{size}", f"bench.{size}"
            await js.add_stream(name=name, subjects=[subject], storage=StorageType.FILE)
            stored, sample = await nats_produce(js, subject, size, plan)
            method = f"publish_async x{BATCH:,}, then await the {BATCH:,} acks"
            results.add((NATS, "produce", size, "async"), method, sample, versus="produce")
            sample = await nats_pull(js, name, subject, size, stored=stored, plan=plan)
            method = "pull consumer fetch(1000), ack policy all, ack last"
            results.add((NATS, "pull", size, "async"), method, sample, versus="pull")
        run = await nats_latency(js, plan)
        method = "push consumer (ack none), same event loop; js.publish of 1"
        results.add_latency(NATS, "async", method, run)
    finally:
        await nc.close()


async def nats_produce(
    js: nats.js.JetStreamContext, subject: str, size: int, plan: Plan
) -> tuple[int, Sample]:
    values = values_for(size)

    async def send_batch() -> None:
        futures = [await js.publish_async(subject, value) for value in values]
        await asyncio.gather(*futures)

    await send_batch()  # warm-up
    max_batches = max(1, plan.produce_max_bytes // (size * BATCH))
    sent = 0
    start = time.perf_counter()
    deadline = start + plan.produce_s
    while sent < max_batches and time.perf_counter() < deadline:
        await send_batch()
        sent += 1
    elapsed = time.perf_counter() - start
    return BATCH * (sent + 1), Sample(sent * BATCH, elapsed, sent * BATCH * size)


async def nats_pull(
    js: nats.js.JetStreamContext, stream: str, subject: str, size: int, *, stored: int, plan: Plan
) -> Sample:
    from nats.js.api import AckPolicy, ConsumerConfig

    config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=100_000)
    sub = await js.pull_subscribe(subject, durable="bench", stream=stream, config=config)
    count = 0
    capped = False
    start = time.perf_counter()
    deadline = start + plan.pull_s
    # Stop at the known count: a fetch past the end would wait out its timeout.
    while count < stored and not capped:
        messages = await sub.fetch(BATCH, timeout=RPC_TIMEOUT_S)
        count += len(messages)
        await messages[-1].ack()
        capped = time.perf_counter() >= deadline
    elapsed = time.perf_counter() - start
    await sub.unsubscribe()
    return Sample(count, elapsed, count * size, capped and count < stored)


async def nats_latency(js: nats.js.JetStreamContext, plan: Plan) -> list[float]:
    from nats.aio.msg import Msg
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    name, subject = "latency", "latency.1"
    await js.add_stream(name=name, subjects=[subject], storage=StorageType.FILE)
    total = plan.latency_warmup + int(plan.latency_rate * plan.latency_s)
    latencies: list[float] = []

    async def on_message(msg: Msg) -> None:
        latencies.append(age_ms(msg.data, time.perf_counter_ns()))

    config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW)
    sub = await js.subscribe(subject, stream=name, cb=on_message, manual_ack=True, config=config)
    await asyncio.sleep(0.1)
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / plan.latency_rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await js.publish(subject, stamped(LATENCY_SIZE))
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while len(latencies) < total and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await sub.unsubscribe()
    return latencies[plan.latency_warmup :]


# -- report ------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    return NA if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def throughput_table(results: Results) -> str:
    lines = [
        "| system | workload | size | flush | msgs/s | MB/s | equeue / this | method |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    systems = [EQUEUE, REDIS, NATS]
    workloads = [
        "produce", "produce (stream)", "produce (raw)",
        "pull", "pull (stream)", "pull (raw)", "pull (XRANGE)",
    ]  # fmt: skip
    rows = sorted(
        results.rows.values(),
        key=lambda r: (
            workloads.index(r.workload.split(" (")[0]),
            r.size,
            r.flush,
            systems.index(r.system),
            workloads.index(r.workload),
        ),
    )
    for row in rows:
        ratio = results.ratio(row)
        notes = [row.method]
        if any(s.capped for s in row.samples):
            notes.append("time-capped")
        if len(row.samples) > 1:
            notes.append(f"median of {len(row.samples)}")
        cells = [
            row.system,
            row.workload,
            size_label(row.size),
            row.flush,
            _num(row.rate()),
            _num(row.mbps(), 1),
            NA if ratio is None else f"{ratio:.2f}x",
            "; ".join(notes),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latency_table(results: Results) -> str:
    lines = [
        "| system | flush | method | messages | p50 ms | p99 ms | max ms |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    systems = [EQUEUE, REDIS, NATS]
    for row in sorted(results.latency.values(), key=lambda r: (r.flush, systems.index(r.system))):
        cells = [
            row.system,
            row.flush,
            row.method,
            str(statistics.median(len(run) for run in row.runs)),
            _num(row.stat(0.5), 2),
            _num(row.stat(0.99), 2),
            _num(statistics.median(max(run, default=math.nan) for run in row.runs), 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hiredis_installed() -> bool:
    try:
        import redis.utils
    except ImportError:
        return False
    return bool(redis.utils.HIREDIS_AVAILABLE)


def targets(results: Results) -> list[str]:
    lines = []
    if not hiredis_installed():
        lines.append(
            "- WARNING: redis-py runs without hiredis (pip install hiredis), so its replies "
            "are parsed in Python and Redis measures slower than it is: the ratios below "
            "flatter equeue"
        )
    checks = [
        ("produce", "async", "produce", PRODUCE_TARGET, "Redis XADD (appendfsync everysec)"),
        ("produce", "sync", "produce", PRODUCE_TARGET, "Redis XADD (appendfsync always)"),
        (
            "produce (stream)",
            "async",
            "produce",
            PRODUCE_TARGET,
            "Redis XADD (appendfsync everysec)",
        ),
        ("produce (stream)", "sync", "produce", PRODUCE_TARGET, "Redis XADD (appendfsync always)"),
        ("pull", "async", "pull", PULL_TARGET, "Redis XREADGROUP+XACK"),
        ("pull (stream)", "async", "pull", PULL_TARGET, "Redis XREADGROUP+XACK"),
    ]
    for ours_workload, flush, theirs_workload, target, label in checks:
        ours = results.row(EQUEUE, ours_workload, 100, flush)
        theirs = results.row(REDIS, theirs_workload, 100, flush)
        name = f"equeue {ours_workload} >= {target:g}x {label}, 100 B, {flush}"
        if ours is None or theirs is None:
            lines.append(f"- {name}: not measured (Redis missing or skipped)")
            continue
        ratio = ours.rate() / theirs.rate()
        verdict = "MET" if ratio >= target else "NOT MET"
        extra = ""
        raw = results.row(EQUEUE, f"{ours_workload.split(' (')[0]} (raw)", 100, flush)
        if raw is not None:
            what = "records not decoded" if ours_workload.startswith("pull") else "raw Produce RPC"
            extra = f" ({what}: {raw.rate():,.0f} msgs/s = {raw.rate() / theirs.rate():.2f}x)"
        lines.append(
            f"- {name}: {verdict}: equeue {ours.rate():,.0f} msgs/s vs "
            f"{theirs.rate():,.0f} msgs/s = {ratio:.2f}x{extra}"
        )
    return lines


def versions() -> str:
    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    parser = "hiredis parser" if hiredis_installed() else "pure-Python RESP parser, no hiredis"
    redis_server = server_version("redis-server").split()
    redis_version = next((w[2:] for w in redis_server if w.startswith("v=")), "?")
    nats_version = server_version("nats-server").rpartition(" ")[2]
    return (
        f"Python {sys.version.split()[0]}, grpcio {dist('grpcio')}, "
        f"redis-py {dist('redis')} ({parser}), nats-py {dist('nats-py')}; "
        f"redis-server {redis_version}, nats-server {nats_version}; {os.cpu_count()} CPUs"
    )


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run (~20 s)")
    parser.add_argument("--repeat", type=int, default=1, help="report the median of N runs")
    parser.add_argument(
        "--systems",
        default="equeue,redis,nats",
        help="comma-separated subset of equeue,redis,nats (default: all)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    systems = {s.strip() for s in args.systems.split(",") if s.strip()}
    if unknown := systems - {"equeue", "redis", "nats"}:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    plan = QUICK if args.quick else FULL
    results = Results()
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="equeue-broker-bench-", dir="/tmp"))
    servers: list[Server] = []
    try:
        for run in range(args.repeat):
            progress(f"-- run {run + 1} of {args.repeat} ({root})")
            run_dir = root / f"run-{run}"
            if "equeue" in systems:
                run_equeue(run_dir, plan, results, servers)
            if "redis" in systems and not run_redis(run_dir, plan, results, servers):
                results.notes.append("Redis skipped: redis-server is not installed")
                systems.discard("redis")
            if "nats" in systems and not run_nats(run_dir, plan, results, servers):
                results.notes.append("NATS skipped: nats-server is not installed")
                systems.discard("nats")
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - began
    mode = "quick" if args.quick else "full"
    print(f"\n## Throughput ({mode}, repeat {args.repeat}, {elapsed:.0f} s)\n")
    print(throughput_table(results))
    print(f"\n## Produce-to-consume latency ({plan.latency_rate} msgs/s, 100 B)\n")
    print(latency_table(results))
    print("\n## Targets\n")
    print("\n".join(targets(results)))
    print("\n## Setup\n")
    print(f"- {versions()}")
    if NATS in {key[0] for key in results.rows}:
        results.notes.append(
            "NATS 2.9 has no fsync-per-write option (sync_interval is 2.10+): "
            "measured once, labelled async; it fsyncs less often than either equeue mode"
        )
    for note in results.notes:
        print(f"- {note}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
