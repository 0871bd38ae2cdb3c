"""Clients that deny service to others (issue 25): does a fresh client still get through?

Run ``python hardening/deny_service.py`` (about a minute; ``--only NAME`` for one
attack). Each attack starts a broker with default settings on 127.0.0.1, starts
the hostile clients (from 127.0.0.1 too), then runs the probe several times: a
fresh client (a new channel) that produces one message and pulls it back, each
call bounded by 5 s. It prints a table: attack, what the hostile clients saw,
the probe's results and latencies. Exit code 1 if a probe failed.

The attacks:

- ``silent``: 2,000 TCP connections that never send a byte, held open;
- ``unread``: 48 PullStreams asking for 64 MiB batches, never read;
- ``parked``: 10,000 parked pulls over 4 connections, then one more.
"""

from __future__ import annotations

import argparse
import collections
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_report import table
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

MiB = 1 << 20
PROBE_TIMEOUT_S = 5.0
OWN = [("grpc.use_local_subchannel_pool", 1)]
"""A channel of its own: channels in one process with the same target and options
share one connection otherwise, and a hostile client's must not carry the probe."""
BIG = [*OWN, ("grpc.max_receive_message_length", 256 * MiB),
       ("grpc.max_send_message_length", 256 * MiB)]  # fmt: skip


@dataclass
class Probe:
    """A fresh client's produce-then-pull round trip (a new channel each time)."""

    address: str
    topic: str = "probe"
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def once(self) -> str:
        """Produce one message, pull it back; "OK" or what failed."""
        start = time.monotonic()
        try:
            with grpc.insecure_channel(self.address, options=OWN) as channel:
                stub = pb_grpc.BrokerStub(channel)
                value = b"probe-%d" % len(self.latencies)
                produce = pb.ProduceRequest(
                    topic=self.topic, queue_ids=[0],
                    messages=pb.MessageColumns(count=1, values=value, value_lengths=[len(value)]),
                )  # fmt: skip
                offset = stub.Produce(produce, timeout=PROBE_TIMEOUT_S).offsets[0]
                pull = pb.PullRequest(topic=self.topic, queue_id=0, offset=offset, max_messages=1)
                reply = stub.Pull(pull, timeout=PROBE_TIMEOUT_S)
                if reply.count != 1:
                    raise AssertionError(f"pulled {reply.count} messages at offset {offset}")
        except grpc.RpcError as exc:
            call: grpc.Call = exc  # type: ignore[assignment]
            self.failures.append(f"{call.code().name}: {call.details()}")
            return self.failures[-1]
        self.latencies.append(time.monotonic() - start)
        return "OK"

    def run(self, times: int) -> None:
        for _ in range(times):
            self.once()

    def summary(self) -> str:
        ok = len(self.latencies)
        text = f"{ok}/{ok + len(self.failures)} OK"
        if self.latencies:
            ordered = sorted(self.latencies)
            text += f", median {ordered[len(ordered) // 2] * 1000:.0f} ms"
            text += f", max {ordered[-1] * 1000:.0f} ms"
        if self.failures:
            first = collections.Counter(f.split(":")[0] for f in self.failures)
            text += "; failed: " + ", ".join(f"{k} x{v}" for k, v in first.items())
            text += f" (first: {self.failures[0][:100]})"
        return text


@contextmanager
def broker_with(*flags: str) -> Iterator[BrokerProcess]:
    with tempfile.TemporaryDirectory(prefix="equeue-dos-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", *flags)
        broker.start()
        try:
            with grpc.insecure_channel(broker.address) as channel:
                admin = pb_grpc.AdminStub(channel)
                admin.CreateTopic(pb.CreateTopicRequest(name="probe", queue_count=1), timeout=10)
            yield broker
        finally:
            broker.kill()


def _columns(count: int, size: int) -> pb.MessageColumns:
    return pb.MessageColumns(
        count=count, values=b"x" * (count * size), value_lengths=[size] * count
    )


