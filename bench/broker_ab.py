"""Broker A/B: the same client workloads against this checkout's broker and a
baseline's, in interleaved rounds of one run (issue 31's hot paths).

Run ``python bench/broker_ab.py --baseline-python /other/checkout/.venv/bin/python``
(about 2 minutes; ``--quick`` for a ~30 s smoke run; ``--rounds N``).
``--baseline-path DIR`` instead runs the baseline with this interpreter and
``DIR/broker:DIR`` first on ``PYTHONPATH`` (a checkout without a virtualenv, its
C extensions built in place). Without either, both sides run this checkout (an
A/A run: how much the rounds swing).

Each round starts a fresh broker per side and flush mode (``--flush async`` and
``sync``) on 127.0.0.1, the sides alternating which goes first, and measures
from this one client process:

* produce (raw): one prebuilt ``ProduceRequest`` of 1,000 x 100 B on the
  stub, again and again (keyless: whole batches round-robin over 4 queues), in
  both flush modes;
* pull (raw): unary ``Pull`` of 1,000 from one queue of 200,000 stored, the
  records counted, not decoded;
* pull (stream): ``PullStream`` over the same queue, 1,000 per reply, decoded;
* pull (empty): unary ``Pull`` of an empty queue, ``max_wait_ms=0``: one
  call's cost with (almost) no storage work;
* latency: a consumer thread parked in ``Pull(max_wait_ms=1000)`` while
  ``Producer.send_batch`` sends one 100 B message every 5 ms; the consumer's
  clock after decoding minus the producer's before the send.

Besides the rate, each row has the broker's CPU (user + system seconds of its
process, from /proc) per million messages, or per million calls for pull
(empty): less noisy than rates on a shared machine. Rates and CPU are medians
over rounds, latency percentiles pooled over rounds; "B / A" divides this
checkout's by the baseline's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.batches import build_request
from equeue_spark.client.connection import Connection
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.records import decode_records

BATCH = 1_000
STORED_BATCHES = 200
LATENCY_RATE = 200
RPC_TIMEOUT_S = 60.0
STAMP = struct.Struct(">q")
VALUES = [os.urandom(100) for _ in range(BATCH)]


class Side:
    """One broker build: how to run it."""

    def __init__(self, name: str, python: str, path: str | None) -> None:
        self.name = name
        self.python = python
        self.env = {} if path is None else {"PYTHONPATH": f"{path}/broker:{path}"}

    def start(self, root: Path, flush: str, tag: str) -> BrokerProcess:
        broker = _Broker(self.python, root / tag, "--flush", flush, "--log-level", "WARNING",
                         env=self.env, log_path=root / f"{tag}.log")  # fmt: skip
        broker.start(60)
        return broker


class _Broker(BrokerProcess):
    """A broker run by ``python`` (``BrokerProcess`` runs this interpreter)."""

    def __init__(
        self, python: str, data_dir: Path, *flags: str, env: dict[str, str], log_path: Path
    ) -> None:
        super().__init__(data_dir, *flags, env=env, log_path=log_path)
        self.python = python

    def command(self) -> list[str]:
        return [self.python, *super().command()[1:]]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def repeat(seconds: float, call: Callable[[], int]) -> float:
    """``call()`` (returning the messages it moved) for ``seconds``: messages/s."""
    count = 0
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        count += call()
    return count / (now - start)


def produce(conn: Connection, topic: str, seconds: float) -> float:
    request = build_request(topic, VALUES)
    conn.broker.Produce(request, timeout=RPC_TIMEOUT_S)  # warm-up

    def one() -> int:
        conn.broker.Produce(request, timeout=RPC_TIMEOUT_S)
        return BATCH

    return repeat(seconds, one)


def pull_raw(conn: Connection, topic: str, seconds: float) -> float:
    offset = [0]

    def one() -> int:
        request = pb.PullRequest(
            topic=topic, queue_id=0, offset=offset[0], max_messages=BATCH, max_bytes=8 << 20
        )
        reply = conn.pull(request, timeout=RPC_TIMEOUT_S)
        offset[0] = reply.next_offset if reply.count else 0
        return int(reply.count)

    return repeat(seconds, one)


def pull_stream(conn: Connection, topic: str, seconds: float) -> float:
    def one() -> int:
        count = 0
        for reply in stream_replies(conn, topic, 0, 0, batch_messages=BATCH, batch_bytes=8 << 20):
            count += len(decode_records(reply.records, reply.broker_id))
        return count

    return repeat(seconds, one)


def pull_empty(conn: Connection, topic: str, seconds: float) -> float:
    request = pb.PullRequest(topic=topic, queue_id=0, offset=0, max_messages=BATCH)

    def one() -> int:
        conn.broker.Pull(request, timeout=RPC_TIMEOUT_S)
        return 1

    return repeat(seconds, one)


def latency(conn: Connection, producer: Producer, topic: str, count: int) -> list[float]:
    seen: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        offset = 0
        while not stop.is_set():
            request = pb.PullRequest(
                topic=topic, queue_id=0, offset=offset, max_messages=BATCH, max_wait_ms=1000
            )
            reply = conn.broker.Pull(request, timeout=RPC_TIMEOUT_S)
            if reply.count:
                now = time.perf_counter_ns()
                for message in decode_records(reply.records, reply.broker_id):
                    seen.append((now - STAMP.unpack_from(message.value)[0]) / 1e6)
            offset = reply.next_offset

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    time.sleep(0.1)  # parked
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / LATENCY_RATE - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        producer.send_batch(topic, [STAMP.pack(time.perf_counter_ns()) + bytes(92)])
    deadline = time.monotonic() + 10
    while len(seen) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(5)
    return seen[count // 10 :]  # warm-up dropped


Results = dict[tuple[str, str, str], list[float]]


def measure(side: Side, root: Path, flush: str, *, tag: str, seconds: float, out: Results) -> None:
    broker = side.start(root, flush, tag)
    pid = broker.process.pid if broker.process is not None else 0
    config = ClientConfig(broker=broker.address, timeout_s=RPC_TIMEOUT_S)
    try:
        with (
            Admin(config=config) as admin,
            Connection(config) as conn,
            Producer(config=config) as producer,
        ):

            def row(name: str, run: Callable[[], float]) -> None:
                before = cpu_s(pid)
                rate = run()
                cpu = (cpu_s(pid) - before) / (rate * seconds) * 1e6
                out.setdefault((name, flush, side.name), []).append(rate)
                out.setdefault((name + " CPU", flush, side.name), []).append(cpu)

            admin.create_topic("produce", queues=4)
            row("produce (raw)", lambda: produce(conn, "produce", seconds))
            if flush == "async":
                admin.create_topic("stored", queues=1)
                request = build_request("stored", VALUES, queue_ids=[0] * BATCH)
                for _ in range(STORED_BATCHES):
                    conn.broker.Produce(request, timeout=RPC_TIMEOUT_S)
                row("pull (raw)", lambda: pull_raw(conn, "stored", seconds))
                row("pull (stream)", lambda: pull_stream(conn, "stored", seconds))
                admin.create_topic("empty", queues=1)
                row("pull (empty)", lambda: pull_empty(conn, "empty", seconds))
            admin.create_topic("latency", queues=1)
            runs = latency(conn, producer, "latency", int(LATENCY_RATE * seconds * 2))
            out.setdefault(("latency", flush, side.name), []).extend(runs)
    finally:
        broker.stop()


def report(out: Results, sides: list[Side]) -> None:
    a, b = (s.name for s in sides)
    print(f"| workload | flush | {a} | {b} | B / A |")
    print("|---|---|---:|---:|---:|")
    for name, flush, _ in sorted({(n, f, "") for n, f, _ in out}):
        if name == "latency":
            for q in (0.5, 0.99):
                va, vb = (_quantile(out[(name, flush, s)], q) for s in (a, b))
                print(
                    f"| latency p{q * 100:g} ms | {flush} | {va:.2f} | {vb:.2f} | {vb / va:.2f}x |"
                )
            continue
        va, vb = (statistics.median(out[(name, flush, s)]) for s in (a, b))
        unit = "CPU s per M" if name.endswith("CPU") else "msgs/s"
        print(f"| {name} ({unit}) | {flush} | {va:,.2f} | {vb:,.2f} | {vb / va:.3f}x |")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (~30 s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per workload and round")
    parser.add_argument("--flush", choices=["async", "sync"], help="only this flush mode")
    parser.add_argument("--baseline-python", help="another checkout's virtualenv interpreter")
    parser.add_argument("--baseline-path", help="a checkout run with this interpreter")
    args = parser.parse_args()
    rounds, seconds = (1, 0.5) if args.quick else (args.rounds, args.seconds)
    sides = [
        Side("A (baseline)", args.baseline_python or sys.executable, args.baseline_path),
        Side("B (this checkout)", sys.executable, None),
    ]
    out: Results = {}
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="equeue-ab-") as tmp:
        for n in range(rounds):
            for side in sides if n % 2 == 0 else sides[::-1]:
                for flush in [args.flush] if args.flush else ["async", "sync"]:
                    tag = f"{side.name[0]}-{flush}-{n}"
                    measure(side, Path(tmp), flush, tag=tag, seconds=seconds, out=out)
    print(f"\n## Broker A/B ({started}, {rounds} round(s) of {seconds:g} s; load average "
          f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end)\n")  # fmt: skip
    report(out, sides)


if __name__ == "__main__":
    main()
