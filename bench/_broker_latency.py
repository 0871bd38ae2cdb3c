"""The broker benchmark's latency runs, and its interleaved latency scenario.

``equeue_latency`` and ``consumer_latency`` are the produce-to-consume runs of
``bench/broker_bench.py`` (a consumer parked in a long poll, single 100 B
messages at ``latency_rate``/s). ``run_latency_rounds`` is its ``--scenario
latency``: on one equeue broker (async flush) and one bare gRPC server, rounds
that alternate every variant - ``send_batch`` of 1 and a batch of 1 on an open
``ProduceStream`` with a blocking ``Pull`` parked, ``send_batch`` of 1 read by
``Consumer.poll``, and the bare floors (f), (e), (d) of ``bench/_grpc_bare.py``
- and reports per variant the median over rounds of each round's p50 and p99,
with every round's p50: a loaded machine drifts between runs, and interleaved
rounds see the same drift. Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import queue
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import grpc

from bench._broker_measure import (
    BATCH,
    DRAIN_TIMEOUT_S,
    LATENCY_SIZE,
    LONG_POLL_MS,
    RPC_TIMEOUT_S,
    Parts,
    Plan,
    Seen,
    latencies,
    pace,
    percentile,
    stamp_of,
    wait_for,
)
from bench._grpc_bare import (
    MAX_MESSAGE_BYTES,
    SERVICE,
    Count,
    Values,
    bare_parked,
    bare_round_trips,
    bare_stream_round_trips,
    start_bare,
)
from bench._servers import start_equeue
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Consumer, Producer
from equeue_spark.client.connection import Connection
from equeue_spark.client.records import decode_records


def equeue_latency(
    admin: Admin,
    producer: Producer,
    address: str,
    plan: Plan,
    topic: str = "latency",
    *,
    streamed: bool = False,
) -> tuple[list[float], Parts]:
    """Produce-to-consume latency, a blocking ``Pull(max_wait_ms)`` parked; each
    message a ``send_batch`` of its own, or (``streamed``) a batch of one on
    one open ``ProduceStream`` (``send_batches``), awaiting its ack each time."""
    admin.create_topic(topic, queues=1)
    total = plan.latency_warmup + int(plan.latency_rate * plan.latency_s)
    seen: list[Seen] = []
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
                reply = conn.pull(request, timeout=RPC_TIMEOUT_S + LONG_POLL_MS / 1000)
                received = time.perf_counter_ns()
                if reply.count:
                    messages = decode_records(reply.records, reply.broker_id)
                    decoded = time.perf_counter_ns()
                    # Not the stream's unstamped set-up message (stamp 0).
                    seen.extend(
                        (stamp, received, decoded) for m in messages if (stamp := stamp_of(m.value))
                    )
                offset = reply.next_offset
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with Connection(config) as conn:
        request = pb.PullRequest(topic=topic, queue_id=0, offset=0, max_messages=1)
        conn.pull(request, timeout=RPC_TIMEOUT_S)  # connect before timing
        thread = threading.Thread(
            target=consume, args=(conn,), name="latency-consumer", daemon=True
        )
        thread.start()
        time.sleep(0.1)  # let the first pull park
        try:
            with stream_sender(producer, topic) if streamed else nullcontext(None) as sender:
                send = sender or (lambda value: producer.send_batch(topic, [value]))
                acked = pace(total, plan.latency_rate, send)
            wait_for(lambda: len(seen) >= total or bool(errors), DRAIN_TIMEOUT_S)
        finally:
            stop.set()
            thread.join(RPC_TIMEOUT_S + LONG_POLL_MS / 1000)
    if errors:
        raise errors[0]
    return latencies(seen, acked, plan.latency_warmup)


@contextmanager
def stream_sender(producer: Producer, topic: str) -> Iterator[Callable[[bytes], object]]:
    """A send of one value as a batch of one on one open ``ProduceStream``,
    returning at its acknowledgement (the stream's set-up done before)."""
    batches: queue.SimpleQueue[list[bytes] | None] = queue.SimpleQueue()
    results = producer.send_batches(topic, iter(batches.get, None))

    def send(value: bytes) -> object:
        batches.put([value])
        return next(results)

    try:
        send(bytes(LATENCY_SIZE))  # the stream's set-up, not timed (and not stamped)
        yield send
    finally:
        batches.put(None)  # the stream ends after the last
        for _ in results:
            pass


def consumer_latency(
    admin: Admin, producer: Producer, address: str, plan: Plan, topic: str = "latency-consumer"
) -> tuple[list[float], Parts]:
    """The latency run through the product's read path: ``Consumer.poll``
    (futures of unary ``Pull(max_wait_ms)``, consumer_part.py) instead of a
    blocking ``Pull`` on the stub."""
    admin.create_topic(topic, queues=1)
    total = plan.latency_warmup + int(plan.latency_rate * plan.latency_s)
    seen: list[Seen] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)

    def consume(consumer: Consumer) -> None:
        try:
            while not stop.is_set():
                messages = consumer.poll(timeout_s=LONG_POLL_MS / 1000)
                received = time.perf_counter_ns()  # poll decodes: one stamp for both
                seen.extend((stamp_of(m.value), received, received) for m in messages)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with Consumer(config=config, start="earliest") as consumer:
        consumer.assign(topic, [0])
        consumer.poll(timeout_s=0.1)  # connected before timing
        thread = threading.Thread(
            target=consume, args=(consumer,), name="latency-consumer", daemon=True
        )
        thread.start()
        time.sleep(0.1)  # let the first pull park
        try:
            acked = pace(
                total, plan.latency_rate, lambda value: producer.send_batch(topic, [value])
            )
            wait_for(lambda: len(seen) >= total or bool(errors), DRAIN_TIMEOUT_S)
        finally:
            stop.set()
            thread.join(RPC_TIMEOUT_S + LONG_POLL_MS / 1000)
    if errors:
        raise errors[0]
    return latencies(seen, acked, plan.latency_warmup)


