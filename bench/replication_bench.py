"""Produce throughput with no replica, an async replica and a sync replica (issue 18).

    python bench/replication_bench.py [--seconds 5] [--batch 1000] [--sizes 100,1024] [--quick]

For each message size and each setup the script starts real broker processes on
127.0.0.1 (``BrokerProcess``, as tests/replication/test_sync_replication.py does): a master
alone, a master with ``--replication async`` and one replica, a master with
``--replication sync`` and one replica (in sync before measuring). One client
sends batches of ``--batch`` messages one after another (each waits for its
ack) on one queue for ``--seconds``, after a warm-up; the table gives msgs/s and
the ratio to no replication measured in the same run (the target: sync >= 0.5x).
``--repeat N`` runs every setup N times, interleaved (a shared machine's load
drifts): the table shows medians, the ratio the median of each round's ratio.

``--profile DIR`` runs every broker under cProfile (``EQUEUE_PROFILE``, read by
bench/_profiled_broker.py) and leaves one ``.prof`` file per broker in DIR.
Everything shares this machine's cores: the figures include the contention of
client, master and replica for them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

TOPIC = "bench"
SETUPS = ("none", "async", "sync")
WARMUP_S = 1.0


@contextmanager
def brokers(
    work: Path, setup: str, flush: str, profile: Path | None
) -> Iterator[tuple[str, list[BrokerProcess]]]:
    """The master (and for async/sync one replica, in sync before yielding):
    (master address, processes)."""
    common = ("--broker-name", "g", "--flush", flush, "--log-level", "WARNING")
    module, env = "equeue_broker", {}
    if profile is not None:
        module = "bench._profiled_broker"
        env = {"EQUEUE_PROFILE": str(profile / f"{setup}-{work.name}")}
    mode = () if setup == "none" else ("--replication", setup)
    master = BrokerProcess(
        work / "master", *common, *mode, module=module, env={**env, "ROLE": "master"}
    )  # fmt: skip
    processes = [master]
    try:
        address = master.start()
        channel = grpc.insecure_channel(address)
        admin = pb_grpc.AdminStub(channel)
        admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=30)
        if setup != "none":
            replica = BrokerProcess(
                work / "replica", *common, "--role", "replica", "--master", address,
                module=module, env={**env, "ROLE": "replica"},
            )  # fmt: skip
            processes.append(replica)
            replica.start()
            deadline = time.monotonic() + 30
            while len(admin.GetStats(pb.GetStatsRequest(), timeout=10).in_sync) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica never joined the in-sync set")
                time.sleep(0.05)
        channel.close()
        yield address, processes
    finally:
        for process in reversed(processes):
            process.stop()


def produce_rate(address: str, size: int, batch: int, seconds: float) -> float:
    """Messages per second of one client sending ``batch``-message produces in turn."""
    values = bytes(size) * batch
    columns = pb.MessageColumns(count=batch, values=values, value_lengths=[size] * batch)
    request = pb.ProduceRequest(topic=TOPIC, messages=columns)
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        end = time.monotonic() + WARMUP_S
        while time.monotonic() < end:
            stub.Produce(request, timeout=30)
        sent = 0
        start = time.monotonic()
        end = start + seconds
        while time.monotonic() < end:
            stub.Produce(request, timeout=30)
            sent += batch
        return sent / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--flush", default="async", choices=("async", "sync"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: every setup, 100 B, 0.3 s each, one round")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.sizes, args.repeat = 0.3, "100", 1
    sizes = [int(s) for s in args.sizes.split(",")]
    setups = args.setups.split(",")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rates: dict[tuple[int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="equeue-repl-bench-") as tmp:
        for round_ in range(args.repeat):
            for size in sizes:
                for setup in setups:
                    work = Path(tmp) / f"{setup}-{size}-{round_}"
                    with brokers(work, setup, args.flush, args.profile) as (address, _):
                        rate = produce_rate(address, size, args.batch, args.seconds)
                    rates.setdefault((size, setup), []).append(rate)
    print(
        f"flush {args.flush}, batch {args.batch}, {args.seconds:g} s each, one client, "
        f"{args.repeat} round(s): medians"
    )
    print(f"{'size':>6} {'setup':>6} {'msgs/s':>10} {'ratio':>6}  per round")
    for size in sizes:
        base = rates.get((size, "none"))
        for setup in setups:
            got = rates[(size, setup)]
            ratios = [r / b for r, b in zip(got, base, strict=True)] if base else []
            ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
            rounds = " ".join(f"{r / 1000:.0f}k" for r in got)
            print(f"{size:>6} {setup:>6} {statistics.median(got):>10,.0f} {ratio:>6}  {rounds}")


if __name__ == "__main__":
    main()
