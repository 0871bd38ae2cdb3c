"""Budgets: the broker's memory under hostile or careless clients (issue 15).

Run ``python hardening/budgets.py`` (a few minutes; ``--only NAME`` for one
scenario). Each scenario starts a broker with default settings in a temporary
directory, measures its anonymous memory (``RssAnon``: the heap, not the page
cache of the mapped log) at rest, runs the clients, samples ``RssAnon`` every
20 ms for the peak, and prints a table: scenario, RssAnon at rest, peak,
budget, pass/fail. What the clients saw (refusals and their status codes) is
in the last column. Exit code 1 if any scenario went over budget.

Safety: a sampler kills the broker (by its PID) if it passes 4 GiB, so an
experiment cannot take the shared machine down.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `hardening` as a package

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_report import table
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

MiB = 1 << 20
BUDGET = 512 * MiB
KILL_AT = 4096 * MiB


class Sampler:
    """RssAnon of one process every 20 ms; the peak; a kill past ``KILL_AT``."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.peak = 0
        self.killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_anon(self) -> int:
        value = self.broker.proc_status().get("RssAnon", "0 kB")
        return int(value.split()[0]) * 1024

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            now = self.rss_anon()
            self.peak = max(self.peak, now)
            if now > KILL_AT and self.broker.alive():
                self.killed = True
                self.broker.kill()

    def __enter__(self) -> Sampler:
        self.peak = self.rss_anon()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@contextmanager
def broker_with(*flags: str) -> Iterator[tuple[BrokerProcess, pb_grpc.BrokerStub]]:
    with tempfile.TemporaryDirectory(prefix="equeue-budgets-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", *flags)
        broker.start()
        try:
            with grpc.insecure_channel(broker.address, options=_big()) as channel:
                yield broker, pb_grpc.BrokerStub(channel)
        finally:
            broker.kill()


def _big() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", 256 * MiB),
            ("grpc.max_send_message_length", 256 * MiB)]  # fmt: skip


def _columns(count: int, size: int) -> pb.MessageColumns:
    return pb.MessageColumns(
        count=count, values=b"x" * (count * size), value_lengths=[size] * count
    )