VARIANTS = (
    "equeue: send_batch of 1, blocking Pull parked",
    "equeue: batch of 1 on an open ProduceStream, blocking Pull parked",
    "equeue: send_batch of 1, Consumer.poll",
    "bare gRPC (f): unary Send waking a parked unary call",
    "bare gRPC (e): unary round trip of one value",
    "bare gRPC (d): round trip of one value on an open bidi stream",
)


def run_latency_rounds(plan: Plan, rounds: int) -> str:
    """``rounds`` interleaved rounds of every variant (module doc); the table."""
    root = Path(tempfile.mkdtemp(prefix="equeue-broker-bench-", dir="/tmp"))
    runs: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    try:
        broker, address = start_equeue(root / "equeue" / "data", "async")
        try:
            bare, port = start_bare(root / "bare-grpc")
            try:
                _rounds(plan, rounds, address, port, runs)
            finally:
                bare.stop()
        finally:
            broker.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [
        "| variant | rounds | p50 ms (median of rounds) | p99 ms (median of rounds) "
        "| each round's p50 |",
        "|---|---:|---:|---:|---|",
    ]
    for variant, per_round in runs.items():
        p50 = statistics.median(percentile(r, 0.5) for r in per_round)
        p99 = statistics.median(percentile(r, 0.99) for r in per_round)
        each = " ".join(f"{percentile(r, 0.5):.2f}" for r in per_round)
        lines.append(f"| {variant} | {len(per_round)} | {p50:.2f} | {p99:.2f} | {each} |")
    return "\n".join(lines)


def _rounds(
    plan: Plan, rounds: int, address: str, port: int, runs: dict[str, list[list[float]]]
) -> None:
    config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with Admin(config=config) as admin, Producer(config=config) as producer, \
            grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:  # fmt: skip
        send = channel.unary_unary(
            SERVICE + "Send", request_serializer=Values.SerializeToString,
            response_deserializer=Count.FromString,
        )  # fmt: skip
        park = channel.unary_unary(
            SERVICE + "Park", request_serializer=Count.SerializeToString,
            response_deserializer=Values.FromString,
        )  # fmt: skip
        echo = channel.stream_stream(
            SERVICE + "Echo", request_serializer=Values.SerializeToString,
            response_deserializer=Count.FromString,
        )  # fmt: skip
        send(Values(values=[b""]), timeout=RPC_TIMEOUT_S, wait_for_ready=True)  # connect
        steps: tuple[Callable[[int], list[float]], ...] = (
            lambda r: equeue_latency(admin, producer, address, plan, f"latency-{r}")[0],
            lambda r: equeue_latency(
                admin, producer, address, plan, f"latency-streamed-{r}", streamed=True
            )[0],
            lambda r: consumer_latency(admin, producer, address, plan, f"latency-poll-{r}")[0],
            lambda _r: bare_parked(send, park, plan),
            lambda _r: bare_round_trips(send, plan),
            lambda _r: bare_stream_round_trips(echo, plan),
        )
        for r in range(rounds):
            # The variants' order turns each round: none always runs first.
            for i in range(len(steps)):
                k = (i + r) % len(steps)
                runs[VARIANTS[k]].append(steps[k](r))
