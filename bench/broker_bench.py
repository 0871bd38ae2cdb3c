"""Broker benchmark: equeue beside Redis Streams and NATS JetStream, same run, one client.

Run ``python bench/broker_bench.py`` (about 3 minutes here; ``--quick`` for a
~25 s smoke run; ``--repeat N`` reports the median of N runs). Every server is
started by the script on 127.0.0.1 in a temporary directory under /tmp (removed
at the end) and stopped at the end; Redis and NATS are skipped, with a note, when
``redis-server`` / ``nats-server`` or their Python clients (the ``bench``
extra) are not installed. All clients live in this
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
  back parsed messages), and again only counting records (labelled raw);
  then the same with one ``PullStream`` per queue, 1,000 records a reply,
  decoded and counted ("pull (stream)", "pull (stream, raw)"); then over the
  broker's fetch port (``--fetch-port auto``: the plain framing of
  ``equeue_spark/client/fetch.py``), one request for a range of 1,000 answered
  by one reply, decoded and counted ("pull (fetch port, one request per
  1,000)"): unary ``Pull``'s shape without gRPC.
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
  consumer (ack policy none) on the same event loop as the publisher. Where
  the milliseconds go (equeue, Redis): the produce call (stamp to the send
  call's return), from that return to the consumer's reply, and the decode
  (``_broker_measure.PARTS``), beside a bare gRPC unary call of one value at
  the same pace. equeue twice more (async): each message a batch of one on
  one open ``ProduceStream`` (``send_batches``, its ack awaited: "equeue,
  produce on a stream"), and read through the product's read path,
  ``Consumer.poll`` ("equeue, Consumer.poll": futures of unary ``Pull``).
* bare gRPC (``--systems`` ``grpc``, ``bench/_grpc_bare.py``): what Python and
  gRPC allow at all, on a bare ``grpc.aio`` server in its own process: a unary
  call carrying 1,000 values of 100 B, and a server stream of such replies;
  equeue's unary produce and streaming pull as a ratio to them ("equeue
  against bare gRPC"); the exact shape of a unary ``Pull`` (a tiny request
  answered by one ``bytes`` field of 1,000 records, parsed, and decoded), and a
  round trip of one 100 B value at the latency pace on an open bidi stream
  beside a unary call: the floors gRPC in Python sets for the pull and
  latency targets.

Flush modes: equeue async = fsync every 100 ms, sync = append returns after
fsync (shared by concurrent appends). Redis async = ``appendfsync everysec``,
sync = ``appendfsync always`` (AOF on, RDB and AOF rewrites off). NATS 2.9 has
no per-write fsync setting (``sync_interval`` arrived in 2.10): its file store is
measured once, labelled async, and is the least durable of the three.

``--scenario latency`` runs instead only the latency variants (async): equeue's
(``send_batch`` of 1 and a batch of 1 on an open ``ProduceStream``, a blocking
``Pull`` parked; ``Consumer.poll``) and the bare gRPC floors (f), (e), (d), in
``--repeat`` interleaved rounds (``bench/_broker_latency.py``; about 35 s a
round): the figures to compare on a loaded machine.

``--scenario idempotence`` measures instead produce with idempotence on
(the default) beside off, on one equeue broker, same run
(``bench/_broker_idempotence.py``: 100 B and 1 KiB, unary and streaming,
keyless and keyed, the ratio on / off; about 80 s a round). The produce rows
above use the default, so they are idempotent since idempotent produce.

Rates count messages; MB/s counts value bytes (10^6 B). "equeue / this" is the
equeue rate for the same workload, size and flush mode divided by the row's
rate, both medians of this run's repeats.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._broker_idempotence import run_idempotence
from bench._broker_latency import consumer_latency, equeue_latency, run_latency_rounds
from bench._broker_measure import (
    BATCH,
    EQUEUE,
    FULL,
    LONG_POLL_MS,
    NATS,
    PARTS,
    PULL_MAX_BYTES,
    QUEUES,
    QUICK,
    REDIS,
    RPC_TIMEOUT_S,
    SIZES,
    LatencyRow,
    Plan,
    Results,
    Sample,
    timed_batches,
    values_for,
)
from bench._grpc_bare import BARE, BARE_PARKED, BARE_STREAM, bare_table, bare_targets, run_bare
from bench._measure import progress, size_label
from bench._redis_nats import run_nats, run_redis
from bench._servers import NOT_INSTALLED, Server, server_version, start_equeue
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.batches import build_request
from equeue_spark.client.connection import Connection
from equeue_spark.client.fetch import Pool, fetch_replies
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.records import decode_records

PRODUCE_TARGET = 5.0
SYNC_PRODUCE_TARGET = 6.0
PULL_TARGET = 10.0
LATENCY_P50_MS = 1.0
LATENCY_P99_MS = 3.0
SYSTEMS = ("equeue", "redis", "nats", "grpc")
EQUEUE_STREAMED = "equeue, produce on a stream"
"""The latency rows' system of the run whose produce goes on one open stream."""
EQUEUE_CONSUMER = "equeue, Consumer.poll"
"""The latency rows' system of the run through ``Consumer.poll``."""
FETCH_PULL = "pull (fetch port, one request per 1,000)"
FETCH_PULL_RAW = "pull (fetch port, one request per 1,000, raw)"
NA = "-"


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
                    fetch_at = conn.call(conn.admin.GetStats, pb.GetStatsRequest()).fetch_address
                    for decode in (True, False) if fetch_at else ():  # no fetch port: no rows
                        sample = equeue_pull_fetch(fetch_at, topic, size, stored, plan,
                                                   decode=decode)  # fmt: skip
                        workload = FETCH_PULL if decode else FETCH_PULL_RAW
                        method = "fetch port, one range of 1,000 per request, " + (
                            "+ decode_records" if decode else "records counted, NOT decoded"
                        )
                        results.add((EQUEUE, workload, size, flush), method, sample)
                    for decode in (True, False):
                        sample = equeue_pull_stream(conn, topic, size, stored, plan, decode=decode)
                        workload = "pull (stream)" if decode else "pull (stream, raw)"
                        method = "PullStream (server streaming), 1,000/reply, " + (
                            "+ decode_records" if decode else "records counted, NOT decoded"
                        )
                        results.add((EQUEUE, workload, size, flush), method, sample)
            run, parts = equeue_latency(admin, producer, address, plan)
            method = f"Pull(max_wait_ms={LONG_POLL_MS}) in a thread; send_batch of 1"
            results.add_latency(EQUEUE, flush, method, run, parts)
            if flush == "async":
                run, parts = equeue_latency(
                    admin, producer, address, plan, "latency-streamed", streamed=True
                )
                method = (
                    f"Pull(max_wait_ms={LONG_POLL_MS}) in a thread; 1 a batch, one ProduceStream"
                )
                results.add_latency(EQUEUE_STREAMED, flush, method, run, parts)
                run, parts = consumer_latency(admin, producer, address, plan)
                method = (
                    "Consumer.poll(timeout_s=1) in a thread (assigned, no group); send_batch of 1"
                )
                results.add_latency(EQUEUE_CONSUMER, flush, method, run, parts)
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


