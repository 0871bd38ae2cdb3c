"""Clients that deny service to others (issue 25): under each attack a fresh
client (the probe: a new connection that produces one message and pulls it
back, each call bounded by 5 s) keeps working, and what is over a limit is
refused with RESOURCE_EXHAUSTED naming the setting. hardening/deny_service.py
runs the same attacks at full size and prints the probe's latencies."""

from __future__ import annotations

import collections
import socket
import struct
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest

from equeue_broker.server.connections import auto_max_connections, connections_by_address
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from tests.support.waits import wait_for

MiB = 1 << 20
StartBroker = Callable[..., BrokerProcess]
OWN = [("grpc.use_local_subchannel_pool", 1)]
"""A connection of its own: channels of one process with the same target and
options share one connection otherwise."""
BIG = [*OWN, ("grpc.max_receive_message_length", 256 * MiB)]


def probe(address: str, topic: str = "probe") -> float:
    """A fresh client's round trip: produce one message, pull it back; seconds taken."""
    start = time.monotonic()
    with grpc.insecure_channel(address, options=OWN) as channel:
        stub = pb_grpc.BrokerStub(channel)
        columns = pb.MessageColumns(count=1, values=b"p", value_lengths=[1])
        produce = pb.ProduceRequest(topic=topic, messages=columns, queue_ids=[0])
        offset = stub.Produce(produce, timeout=5).offsets[0]
        pull = pb.PullRequest(topic=topic, queue_id=0, offset=offset, max_messages=1)
        assert stub.Pull(pull, timeout=5).count == 1
    return time.monotonic() - start


def _broker_with(start: StartBroker, tmp_path: Path, **settings: int) -> BrokerProcess:
    config = tmp_path / "dos.toml"
    config.write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
    broker = start("--config", str(config))
    with grpc.insecure_channel(broker.address) as channel:
        admin = pb_grpc.AdminStub(channel)
        for topic in ("probe", "parked", "s"):
            admin.CreateTopic(pb.CreateTopicRequest(name=topic, queue_count=1), timeout=10)
    return broker


def _error(future: Any) -> tuple[grpc.StatusCode, str]:
    error = future.exception(timeout=30)
    assert error is not None, "the call succeeded"
    return error.code(), error.details() or ""


# -- silent connections --------------------------------------------------------------


def test_the_default_connection_limit_follows_the_open_files_limit() -> None:
    assert auto_max_connections(1_024, 4_096) == 64  # floor: a tiny limit still serves
    assert auto_max_connections(20_000, 4_096) == 20_000 - 4_096 - 1_024
    assert auto_max_connections(1 << 20, 4_096) == 16_384  # ceiling: memory, not descriptors


