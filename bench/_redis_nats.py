"""The broker benchmark's other systems: Redis Streams and NATS JetStream.

The same workloads as equeue's in ``bench/broker_bench.py`` (produce, pull,
latency), each system's server started by ``bench/_servers.py``; the clients
are imported where used, so that a missing one only skips its system. Nothing
here is imported by the broker or the client.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from bench._broker_measure import (
    BATCH,
    DRAIN_TIMEOUT_S,
    LATENCY_SIZE,
    LONG_POLL_MS,
    NATS,
    QUEUES,
    REDIS,
    RPC_TIMEOUT_S,
    SIZES,
    Parts,
    Plan,
    Results,
    Sample,
    Seen,
    age_ms,
    latencies,
    pace,
    stamp_of,
    stamped,
    timed_batches,
    values_for,
    wait_for,
)
from bench._servers import HOST, Server, start_nats, start_redis

BENCH_EXTRA = "pip install -e '.[bench]', or make bench-broker"

if TYPE_CHECKING:  # imported where used, so that a missing client only skips its system
    import nats.js
    import redis


# -- Redis Streams -----------------------------------------------------------------------------


def run_redis(root: Path, plan: Plan, results: Results, servers: list[Server]) -> str | None:
    """Redis's workloads into ``results``; None, or why Redis was skipped."""
    if importlib.util.find_spec("redis") is None:
        return f"Redis skipped: its Python client is not installed ({BENCH_EXTRA})"
    import redis

    for flush, appendfsync in (("async", "everysec"), ("sync", "always")):
        started = start_redis(root / f"redis-{appendfsync}", appendfsync)
        if started is None:
            return "Redis skipped: redis-server is not installed"
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
            run, parts = redis_latency(port, plan)
            method = f"XREAD BLOCK {LONG_POLL_MS} in a thread; XADD of 1"
            results.add_latency(REDIS, flush, method, run, parts)
        server.stop()
    return None


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


def redis_latency(port: int, plan: Plan) -> tuple[list[float], Parts]:
    import redis

    stream = "latency"
    total = plan.latency_warmup + int(plan.latency_rate * plan.latency_s)
    seen: list[Seen] = []
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
                now = time.perf_counter_ns()  # the client parsed the reply already
                seen.extend((stamp_of(fields[b"v"]), now, now) for _id, fields in entries)
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
            acked = pace(
                total, plan.latency_rate, lambda value: producer.xadd(stream, {b"v": value})
            )
            wait_for(lambda: len(seen) >= total or bool(errors), DRAIN_TIMEOUT_S)
        finally:
            stop.set()
            thread.join(timeout)
    if errors:
        raise errors[0]
    return latencies(seen, acked, plan.latency_warmup)


# -- NATS JetStream ----------------------------------------------------------------------------


def run_nats(root: Path, plan: Plan, results: Results, servers: list[Server]) -> str | None:
    """NATS's workloads into ``results``; None, or why NATS was skipped."""
    if importlib.util.find_spec("nats") is None:
        return f"NATS skipped: its Python client (nats-py) is not installed ({BENCH_EXTRA})"
    started = start_nats(root / "nats")
    if started is None:
        return "NATS skipped: nats-server is not installed"
    server, port = started
    servers.append(server)
    asyncio.run(nats_workloads(port, plan, results))
    server.stop()
    return None


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
