"""Bare gRPC baselines of the broker benchmark: what Python and gRPC allow at all here.

Two calls of the same shapes as equeue's, with no broker work behind them, on
a bare ``grpc.aio`` server in its own process (as the broker is: the same
grpcio, the same asyncio server, the same message limits), called from the
benchmark's one client process over a plain synchronous channel (as equeue's
client does):

* (a) ``Send``, unary: a request carrying 1,000 values of 100 B (``repeated
  bytes``), answered with a small reply (the count). Against equeue's unary
  produce: built from the list of values on every call (as ``send_batch``
  builds its request), and built once (against "produce (raw)").
* (b) ``Stream``, server streaming: replies of 1,000 values of 100 B each (one
  reply prebuilt by the server, sent again and again). Against equeue's
  streaming pull: each reply's values counted, and taken as ``bytes`` objects
  (as decoding gives a consumer an object per message).
* (c) ``Pull``, unary, the exact shape of equeue's unary ``Pull``: a tiny
  request answered by one ``bytes`` field holding 1,000 records of 100 B in
  equeue's record format (a ``PullReply`` serialized once by the server and
  sent as bytes, so the server does nothing per call but gRPC's own work),
  read with the client's ``parse_pull_reply``; then the same plus the
  client's ``decode_records`` of the records. Against unary ``Pull`` (raw and
  decoded): the floor gRPC in Python sets for the 10x-Redis target.
* (d) ``Echo``, bidirectional streaming: one 100 B value sent and its small
  reply awaited, at the latency runs' pace, on one open stream; beside (e) the
  same round trip as a unary ``Send`` call; and (f) the exact shape of the
  latency run: a paced unary ``Send`` of one value waking a unary ``Park`` call
  a thread keeps parked (as a consumer in ``Pull(max_wait_ms)``), stamp to the
  parked call's return. Against equeue's produce-to-consume latency: what it
  costs in gRPC alone.

The message types are built at run time from a descriptor (nothing generated,
nothing to compile). Run ``python bench/_grpc_bare.py PORT`` to serve on
127.0.0.1:PORT (what ``start_bare`` does). Nothing here is imported by the
broker or the client.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the server process
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bench._broker_measure import (
    BATCH,
    DRAIN_TIMEOUT_S,
    EQUEUE,
    LONG_POLL_MS,
    RPC_TIMEOUT_S,
    Plan,
    Results,
    Sample,
    pace,
    stamp_of,
    timed_batches,
    values_for,
    wait_for,
)
from bench._servers import HOST, ServerProcess, free_port, tcp_accepts, wait_until
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.records import decode_records
from equeue_spark.client.wire import parse_pull_reply

BARE = "bare gRPC"
BARE_STREAM = "bare gRPC, bidi stream"
BARE_PARKED = "bare gRPC, parked call"
"""The latency rows' system of (f): a send waking a parked unary call."""
"""The latency rows' system of (d): a round trip on one open stream."""
SIZE = 100
SERVICE = "/equeue.bench.bare.Bare/"
BACKLOG_MAX = 10_000
"""(f): values kept for the next Park call at most."""
MAX_MESSAGE_BYTES = 80 * 1024 * 1024
"""The client's and the broker's default message limit (connection.py)."""

SEND_BUILT = "(a) unary, request built per call"
SEND_PREBUILT = "(a) unary, request built once"
STREAM_COUNTED = "(b) stream, values counted"
STREAM_TAKEN = "(b) stream, values taken"
PULL_SHAPE = "(c) unary Pull shape, parsed"
PULL_SHAPE_DECODED = "(c) unary Pull shape + decode"
ROUND_TRIP_UNARY = "(e) unary round trip of one value"
ROUND_TRIP_STREAM = "(d) round trip of one value on a bidi stream"


