"""The broker's hot-path figures: message and byte counters (stats.py), RPC
durations (metrics_hot.py), budget refusals (budgets.py), the cached disk
usage (disk_usage.py); and, on an in-process broker, that produce and pull
count their stored bytes and every RPC is timed under its status."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from equeue_broker.server.budgets import ByteBudget
from equeue_broker.server.disk_usage import DiskUsage, filesystem, walk_usage
from equeue_broker.server.metrics_hot import BUCKETS, RPC_TIMES, STREAM_TIMES, RpcTimes, timed
from equeue_broker.server.stats import FEATURES, Counters, fill_stats
from equeue_broker.storage import LimitExceeded
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer, read_range
from equeue_spark.client.errors import NotFoundError
from tests.support.in_process import InProcessBroker


def test_counters_count_bytes_per_queue() -> None:
    counters = Counters()
    counters.add("t", 0, produced=2, produced_bytes=200)
    counters.add("t", 0, produced=1, produced_bytes=50)
    counters.pulled("t", 0, served=2, filtered=1, nbytes=180)
    counters.pulled("u", 1, served=0, filtered=4, nbytes=0)
    counters.add("u", 1, produced=1)  # a caller that knows no bytes
    assert counters.per_queue() == [("t", 0, 3, 2), ("u", 1, 1, 0)]
    assert counters.per_queue_bytes() == [("t", 0, 250, 180), ("u", 1, 0, 0)]
    assert counters.totals() == (4, 2)
    counters.forget("t")
    assert counters.per_queue_bytes() == [("u", 1, 0, 0)]
    assert counters.totals() == (4, 2)  # the broker-wide totals keep what happened


def test_lag_ms_is_a_feature() -> None:
    assert "lag_ms" in FEATURES
    assert "lag_ms" in fill_stats(pb.BrokerStats(), Counters()).features


def test_rpc_times_buckets_and_snapshot() -> None:
    times = RpcTimes((0.01, 0.1))
    times.observe("Produce", "OK", 0.001)
    times.observe("Produce", "OK", 0.01)  # a bound is inclusive (Prometheus' le)
    times.observe("Produce", "OK", 5.0)
    times.observe("Pull", "NOT_FOUND", 0.05)
    snapshot = times.snapshot()
    counts, total = snapshot[("Produce", "OK")]
    assert counts == [2, 0, 1] and total == pytest.approx(5.011)
    counts, total = snapshot[("Pull", "NOT_FOUND")]
    assert counts == [0, 1, 0] and total == pytest.approx(0.05)
    snapshot[("Produce", "OK")][0][0] = 99  # a copy
    assert times.snapshot()[("Produce", "OK")][0] == [2, 0, 1]
    assert len(BUCKETS) == 14 and list(BUCKETS) == sorted(BUCKETS)


def test_timed_names_the_outcome() -> None:
    times = RpcTimes()
    with timed(times, "A"):
        pass
    with timed(times, "A") as call:
        call.code = "NOT_FOUND"
    with pytest.raises(ValueError), timed(times, "A"):
        raise ValueError("unnamed")
    with pytest.raises(asyncio.CancelledError), timed(times, "A"):
        raise asyncio.CancelledError
    counted = {key: sum(counts) for key, (counts, _) in times.snapshot().items()}
    assert counted == {("A", "OK"): 1, ("A", "NOT_FOUND"): 1, ("A", "UNKNOWN"): 1,
                       ("A", "CANCELLED"): 1}  # fmt: skip


def test_budget_counts_waits_and_refusals() -> None:
    async def scenario() -> tuple[int, int]:
        budget = ByteBudget("max_test_bytes", 100, wait_s=0.05)
        taken = await budget.acquire(80)
        assert (budget.waited, budget.refused) == (0, 0)  # the fast path counts nothing
        with pytest.raises(LimitExceeded):
            await budget.acquire(50)
        waiting = asyncio.ensure_future(budget.acquire(50, wait_s=5))
        await asyncio.sleep(0)
        budget.release(taken)
        budget.release(await waiting)
        return budget.waited, budget.refused

    assert asyncio.run(scenario()) == (2, 1)


def test_disk_usage_is_cached(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10_000)
    disk = DiskUsage(ttl_s=3600)
    first = disk.used(tmp_path)
    assert first == walk_usage(tmp_path) > 0
    (tmp_path / "b").write_bytes(b"y" * 100_000)
    assert disk.used(tmp_path) == first  # not walked again within the ttl
    assert DiskUsage(ttl_s=0).used(tmp_path) > first
    free, size = filesystem(tmp_path)
    assert 0 < free <= size


@pytest.fixture
def in_process(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "data")
    try:
        yield broker
    finally:
        broker.close()


def calls(times: RpcTimes, method: str, code: str) -> int:
    counts, _ = times.snapshot().get((method, code), ([0], 0.0))
    return sum(counts)


@pytest.mark.timeout(60)
def test_produce_and_pull_count_stored_bytes_and_rpcs_are_timed(
    in_process: InProcessBroker,
) -> None:
    config = ClientConfig(broker=in_process.address, timeout_s=5, retries=0)
    produced_ok = calls(RPC_TIMES, "Produce", "OK")
    streamed_ok = calls(STREAM_TIMES, "PullStream", "OK")
    not_found = calls(RPC_TIMES, "DescribeTopic", "NOT_FOUND")
    with Producer(config=config) as producer:
        producer.send_batch("t", [b"a" * 100, b"b" * 200], queue_ids=[0, 0])
        producer.send_batch("t", [b"c" * 300], queue_ids=[0])
    stored = in_process.store.read("t", 0, 0)
    sizes = in_process.store.reads.offset_for_bytes("t", 0, 0, 3, 1 << 30)
    assert len(stored.messages) == 3 and sizes[0] == 3
    got = [m.value for b in read_range("t", 0, 0, config=config) for m in b]
    assert got == [b"a" * 100, b"b" * 200, b"c" * 300]
    with Admin(config=config) as admin, pytest.raises(NotFoundError):
        admin.describe_topic("nobody")

    deadline = time.monotonic() + 10  # a stream is counted and timed once it ended
    while (
        in_process.state.counters.per_queue() != [("t", 0, 3, 3)]
        or calls(STREAM_TIMES, "PullStream", "OK") == streamed_ok
    ):
        assert time.monotonic() < deadline, in_process.state.counters.per_queue()
        time.sleep(0.01)
    assert in_process.state.counters.per_queue_bytes() == [("t", 0, sizes[1], sizes[1])]
    assert calls(RPC_TIMES, "Produce", "OK") - produced_ok == 2
    assert calls(STREAM_TIMES, "PullStream", "OK") - streamed_ok == 1  # read_range streams
    assert calls(RPC_TIMES, "DescribeTopic", "NOT_FOUND") - not_found >= 1
    assert STREAM_TIMES.buckets[-1] == 3600.0