def equeue_pull_fetch(
    address: str, topic: str, size: int, stored: int, plan: Plan, *, decode: bool
) -> Sample:
    """Every queue read over the fetch port's plain framing, one request (a range
    of 1,000) answered by one reply: unary ``Pull``'s shape without gRPC."""
    count = 0
    capped = False
    pool = Pool()
    start = time.perf_counter()
    deadline = start + plan.pull_s
    try:
        for queue_id in range(QUEUES):
            offset = 0
            while not capped:
                got = 0
                for reply in fetch_replies(address, topic, queue_id, offset, offset + BATCH,
                                           batch_messages=BATCH, batch_bytes=PULL_MAX_BYTES,
                                           timeout_s=RPC_TIMEOUT_S, pool=pool):  # fmt: skip
                    records = reply.records
                    got += len(decode_records(records, reply.broker_id)) if decode else reply.count
                    offset = reply.next_offset
                if got == 0:
                    break
                count += got
                capped = time.perf_counter() >= deadline
    finally:
        pool.close()
    elapsed = time.perf_counter() - start
    if not capped and count != stored:
        raise RuntimeError(f"equeue fetch-port pull read {count:,} messages of {stored:,} stored")
    return Sample(count, elapsed, count * size, capped)


def equeue_pull_stream(
    conn: Connection, topic: str, size: int, stored: int, plan: Plan, *, decode: bool
) -> Sample:
    """Every queue read with one server-streaming call each (decoded, or counted)."""
    count = 0
    capped = False
    start = time.perf_counter()
    deadline = start + plan.pull_s
    for queue_id in range(QUEUES):
        for reply in stream_replies(conn, topic, queue_id, 0, batch_messages=BATCH,
                                    batch_bytes=PULL_MAX_BYTES):  # fmt: skip
            count += len(decode_records(reply.records, reply.broker_id)) if decode else reply.count
            if time.perf_counter() >= deadline:
                capped = True
                break
        if capped:
            break
    elapsed = time.perf_counter() - start
    if not capped and count != stored:
        raise RuntimeError(f"equeue stream read {count:,} messages of {stored:,} stored")
    return Sample(count, elapsed, count * size, capped)


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
        "pull", "pull (stream)", "pull (raw)", "pull (stream, raw)", FETCH_PULL, FETCH_PULL_RAW,
        "pull (XRANGE)",
    ]  # fmt: skip
    rows = sorted(
        (r for r in results.rows.values() if r.system in systems),
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
    systems = [
        EQUEUE, EQUEUE_STREAMED, EQUEUE_CONSUMER, REDIS, NATS, BARE_PARKED, BARE, BARE_STREAM,
    ]  # fmt: skip
    for row in _latency_rows(results, systems):
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


def _latency_rows(results: Results, systems: list[str]) -> list[LatencyRow]:
    rows = [r for r in results.latency.values() if r.system in systems]
    return sorted(rows, key=lambda r: (r.flush, systems.index(r.system)))


def breakdown_table(results: Results) -> str:
    """Where each system's latency goes (``PARTS``), p50 / p99 of each part."""
    names = " | ".join(f"{p} p50 / p99" for p in PARTS)
    lines = [f"| system | flush | {names} | total p50 / p99 |", "|---|---|" + "---:|" * 4]
    systems = [EQUEUE, EQUEUE_STREAMED, EQUEUE_CONSUMER, REDIS, BARE, BARE_STREAM]
    for row in _latency_rows(results, systems):
        if not row.parts:
            continue
        bare = row.system in (BARE, BARE_STREAM)
        cells = [f"{BARE}: {row.method}" if bare else row.system, row.flush]
        for name in PARTS:
            p50, p99 = row.part(name, 0.5), row.part(name, 0.99)
            cells.append(NA if math.isnan(p50) else f"{p50:.2f} / {p99:.2f}")
        cells.append(f"{row.stat(0.5):.2f} / {row.stat(0.99):.2f}")
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
    if REDIS in {key[0] for key in results.rows} and not hiredis_installed():
        lines.append(
            "- WARNING: redis-py runs without hiredis (pip install hiredis), so its replies "
            "are parsed in Python and Redis measures slower than it is: the ratios below "
            "flatter equeue"
        )
    checks = [
        ("produce", "async", "produce", PRODUCE_TARGET, "Redis XADD (appendfsync everysec)"),
        ("produce", "sync", "produce", SYNC_PRODUCE_TARGET, "Redis XADD (appendfsync always)"),
        (
            "produce (stream)",
            "async",
            "produce",
            PRODUCE_TARGET,
            "Redis XADD (appendfsync everysec)",
        ),
        (
            "produce (stream)",
            "sync",
            "produce",
            SYNC_PRODUCE_TARGET,
            "Redis XADD (appendfsync always)",
        ),
        ("pull", "async", "pull", PULL_TARGET, "Redis XREADGROUP+XACK"),
        ("pull (stream)", "async", "pull", PULL_TARGET, "Redis XREADGROUP+XACK"),
        (FETCH_PULL, "async", "pull", PULL_TARGET, "Redis XREADGROUP+XACK"),
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
        raw_workload = {"pull (stream)": "pull (stream, raw)", FETCH_PULL: FETCH_PULL_RAW}.get(
            ours_workload, f"{ours_workload.split(' (')[0]} (raw)"
        )
        raw = results.row(EQUEUE, raw_workload, 100, flush)
        if raw is not None:
            what = "records not decoded" if ours_workload.startswith("pull") else "raw Produce RPC"
            extra = f" ({what}: {raw.rate():,.0f} msgs/s = {raw.rate() / theirs.rate():.2f}x)"
        lines.append(
            f"- {name}: {verdict}: equeue {ours.rate():,.0f} msgs/s vs "
            f"{theirs.rate():,.0f} msgs/s = {ratio:.2f}x{extra}"
        )
    return lines


def latency_targets(results: Results) -> list[str]:
    """equeue's produce-to-consume latency (async) against the issue's bounds."""
    row = results.latency.get((EQUEUE, "async"))
    name = f"equeue latency p50 <= {LATENCY_P50_MS:g} ms and p99 <= {LATENCY_P99_MS:g} ms, async"
    if row is None:
        return [f"- {name}: not measured"]
    p50, p99 = row.stat(0.5), row.stat(0.99)
    verdict = "MET" if p50 <= LATENCY_P50_MS and p99 <= LATENCY_P99_MS else "NOT MET"
    floor = results.latency.get((BARE_PARKED, "async"))
    extra = ""
    if floor is not None:  # the same shape in gRPC alone (bench/_grpc_bare.py (f))
        extra = (
            f" (bare gRPC, a send waking a parked call: p50 {floor.stat(0.5):.2f} ms, "
            f"p99 {floor.stat(0.99):.2f} ms)"
        )
    return [f"- {name}: {verdict}: p50 {p50:.2f} ms, p99 {p99:.2f} ms{extra}"]


def versions() -> str:
    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    parser = "hiredis parser" if hiredis_installed() else "pure-Python RESP parser, no hiredis"
    redis_server = server_version("redis-server")
    redis_version = next((w[2:] for w in redis_server.split() if w.startswith("v=")), "?")
    nats_server = server_version("nats-server")
    nats_version = nats_server.rpartition(" ")[2]
    if redis_server == NOT_INSTALLED:
        redis_version = NOT_INSTALLED
    if nats_server == NOT_INSTALLED:
        nats_version = NOT_INSTALLED
    return (
        f"Python {sys.version.split()[0]}, grpcio {dist('grpcio')}, "
        f"redis-py {dist('redis')} ({parser}), nats-py {dist('nats-py')}; "
        f"redis-server {redis_version}, nats-server {nats_version}; {os.cpu_count()} CPUs"
    )


# -- main --------------------------------------------------------------------------------------


def idempotence(plan: Plan, repeat: int, flush: str) -> None:
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="equeue-broker-bench-", dir="/tmp"))
    try:
        report = run_idempotence(root, plan, repeat, flush)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mode = "quick" if plan is QUICK else "full"
    print(f"\n## Produce, idempotence on / off ({mode}, {time.perf_counter() - began:.0f} s)\n")
    print(report)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run (~25 s)")
    parser.add_argument("--repeat", type=int, default=1, help="report the median of N runs")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)} (grpc: the bare gRPC "
        "baselines; default: all)",
    )
    parser.add_argument(
        "--scenario",
        choices=["compare", "idempotence", "latency"],
        default="compare",
        help="compare: equeue beside Redis and NATS (default); idempotence: equeue's "
        "produce with idempotence on beside off; latency: produce-to-consume latency "
        "variants and their bare gRPC floors in interleaved rounds (--repeat rounds)",
    )
    parser.add_argument("--flush", choices=["async", "sync"], default="async",
                        help="the idempotence scenario's flush mode")  # fmt: skip
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.scenario == "idempotence":
        idempotence(QUICK if args.quick else FULL, args.repeat, args.flush)
        return
    if args.scenario == "latency":
        began = time.perf_counter()
        report = run_latency_rounds(QUICK if args.quick else FULL, args.repeat)
        mode = "quick" if args.quick else "full"
        print(f"\n## Produce-to-consume latency, interleaved rounds ({mode}, "
              f"{time.perf_counter() - began:.0f} s; 100 B at "
              f"{(QUICK if args.quick else FULL).latency_rate} msgs/s, async)\n")  # fmt: skip
        print(report)
        sys.stdout.flush()
        return
    systems = {s.strip() for s in args.systems.split(",") if s.strip()}
    if unknown := systems - set(SYSTEMS):
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
            if "grpc" in systems:
                run_bare(run_dir, plan, results, servers)
            # A peer whose server or client is missing is skipped with a note: the
            # tables still come out with equeue's rows (the test suite's --quick run).
            if "redis" in systems and (skipped := run_redis(run_dir, plan, results, servers)):
                results.notes.append(skipped)
                systems.discard("redis")
            if "nats" in systems and (skipped := run_nats(run_dir, plan, results, servers)):
                results.notes.append(skipped)
                systems.discard("nats")
            shutil.rmtree(run_dir, ignore_errors=True)  # its servers stopped: gigabytes freed
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
    print("\n### Where the milliseconds go (ms, as the client sees them)\n")
    print(breakdown_table(results))
    if any(key[0] == BARE for key in results.rows):
        print("\n## equeue against bare gRPC (100 B)\n")
        print(bare_table(results))
    print("\n## Targets\n")
    print("\n".join([*targets(results), *latency_targets(results), *bare_targets(results)]))
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