def code_of(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        call: grpc.Call = exc  # type: ignore[assignment]
        return f"{call.code().name}: {(call.details() or '')[:80]}"
    return type(exc).__name__


# -- attacks: each yields once its hostile clients are in place --------------------


@contextmanager
def silent_connections(broker: BrokerProcess, count: int = 2_000) -> Iterator[str]:
    """``count`` TCP connections that never send a byte, held open."""
    host, port = broker.address.rsplit(":", 1)
    sockets: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(count):
            try:
                sockets.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                refused += 1
        yield f"{len(sockets)} connected, {refused} refused"
    finally:
        for sock in sockets:
            sock.close()


def fill(address: str, topic: str, mib: int) -> None:
    """``mib`` MiB of 256 KiB messages into queue 0 of ``topic``, 8 MiB a request."""
    with grpc.insecure_channel(address, options=BIG) as channel:
        stub = pb_grpc.BrokerStub(channel)
        for _ in range(mib // 8):
            request = pb.ProduceRequest(topic=topic, messages=_columns(32, 256 * 1024),
                                        queue_ids=[0] * 32)  # fmt: skip
            stub.Produce(request, timeout=60)


@contextmanager
def unread_streams(broker: BrokerProcess, count: int = 48, mib: int = 192) -> Iterator[str]:
    """``count`` PullStreams of 64 MiB batches over ``mib`` MiB, never read."""
    fill(broker.address, "s", mib)
    request = pb.PullStreamRequest(topic="s", queue_id=0, offset=0, batch_bytes=64 * MiB,
                                   batch_messages=10_000)  # fmt: skip
    channels = [grpc.insecure_channel(broker.address, options=BIG) for _ in range(count)]
    calls: list[Any] = [pb_grpc.BrokerStub(c).PullStream(request, timeout=120) for c in channels]
    try:
        time.sleep(2)  # run only: let the broker start serving (and stall) them
        seen = collections.Counter(
            code_of(c.exception()) if c.done() and c.exception() else "open" for c in calls
        )
        yield ", ".join(f"{k} x{v}" for k, v in seen.items())
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            channel.close()


@contextmanager
def parked_pulls(
    broker: BrokerProcess, count: int = 10_000, connections: int = 4, settle_s: float = 20.0
) -> Iterator[str]:
    """``count`` pulls parked (60 s waits) over ``connections`` channels; then one more
    over a fresh channel."""
    with grpc.insecure_channel(broker.address) as channel:
        pb_grpc.AdminStub(channel).CreateTopic(
            pb.CreateTopicRequest(name="parked", queue_count=1), timeout=10
        )
    request = pb.PullRequest(topic="parked", queue_id=0, offset=0, max_wait_ms=60_000)
    channels = [grpc.insecure_channel(broker.address, options=OWN) for _ in range(connections)]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    futures: list[Any] = [stubs[n % connections].Pull.future(request, timeout=90)
                          for n in range(count)]  # fmt: skip
    try:
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:  # the refused ones end at once; the rest park
            done = sum(f.done() for f in futures)
            time.sleep(0.5)
            if sum(f.done() for f in futures) == done and done < count:
                break
        ended = collections.Counter(code_of(f.exception()) for f in futures if f.done())
        with grpc.insecure_channel(broker.address, options=OWN) as channel:
            one_more: Any = pb_grpc.BrokerStub(channel).Pull.future(request, timeout=10)
            try:
                one_more.result(timeout=3)
                extra = "answered"
            except grpc.FutureTimeoutError:
                extra = "parked"
            except grpc.RpcError as exc:
                extra = code_of(exc)
            one_more.cancel()
        open_ = sum(not f.done() for f in futures)
        yield (f"{open_} parked; ended: " + ", ".join(f"{k} x{v}" for k, v in ended.items())
               + f"; one more: {extra}")  # fmt: skip
    finally:
        for future in futures:
            future.cancel()
        for channel in channels:
            channel.close()


ATTACKS: dict[str, Callable[[BrokerProcess], Any]] = {
    "silent: 2,000 silent TCP connections": silent_connections,
    "unread: 48 unread PullStreams of 64 MiB": unread_streams,
    "parked: 10,000 parked pulls on 4 connections": parked_pulls,
}


def run(name: str, attack: Callable[[BrokerProcess], Any], probes: int) -> list[object]:
    with broker_with() as broker:
        before = Probe(broker.address)
        before.run(3)
        with attack(broker) as seen:
            probe = Probe(broker.address)
            probe.run(probes)
        alive = broker.alive()
    return [name, seen, before.summary(), probe.summary(), "up" if alive else "DIED"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the attacks whose name contains this")
    parser.add_argument("--probes", type=int, default=5, help="probe round trips per attack")
    args = parser.parse_args()
    threading.stack_size(512 * 1024)
    rows = [run(n, a, args.probes) for n, a in ATTACKS.items() if not args.only or args.only in n]
    print(table(["attack", "hostile clients saw", "probe before", "probe under attack",
                 "broker"], rows))  # fmt: skip
    return 0 if all("failed" not in str(r[3]) and r[4] == "up" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