@pytest.mark.slow  # 9 s of 2,000 silent connections: hardening (make test runs it)
@pytest.mark.timeout(120)
def test_silent_connections_leave_room_for_clients_that_speak(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    """2,000 connections that never send a byte, held open through the kernel's
    deferral and the handshake timeout: a fresh client keeps getting through."""
    broker = _broker_with(broker_factory, tmp_path)
    host, port = broker.address.rsplit(":", 1)
    with ExitStack() as stack:
        for _ in range(2_000):
            stack.enter_context(socket.create_connection((host, int(port)), timeout=10))
        deadline = time.monotonic() + 8  # past the deferral (3 s) and the handshake timeout
        rounds = 0
        while time.monotonic() < deadline or rounds < 3:
            assert probe(broker.address) < 5
            rounds += 1
            time.sleep(0.5)


def _established(broker: BrokerProcess) -> int:
    """The broker's established connections from 127.0.0.1 (its side of them)."""
    return len(connections_by_address(broker.port).get("127.0.0.1", []))


@pytest.mark.timeout(120)
def test_connections_over_the_per_address_limit_are_closed(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    broker = _broker_with(broker_factory, tmp_path, max_connections_per_address=4)
    with ExitStack() as stack:
        for _ in range(8):
            channel = stack.enter_context(grpc.insecure_channel(broker.address, options=OWN))
            pb_grpc.AdminStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=10)
        wait_for("the broker to close the newest four", lambda: _established(broker) <= 4, 30)
    assert "max_connections_per_address 4" in broker.log_since_start()
    wait_for("a fresh client to get through", lambda: _established(broker) == 0, 30)
    assert probe(broker.address) < 5


# -- pull streams nobody reads ----------------------------------------------------------


def _fill(address: str, topic: str, mib: int) -> None:
    with grpc.insecure_channel(address, options=BIG) as channel:
        stub = pb_grpc.BrokerStub(channel)
        for _ in range(mib // 4):
            columns = pb.MessageColumns(
                count=16, values=b"v" * (16 * 256 * 1024), value_lengths=[256 * 1024] * 16
            )
            stub.Produce(pb.ProduceRequest(topic=topic, messages=columns, queue_ids=[0] * 16),
                         timeout=30)  # fmt: skip


@pytest.mark.timeout(120)
def test_unread_pull_streams_neither_hold_up_pulls_nor_keep_their_budget(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    """16 streams of 64 MiB batches nobody reads fill the streams' half of the
    default reply budget (8 MiB replies each, more than a client's receive
    window): pulls are served at once from their half; a stream that does
    read gets its turn once the unread ones time out (1 s here): those are
    ended, and their connections closed, which frees their replies (the
    broker says so in its log)."""
    broker = _broker_with(
        broker_factory, tmp_path, stream_send_timeout_ms=1_000, budget_wait_ms=20_000
    )
    _fill(broker.address, "s", 64)
    request = pb.PullStreamRequest(topic="s", queue_id=0, batch_bytes=64 * MiB,
                                   batch_messages=10_000)  # fmt: skip
    with ExitStack() as stack:
        channels = [stack.enter_context(grpc.insecure_channel(broker.address, options=BIG))
                    for _ in range(16)]  # fmt: skip
        unread: list[Any] = [pb_grpc.BrokerStub(c).PullStream(request, timeout=60)
                             for c in channels]  # fmt: skip
        for _ in range(5):
            assert probe(broker.address) < 5
        # On a connection of its own: a stalled stream's connection is closed.
        reader_channel = stack.enter_context(grpc.insecure_channel(broker.address, options=BIG))
        reader = pb_grpc.BrokerStub(reader_channel).PullStream(
            pb.PullStreamRequest(topic="s", queue_id=0, batch_bytes=MiB, end_offset=64),
            timeout=60,
        )
        assert sum(reply.count for reply in reader) == 64
        for stream in unread:
            stream.cancel()
    assert "(stream_send_timeout_ms)" in broker.log_since_start()


# -- many calls per connection, many parked pulls -------------------------------------


PARK = pb.PullRequest(topic="parked", queue_id=0, offset=0, max_wait_ms=60_000)


@pytest.mark.timeout(120)
def test_calls_over_a_connections_limit_are_refused_not_reset(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    broker = _broker_with(broker_factory, tmp_path, max_streams_per_connection=8)
    with grpc.insecure_channel(broker.address, options=OWN) as channel:
        stub = pb_grpc.BrokerStub(channel)
        calls: list[Any] = [stub.Pull.future(PARK, timeout=60) for _ in range(20)]
        wait_for("the calls over the limit to end", lambda: sum(c.done() for c in calls) >= 12)
        refused = [c for c in calls if c.done()]
        assert len(refused) == 12  # the other eight are parked (for 60 s)
        for call in refused:
            code, details = _error(call)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert "max_streams_per_connection" in details
        assert probe(broker.address) < 5
        for call in calls:
            call.cancel()


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", stream) + payload
    )


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header without indexing (short name and value)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


def raw_streams(address: str, count: int, parked: int) -> collections.Counter[str]:
    """``count`` parking Pull calls opened at once on one connection by a client
    that ignores the server's SETTINGS (HTTP/2 frames by hand); how each ended
    ("refused naming the limit", "RST_STREAM N", ...) once all but ``parked`` did
    (at most 30 s)."""
    host, port = address.rsplit(":", 1)
    headers = b"".join(_literal(k, v) for k, v in [
        (":method", "POST"), (":scheme", "http"), (":path", "/equeue.v1.Broker/Pull"),
        (":authority", address), ("content-type", "application/grpc"), ("te", "trailers"),
    ])  # fmt: skip
    body = PARK.SerializeToString()
    message = b"\x00" + struct.pack(">I", len(body)) + body
    ended: dict[int, str] = {}
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0) + b"".join(
            _frame(1, 4, 2 * n + 1, headers) + _frame(0, 1, 2 * n + 1, message)
            for n in range(count)
        ))  # fmt: skip
        sock.settimeout(0.2)
        buffer = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(ended) < count - parked:
            try:
                buffer += sock.recv(1 << 20)
            except TimeoutError:
                continue
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                size = int.from_bytes(buffer[:3], "big")
                kind, flags = buffer[3], buffer[4]
                stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                payload, buffer = buffer[9 : 9 + size], buffer[9 + size :]
                if kind == 3:
                    ended[stream] = f"RST_STREAM {int.from_bytes(payload, 'big')}"
                elif kind == 1 and flags & 1:  # trailers (their message is sent literally)
                    named = b"max_streams_per_connection" in payload
                    ended[stream] = "refused naming the limit" if named else "other trailers"
    seen = collections.Counter(ended.values())
    seen["open"] = count - len(ended)
    return seen


@pytest.mark.timeout(120)
def test_a_client_ignoring_http2_limits_is_refused_by_the_broker_first(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    """A client that opens 100 streams at once on one connection, whatever the
    server's SETTINGS say: 8 park, the next 24 (to HTTP/2's backstop of four
    times the limit) are refused naming max_streams_per_connection, and only
    the rest are reset by HTTP/2 itself."""
    broker = _broker_with(broker_factory, tmp_path, max_streams_per_connection=8)
    seen = raw_streams(broker.address, 100, parked=8)
    assert seen["open"] == 8, seen
    assert seen["refused naming the limit"] == 24, seen
    assert seen["RST_STREAM 11"] == 100 - 8 - 24, seen  # ENHANCE_YOUR_CALM
    assert probe(broker.address) < 5


@pytest.mark.timeout(120)
def test_parked_pulls_over_the_limit_are_refused_on_every_connection(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    """max_parked_pulls 8 over three connections: the ninth pull is refused
    with RESOURCE_EXHAUSTED naming the setting, wherever it comes from, and a
    slot freed by a cancelled pull is taken again."""
    broker = _broker_with(broker_factory, tmp_path, max_parked_pulls=8)
    with ExitStack() as stack:
        stubs = [pb_grpc.BrokerStub(stack.enter_context(grpc.insecure_channel(
            broker.address, options=OWN))) for _ in range(3)]  # fmt: skip
        parked: list[Any] = [stubs[n % 3].Pull.future(PARK, timeout=60) for n in range(8)]

        def ninth_refused() -> str:
            # A ninth sent before the eight are in parks (and is cancelled) and one
            # of the eight is refused instead: send that one again.
            for n, pull in enumerate(parked):
                if pull.done():
                    parked[n] = stubs[n % 3].Pull.future(PARK, timeout=60)
            return _refused_extra(stubs[0])

        extra = wait_for("eight pulls to park and a ninth to be refused", ninth_refused, 30)
        assert "max_parked_pulls" in extra and "(8 allowed)" in extra, extra
        assert not any(p.done() for p in parked)
        for stub in stubs[1:]:
            assert _refused_extra(stub)
        assert probe(broker.address) < 5
        parked[0].cancel()
        ninth: Any = wait_for("the freed slot", lambda: _parks(stubs[2]), 30)
        ninth.cancel()
        for p in parked:
            p.cancel()


def _refused_extra(stub: pb_grpc.BrokerStub) -> str:
    """The details of a pull's RESOURCE_EXHAUSTED, or "" if it parked (then cancelled)."""
    call: Any = stub.Pull.future(PARK, timeout=30)
    try:
        call.result(timeout=1)
    except grpc.FutureTimeoutError:
        call.cancel()
        return ""
    except grpc.RpcError as exc:
        error: grpc.Call = exc  # type: ignore[assignment]
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
        return error.details() or ""
    raise AssertionError("a parking pull returned")


def _parks(stub: pb_grpc.BrokerStub) -> Any:
    call: Any = stub.Pull.future(PARK, timeout=30)
    try:
        call.result(timeout=1)
    except grpc.FutureTimeoutError:
        return call  # parked
    except grpc.RpcError:
        return None
    return None