def _fill(stub: pb_grpc.BrokerStub, topic: str, total: int) -> None:
    """``total`` bytes of 256 KiB messages into queue 0 of ``topic``, 8 MiB a request."""
    for _ in range(total // (8 * MiB)):
        request = pb.ProduceRequest(
            topic=topic, messages=_columns(32, 256 * 1024), queue_ids=[0] * 32
        )
        stub.Produce(request, timeout=60)


def _code(call: Callable[[], object]) -> str:
    try:
        call()
        return "OK"
    except grpc.RpcError as exc:
        name: str = exc.code().name
        return name


# -- scenarios: each returns what the clients saw ------------------------------------


def heartbeats(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> str:
    """Item 13: heartbeats naming a new group and 1,024 made-up topics each, then
    heartbeats naming a new group each on one real topic."""
    topics = [f"nope-{n:04d}" for n in range(1024)]
    seen: collections.Counter[str] = collections.Counter()
    for n in range(14_000):
        named = topics if n % 2 else topics[:200]  # over the topic limit, or under it
        request = pb.HeartbeatRequest(group=f"g{n}", consumer_id="c", topics=named)
        seen[_code(functools.partial(stub.Heartbeat, request, timeout=10))] += 1
    stub.Produce(pb.ProduceRequest(topic="real", messages=_columns(1, 1)), timeout=10)
    for n in range(5_000):
        request = pb.HeartbeatRequest(group=f"h{n}", consumer_id="c", topics=["real"])
        seen["real " + _code(functools.partial(stub.Heartbeat, request, timeout=10))] += 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(seen.items()))


def unread_streams(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> str:
    """Item 10: 23 PullStreams of 64 MiB replies over 192 MiB, never read."""
    _fill(stub, "s", 192 * MiB)
    request = pb.PullStreamRequest(topic="s", queue_id=0, offset=0, batch_bytes=64 * MiB,
                                   batch_messages=10_000)  # fmt: skip
    channels = [grpc.insecure_channel(broker.address, options=_big()) for _ in range(23)]
    calls: list[Any] = [pb_grpc.BrokerStub(c).PullStream(request, timeout=30) for c in channels]
    time.sleep(8)  # run only: let the broker do whatever the streams make it do
    seen: collections.Counter[str] = collections.Counter()
    for call in calls:
        if call.done():
            seen[call.code().name] += 1
        else:
            seen["still open (cancelled by us)"] += 1
            call.cancel()
    for channel in channels:
        channel.close()
    return ", ".join(f"{k} x{v}" for k, v in seen.items())


def _append_60_mib(stub: pb_grpc.BrokerStub, topic: str) -> None:
    """One 60 MiB append to queue 0: staged in three 20 MiB requests (each under
    max_request_bytes), then committed as one transaction."""
    for _ in range(3):
        part = pb.ProduceRequest(topic=topic, messages=_columns(80, 256 * 1024),
                                 queue_ids=[0] * 80, transaction_id="big")  # fmt: skip
        stub.Produce(part, timeout=60)
    commit = pb.CommitTransactionsRequest(
        transactions=[pb.TransactionRef(transaction_id="big", expected_messages=240)]
    )
    stub.CommitTransactions(commit, timeout=60)


def woken_pulls(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> str:
    """Item 12: 40 pulls parked with max_bytes 64 MiB, woken by one 60 MiB append."""
    stub.Produce(pb.ProduceRequest(topic="w", messages=_columns(1, 1), queue_ids=[0]), timeout=10)
    request = pb.PullRequest(topic="w", queue_id=0, offset=1, max_bytes=64 * MiB,
                             max_messages=10_000, max_wait_ms=30_000)  # fmt: skip
    with ThreadPoolExecutor(40) as pool:
        futures = [pool.submit(_code, lambda: stub.Pull(request, timeout=60)) for _ in range(40)]
        time.sleep(2)  # run only: let them park
        _append_60_mib(stub, "w")
        seen = collections.Counter(f.result() for f in futures)
    return ", ".join(f"{k} x{v}" for k, v in sorted(seen.items()))


def _concurrent_produces(broker: BrokerProcess, stub: pb_grpc.BrokerStub, mib: int) -> str:
    """12 clients, each sending two ``mib`` MiB produce requests at once."""
    stub.Produce(pb.ProduceRequest(topic="p", messages=_columns(1, 1)), timeout=10)
    request = pb.ProduceRequest(topic="p", messages=_columns(mib, MiB - 64))
    channels = [grpc.insecure_channel(broker.address, options=_big()) for _ in range(12)]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    with ThreadPoolExecutor(24) as pool:
        futures = [
            pool.submit(_code, lambda s=s: s.Produce(request, timeout=120))  # type: ignore[misc]
            for s in stubs for _ in range(2)
        ]  # fmt: skip
        seen = collections.Counter(f.result() for f in futures)
    for channel in channels:
        channel.close()
    return ", ".join(f"{k} x{v}" for k, v in sorted(seen.items()))


def big_produces(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> str:
    """Item 11: 12 clients sending two 64 MiB produce requests at once."""
    return _concurrent_produces(broker, stub, 64)


def max_size_produces(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> str:
    """Item 11 within the request limit: 12 clients x two 20 MiB produces at once."""
    return _concurrent_produces(broker, stub, 20)


BACKLOG_QUEUES = 8
BACKLOG_BYTES = 2048 * MiB
"""The backlog scenario: 2 GiB of 1 KiB messages, one queue per reader."""


def backlog_readers(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> str:
    """A 2 GiB backlog of 1 KiB messages served to 8 streaming readers at once
    (one queue each, read to its end): the broker's heap must stay bounded while
    the log's pages (RssFile: page cache of the mapped chunks) carry the bytes."""
    with grpc.insecure_channel(broker.address) as channel:
        admin = pb_grpc.AdminStub(channel)
        admin.CreateTopic(pb.CreateTopicRequest(name="backlog", queue_count=BACKLOG_QUEUES))
    per_request = 8192
    for n in range(BACKLOG_BYTES // (per_request * 1024)):
        request = pb.ProduceRequest(
            topic="backlog", messages=_columns(per_request, 1024),
            queue_ids=[n % BACKLOG_QUEUES] * per_request,
        )  # fmt: skip
        stub.Produce(request, timeout=120)

    def read_queue(queue_id: int) -> int:
        with grpc.insecure_channel(broker.address, options=_big()) as channel:
            request = pb.PullStreamRequest(
                topic="backlog", queue_id=queue_id, offset=0, batch_bytes=MiB,
                batch_messages=10_000, end_offset=BACKLOG_BYTES // 1024 // BACKLOG_QUEUES,
            )  # fmt: skip
            return sum(
                r.count for r in pb_grpc.BrokerStub(channel).PullStream(request, timeout=600)
            )

    file_peak = 0
    with ThreadPoolExecutor(BACKLOG_QUEUES) as pool:
        futures = [pool.submit(read_queue, q) for q in range(BACKLOG_QUEUES)]
        while not all(f.done() for f in futures):
            file_peak = max(file_peak, _kib(broker.proc_status().get("RssFile", "0 kB")))
            time.sleep(0.2)
        read = sum(f.result() for f in futures)
    return f"{read:,} messages read; peak RssFile (mapped log pages) {file_peak // MiB} MiB"


def _kib(value: str) -> int:
    return int(value.split(maxsplit=1)[0]) * 1024


def _fds(broker: BrokerProcess) -> collections.Counter[str]:
    """The broker's open descriptors: sockets, index files, others."""
    kinds: collections.Counter[str] = collections.Counter()
    for fd in Path(f"/proc/{broker.pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        kinds["socket" if target.startswith("socket:") else
              "index" if target.endswith(".idx") else "other"] += 1  # fmt: skip
    return kinds


def idle_connections(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> str:
    """Item 14: 3,000 TCP connections that never say anything (no token needed)."""
    host, port = broker.address.rsplit(":", 1)
    sockets = []
    refused = 0
    for _ in range(3_000):
        try:
            sockets.append(socket.create_connection((host, int(port)), timeout=5))
        except OSError:
            refused += 1
    time.sleep(2)  # run only: let the broker accept (and close) what it will
    held = _fds(broker)["socket"]
    call = functools.partial(stub.ListOffsets, pb.ListOffsetsRequest(topic="x"), timeout=10)
    served = _code(call)
    time.sleep(11)  # run only: past the 10 s handshake timeout, which frees the slots
    later = _code(call)
    for sock in sockets:
        sock.close()
    return (
        f"broker sockets {held} of 3,000 opened ({refused} refused);"
        f" a call then: {served}, after the handshake timeout: {later}"
    )


def many_queues(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> str:
    """Item 14: 19,712 queues (77 topics x 256), each written once."""
    admin = pb_grpc.AdminStub(grpc.insecure_channel(broker.address))
    for t in range(77):
        admin.CreateTopic(pb.CreateTopicRequest(name=f"q{t}", queue_count=256), timeout=60)
        request = pb.ProduceRequest(topic=f"q{t}", messages=_columns(256, 16), queue_ids=range(256))
        stub.Produce(request, timeout=60)
    kinds = _fds(broker)
    return f"broker index fds {kinds['index']}, all fds {sum(kinds.values())}"


SCENARIOS: dict[str, Callable[[BrokerProcess, pb_grpc.BrokerStub], str]] = {
    "13 heartbeats: new groups, made-up topics": heartbeats,
    "10 23 unread PullStreams (64 MiB replies)": unread_streams,
    "12 40 parked pulls woken by a 60 MiB append": woken_pulls,
    "11 12 clients x two 64 MiB produces": big_produces,
    "11b 12 clients x two 20 MiB produces": max_size_produces,
    "14 3,000 idle TCP connections": idle_connections,
    "14b 19,712 queues written": many_queues,
    "2 GiB backlog of 1 KiB messages to 8 streaming readers": backlog_readers,
}


def run(name: str, scenario: Callable[[BrokerProcess, pb_grpc.BrokerStub], str]) -> list[object]:
    with broker_with() as (broker, stub):
        with Sampler(broker) as sampler:
            at_rest = sampler.rss_anon()
            try:
                seen = scenario(broker, stub)
            except grpc.RpcError as exc:
                seen = f"scenario failed: {exc.code().name}"
        peak = sampler.peak
        alive = broker.alive() and not sampler.killed
    ok = alive and peak < BUDGET
    return [name, f"{at_rest // MiB} MiB", f"{peak // MiB} MiB", f"{BUDGET // MiB} MiB",
            "pass" if ok else "FAIL" + ("" if alive else " (killed)"), seen]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    args = parser.parse_args()
    rows = [run(n, s) for n, s in SCENARIOS.items() if not args.only or args.only in n]
    headers = ["scenario", "RssAnon at rest", "peak RssAnon", "budget", "result", "clients saw"]
    print(table(headers, rows))
    return 0 if all(r[4] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