def message_types() -> tuple[Any, Any]:
    """(Values, Count): ``message Values { repeated bytes values = 1; }`` and
    ``message Count { uint32 count = 1; }``, built from a descriptor."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="equeue_bench_bare.proto", package="equeue.bench.bare", syntax="proto3"
    )
    values = proto.message_type.add(name="Values")
    values.field.add(
        name="values", number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )  # fmt: skip
    count = proto.message_type.add(name="Count")
    count.field.add(
        name="count", number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("equeue.bench.bare.Values")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("equeue.bench.bare.Count")),
    )


Values, Count = message_types()


# -- the server (its own process) --------------------------------------------------------------


def pull_reply_bytes() -> bytes:
    """A serialized ``PullReply`` of 1,000 records of 100 B, in the log's format
    (encoded by the broker's own encoder, as an append writes them)."""
    from equeue_broker.storage.config import MessageLimits  # the server process only
    from equeue_broker.storage.index.queue_index import ENTRY_SIZE
    from equeue_broker.storage.log.record import MessageBatch, encode_records, prepare_batch

    values = values_for(SIZE)
    prepared = prepare_batch(MessageBatch(values), b"bare", MessageLimits())
    out = bytearray(prepared.total_bytes)
    index = bytearray(ENTRY_SIZE * len(values))
    size = encode_records(
        out, position=0, topic=b"bare", queue_id=0, first_offset=0, store_ms=0,
        prepared=prepared, start=0, stop=len(values), index_out=index,
    )  # fmt: skip
    reply = pb.PullReply(
        status=pb.PULL_STATUS_OK, records=bytes(out[:size]), count=len(values),
        next_offset=len(values), end_offset=len(values), broker_id="bare",
    )  # fmt: skip
    return reply.SerializeToString()


async def serve(port: int) -> None:
    reply = Values(values=values_for(SIZE))
    pull_reply = pull_reply_bytes()

    parked: list[asyncio.Future[Any]] = []
    backlog: list[bytes] = []
    """(f): values sent while the Park caller was between calls, for its next
    Park, as a log keeps them for the next pull (only while it parks: the
    throughput calls keep nothing)."""
    last_park = [-1e9]

    async def send(request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        while parked:  # (f): the values wake a parked Park call, as an append wakes a pull
            waiter = parked.pop()
            if not waiter.done():
                waiter.set_result(request)
                break
        else:
            now = asyncio.get_running_loop().time()
            if now - last_park[0] < 2 * LONG_POLL_MS / 1000 and len(backlog) < BACKLOG_MAX:
                backlog.extend(request.values)
        return Count(count=len(request.values))

    async def park(request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        last_park[0] = asyncio.get_running_loop().time()
        if backlog:
            values = Values(values=backlog)
            backlog.clear()
            return values
        waiter = asyncio.get_running_loop().create_future()
        parked.append(waiter)
        try:
            async with asyncio.timeout(request.count / 1000):
                return await waiter
        except TimeoutError:
            return Values()

    async def stream(
        request: Any, _context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        for _ in range(request.count):
            yield reply

    async def pull(_request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return pull_reply

    async def echo(
        requests: AsyncIterator[Any], _context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        async for request in requests:
            yield Count(count=len(request.values))

    handlers = {
        "Send": grpc.unary_unary_rpc_method_handler(
            send, request_deserializer=Values.FromString,
            response_serializer=Count.SerializeToString,
        ),
        "Pull": grpc.unary_unary_rpc_method_handler(
            pull, request_deserializer=Count.FromString, response_serializer=None,
        ),
        "Park": grpc.unary_unary_rpc_method_handler(
            park, request_deserializer=Count.FromString,
            response_serializer=Values.SerializeToString,
        ),
        "Echo": grpc.stream_stream_rpc_method_handler(
            echo, request_deserializer=Values.FromString,
            response_serializer=Count.SerializeToString,
        ),
        "Stream": grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=Count.FromString,
            response_serializer=Values.SerializeToString,
        ),
    }  # fmt: skip
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("equeue.bench.bare.Bare", handlers),)
    )
    server.add_insecure_port(f"{HOST}:{port}")
    await server.start()
    await server.wait_for_termination()


def start_bare(work_dir: Path) -> tuple[ServerProcess, int]:
    """The bare server in a process of its own on a free port; (process, port)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, str(Path(__file__).resolve()), str(port)]
    server = ServerProcess("bare-grpc", command, work_dir / "bare-grpc.log")

    def ready() -> bool:
        if not server.alive():
            raise RuntimeError(f"the bare gRPC server exited:\n{server.log_tail()}")
        return tcp_accepts(port)

    try:
        wait_until(ready, server.name)
    except BaseException:
        server.stop()
        raise
    return server, port


# -- the client (the benchmark's process) ------------------------------------------------------


def run_bare(root: Path, plan: Plan, results: Results, servers: list[Any]) -> None:
    """The bare calls' rows (system ``BARE``, 100 B, labelled async) into ``results``."""
    server, port = start_bare(root / "bare-grpc")
    servers.append(server)
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    with grpc.insecure_channel(f"{HOST}:{port}", options=options) as channel:
        send = channel.unary_unary(
            SERVICE + "Send", request_serializer=Values.SerializeToString,
            response_deserializer=Count.FromString,
        )  # fmt: skip
        stream = channel.unary_stream(
            SERVICE + "Stream", request_serializer=Count.SerializeToString,
            response_deserializer=Values.FromString,
        )  # fmt: skip
        values = values_for(SIZE)
        prebuilt = Values(values=values)
        send(prebuilt, timeout=RPC_TIMEOUT_S, wait_for_ready=True)  # warm-up: connect
        batch_bytes = SIZE * BATCH
        sample = timed_batches(
            plan, batch_bytes, lambda _n: send(Values(values=values), timeout=RPC_TIMEOUT_S)
        )
        results.add((BARE, SEND_BUILT, SIZE, "async"), "Values(values=list) per call", sample)
        sample = timed_batches(plan, batch_bytes, lambda _n: send(prebuilt, timeout=RPC_TIMEOUT_S))
        results.add((BARE, SEND_PREBUILT, SIZE, "async"), "one Values sent again", sample)
        run = bare_round_trips(send, plan)
        method = "unary call of one 100-B value, paced as the latency runs"
        results.add_latency(BARE, "async", method, run, {"produce call": run})
        park = channel.unary_unary(
            SERVICE + "Park", request_serializer=Count.SerializeToString,
            response_deserializer=Values.FromString,
        )  # fmt: skip
        run = bare_parked(send, park, plan)
        method = "a Send of one 100-B value waking a parked unary Park call, same pace"
        results.add_latency(BARE_PARKED, "async", method, run)
        echo = channel.stream_stream(
            SERVICE + "Echo", request_serializer=Values.SerializeToString,
            response_deserializer=Count.FromString,
        )  # fmt: skip
        run = bare_stream_round_trips(echo, plan)
        method = "one 100-B value and its reply on one open bidi stream, same pace"
        results.add_latency(BARE_STREAM, "async", method, run, {"produce call": run})
        replies = max(1, plan.produce_max_bytes // batch_bytes)
        for taken in (False, True):
            sample = bare_stream(stream, replies, plan.pull_s, taken=taken)
            what = "list(reply.values) per reply" if taken else "len(reply.values) per reply"
            results.add((BARE, STREAM_TAKEN if taken else STREAM_COUNTED, SIZE, "async"),
                        what, sample)  # fmt: skip
        pull = channel.unary_unary(
            SERVICE + "Pull", request_serializer=Count.SerializeToString,
            response_deserializer=parse_pull_reply,
        )  # fmt: skip
        for decode in (False, True):
            sample = bare_pulls(pull, replies, plan.pull_s, decode=decode)
            what = "PullReply bytes, parse_pull_reply" + (" + decode_records" if decode else "")
            results.add((BARE, PULL_SHAPE_DECODED if decode else PULL_SHAPE, SIZE, "async"),
                        what, sample)  # fmt: skip
    server.stop()


def bare_round_trips(send: Any, plan: Plan) -> list[float]:
    """Round trips (ms) of a one-value ``Send``, at the latency runs' pace:
    what a produce call of one message costs in gRPC alone."""
    trips: list[float] = []

    def one(value: bytes) -> None:
        start = time.perf_counter_ns()
        send(Values(values=[value]), timeout=RPC_TIMEOUT_S)
        trips.append((time.perf_counter_ns() - start) / 1e6)

    pace(plan.latency_warmup + int(plan.latency_rate * plan.latency_s), plan.latency_rate, one)
    return trips[plan.latency_warmup :]


def bare_parked(send: Any, park: Any, plan: Plan) -> list[float]:
    """(f) produce-to-consume in gRPC alone (ms): a thread parked in a unary ``Park``
    call (as a consumer in ``Pull(max_wait_ms)``) gets each value a paced unary
    ``Send`` hands the server, stamp to the parked call's return."""
    seen: list[float] = []
    stop = threading.Event()
    failed: list[BaseException] = []

    def consume() -> None:
        try:
            while not stop.is_set():
                reply = park(Count(count=LONG_POLL_MS), timeout=RPC_TIMEOUT_S)
                now = time.perf_counter_ns()
                seen.extend((now - stamp_of(v)) / 1e6 for v in reply.values)
        except BaseException as exc:  # reported below
            failed.append(exc)

    total = plan.latency_warmup + int(plan.latency_rate * plan.latency_s)
    park(Count(count=1), timeout=RPC_TIMEOUT_S)  # the call path warmed up
    thread = threading.Thread(target=consume, name="bare-parked", daemon=True)
    thread.start()
    time.sleep(0.1)  # let the first Park reach the server
    try:
        pace(total, plan.latency_rate, lambda v: send(Values(values=[v]), timeout=RPC_TIMEOUT_S))
        wait_for(lambda: len(seen) >= total or bool(failed), DRAIN_TIMEOUT_S)
    finally:
        stop.set()
        thread.join(RPC_TIMEOUT_S)
    if failed:
        raise failed[0]
    return seen[plan.latency_warmup :]


def bare_stream_round_trips(echo: Any, plan: Plan) -> list[float]:
    """Round trips (ms) of one value and its reply on one open ``Echo`` stream, at
    the latency runs' pace: what a round trip costs without a call's set-up."""
    requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
    replies = echo(iter(requests.get, None), timeout=RPC_TIMEOUT_S)
    trips: list[float] = []

    def one(value: bytes) -> None:
        start = time.perf_counter_ns()
        requests.put(Values(values=[value]))
        next(replies)
        trips.append((time.perf_counter_ns() - start) / 1e6)

    try:
        one(bytes(SIZE))  # the stream's set-up, not timed
        trips.clear()
        pace(plan.latency_warmup + int(plan.latency_rate * plan.latency_s),
             plan.latency_rate, one)  # fmt: skip
    finally:
        requests.put(None)  # half-close: the server's loop ends, then the call
        for _ in replies:
            pass
    return trips[plan.latency_warmup :]


def bare_pulls(pull: Any, calls: int, cap_s: float, *, decode: bool) -> Sample:
    """Up to ``calls`` (c) ``Pull`` calls for ``cap_s`` seconds, records counted
    from the parsed reply or decoded as a consumer gets them."""
    count = 0
    done = 0
    start = time.perf_counter()
    deadline = start + cap_s
    request = Count(count=1)
    while done < calls and time.perf_counter() < deadline:
        reply = pull(request, timeout=RPC_TIMEOUT_S)
        count += len(decode_records(reply.records, reply.broker_id)) if decode else reply.count
        done += 1
    elapsed = time.perf_counter() - start
    return Sample(count, elapsed, count * SIZE, done < calls)


def bare_stream(stream: Any, replies: int, cap_s: float, *, taken: bool) -> Sample:
    """``replies`` replies of one ``Stream`` call (cancelled after ``cap_s``)."""
    count = 0
    capped = False
    start = time.perf_counter()
    deadline = start + cap_s
    call = stream(Count(count=replies), timeout=RPC_TIMEOUT_S)
    for reply in call:
        count += len(list(reply.values)) if taken else len(reply.values)
        if time.perf_counter() >= deadline:
            capped = True
            call.cancel()
            break
    elapsed = time.perf_counter() - start
    return Sample(count, elapsed, count * SIZE, capped)


# -- the report --------------------------------------------------------------------------------

PAIRS = (
    ("produce", "Producer.send_batch", SEND_BUILT, 0.6),
    ("produce (raw)", "Produce RPC, request built once", SEND_PREBUILT, None),
    ("pull (stream)", "PullStream + decode_records", STREAM_COUNTED, 0.5),
    ("pull (stream)", "PullStream + decode_records", STREAM_TAKEN, None),
    ("pull (stream, raw)", "PullStream, records counted", STREAM_COUNTED, None),
    ("pull", "Pull + decode_records", PULL_SHAPE_DECODED, None),
    ("pull (raw)", "Pull, records counted", PULL_SHAPE, None),
)
"""(equeue workload, what it does, bare row, target ratio or None)."""


def bare_ratio(results: Results, workload: str, bare: str) -> tuple[float, float] | None:
    """(equeue's rate, the bare row's rate), 100 B, async; None if either is missing."""
    ours = results.row(EQUEUE, workload, SIZE, "async")
    theirs = results.row(BARE, bare, SIZE, "async")
    if ours is None or theirs is None or theirs.rate() == 0:
        return None
    return ours.rate(), theirs.rate()


def bare_table(results: Results) -> str:
    lines = [
        "| equeue (100 B, async) | msgs/s | bare gRPC call (100 B) | msgs/s | equeue / bare "
        "| target |",
        "|---|---:|---|---:|---:|---|",
    ]
    for workload, what, bare, target in PAIRS:
        rates = bare_ratio(results, workload, bare)
        if rates is None:
            continue
        ours, theirs = rates
        goal = "-" if target is None else f">= {target:g}x"
        lines.append(
            f"| {workload}: {what} | {ours:,.0f} | {bare} | {theirs:,.0f} "
            f"| {ours / theirs:.2f}x | {goal} |"
        )
    return "\n".join(lines)


def bare_targets(results: Results) -> list[str]:
    lines = []
    for workload, _what, bare, target in PAIRS:
        if target is None:
            continue
        name = f"equeue {workload} >= {target:g}x bare gRPC {bare}, 100 B"
        rates = bare_ratio(results, workload, bare)
        if rates is None:
            lines.append(f"- {name}: not measured (equeue or the bare calls skipped)")
            continue
        ours, theirs = rates
        verdict = "MET" if ours / theirs >= target else "NOT MET"
        lines.append(
            f"- {name}: {verdict}: {ours:,.0f} vs {theirs:,.0f} msgs/s = {ours / theirs:.2f}x"
        )
    return lines


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
