"""The fetch port from the client's side: the wire format's round trips, and a
Spark read task choosing it (same batches as over PullStream), turning it off
(EQUEUE_READ_TRANSPORT=grpc) and falling back to PullStream when it fails.

Real broker processes; the fetch port is given an explicit free port, and the
read task's per-process cache of fetch addresses is seeded with it, so these
tests do not depend on GetStats reporting the address.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from equeue_broker.testing import BrokerProcess
from equeue_proto import fetch
from equeue_spark.client import ClientConfig, Producer
from equeue_spark.client.connection import Connection
from equeue_spark.client.fetch import POOL, FetchUnavailable, Pool, fetch_replies
from equeue_spark.spark import read_task
from equeue_spark.spark.arrow import arrow_schema, read_schema

pytestmark = pytest.mark.timeout(120)

requests = st.builds(
    fetch.FetchRequest,
    topic=st.text(max_size=300),
    queue_id=st.integers(0, 2**32 - 1),
    offset=st.integers(-(2**63), 2**63 - 1),
    end_offset=st.integers(-(2**63), 2**63 - 1),
    batch_messages=st.integers(0, 2**32 - 1),
    batch_bytes=st.integers(0, 2**32 - 1),
    token=st.text(max_size=300),
)


@given(requests)
def test_requests_round_trip(request: fetch.FetchRequest) -> None:
    data = fetch.encode_request(request)
    length = fetch.request_length(data[: fetch.REQUEST_HEAD.size])
    assert length == len(data) - fetch.REQUEST_HEAD.size
    assert fetch.decode_request(data[fetch.REQUEST_HEAD.size :]) == request


@given(
    st.integers(0, 16),
    st.text(max_size=2000),
    st.lists(st.tuples(st.text(max_size=50), st.text(max_size=50)), max_size=4),
)
def test_error_frames_round_trip(code: int, message: str, trailers: list[tuple[str, str]]) -> None:
    frame = fetch.encode_error(code, message, tuple(trailers))
    kind, length = fetch.read_frame_head(frame[: fetch.FRAME_HEAD.size])
    assert (kind, length) == (fetch.ERROR, len(frame) - fetch.FRAME_HEAD.size)
    assert fetch.decode_error(frame[fetch.FRAME_HEAD.size :]) == (code, message, tuple(trailers))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GET / HTTP/1.1\r\n", "not a fetch request"),
        (fetch.MAGIC + (1 << 20).to_bytes(4, "little"), "the limit is 65536"),
    ],
)
def test_bad_request_heads_are_named(data: bytes, message: str) -> None:
    with pytest.raises(fetch.FetchFormatError, match=message):
        fetch.request_length(data[: fetch.REQUEST_HEAD.size])


def test_bad_request_bodies_and_frames_are_named() -> None:
    body = fetch.encode_request(fetch.FetchRequest("orders", 0, 0, 0, 0, 0))[8:]
    with pytest.raises(fetch.FetchFormatError, match="ends inside the topic"):
        fetch.decode_request(body[:5])
    with pytest.raises(fetch.FetchFormatError, match="bytes after the topic"):
        fetch.decode_request(body + b"x")
    with pytest.raises(fetch.FetchFormatError, match="topic is not UTF-8"):
        fetch.decode_request(b"\0\0\2\0\xff\xfe" + body[-28:])
    with pytest.raises(fetch.FetchFormatError, match="unknown frame kind 9"):
        fetch.read_frame_head(fetch.frame_head(9, 0))
    with pytest.raises(fetch.FetchFormatError, match="malformed error frame"):
        fetch.decode_error(b"\1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fetching(broker_factory: Callable[..., BrokerProcess]) -> Iterator[tuple[BrokerProcess, str]]:
    """A broker with 3,000 records of 1 KiB in queue 0 of ``orders``, its fetch
    port's address, and the read task's cache told about it (reset after)."""
    port = free_port()
    broker = broker_factory("--fetch-port", str(port))
    with Producer(broker.address) as producer:
        for _ in range(3):
            producer.send_batch("orders", [os.urandom(1024)] * 1000, queue_ids=[0] * 1000)
    address = f"127.0.0.1:{port}"
    forget_fetch_ports()
    read_task._FETCH_ADDRESSES[broker.address] = address
    yield broker, address
    forget_fetch_ports()


def forget_fetch_ports() -> None:
    read_task._FETCH_ADDRESSES.clear()
    read_task._FETCH_BROKER_IDS.clear()
    read_task._FETCH_FAILED.clear()


SPARK_TYPES = {
    "binary": BinaryType, "string": StringType, "int": IntegerType, "long": LongType,
    "timestamp": TimestampType,
}  # fmt: skip


def read_arrow_schema() -> pa.Schema:
    """The read schema's Arrow schema without a Spark session (flat columns only)."""
    columns = [c.strip().split(" ") for c in read_schema(False).split(",")]
    return arrow_schema(StructType([StructField(n, SPARK_TYPES[t]()) for n, t in columns]))


def read_all(broker: BrokerProcess) -> pa.Table:
    return read_all_of(broker, 3000)


def read_all_of(broker: BrokerProcess, end: int) -> pa.Table:
    part = read_task.QueueRange("orders", 0, 0, end, broker.address, 30_000)
    return pa.Table.from_batches(list(read_task.read_range(part, read_arrow_schema())))


def test_a_read_task_over_the_fetch_port_reads_what_pullstream_reads(
    fetching: tuple[BrokerProcess, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, address = fetching
    fetched = read_all(broker)
    assert read_task._FETCH_ADDRESSES[broker.address] == address  # not given up on
    monkeypatch.setenv(read_task.READ_TRANSPORT_ENV, "grpc")
    streamed = read_all(broker)
    assert fetched.num_rows == 3000
    assert fetched.drop_columns(["timestamp"]).equals(streamed.drop_columns(["timestamp"]))
    assert fetched.column("offset").to_pylist() == list(range(3000))


def test_a_fetch_port_that_fails_hands_the_range_to_pullstream_once(
    fetching: tuple[BrokerProcess, str], caplog: pytest.LogCaptureFixture
) -> None:
    broker, _ = fetching
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    read_task._FETCH_ADDRESSES[broker.address] = dead
    with caplog.at_level(logging.WARNING, logger="equeue.spark"):
        table = read_all(broker)
        again = read_all(broker)
    assert table.column("offset").to_pylist() == list(range(3000)) == again["offset"].to_pylist()
    failed = [r for r in caplog.records if "fetch port" in r.getMessage()]
    assert len(failed) == 1 and dead in failed[0].getMessage()
    with Connection(ClientConfig(broker=broker.address)) as conn:
        assert read_task.fetch_address(conn, part()) == ""  # PullStream for a while
    read_task._FETCH_FAILED[broker.address] = 0.0  # the back-off is over: tried again
    assert read_task._FETCH_ADDRESSES[broker.address] == dead


def part(end: int = 3000) -> read_task.QueueRange:
    return read_task.QueueRange("orders", 0, 0, end, "", 30_000)


def test_a_connection_refused_is_fetch_unavailable() -> None:
    with pytest.raises(FetchUnavailable, match="cannot connect"):
        list(fetch_replies(f"127.0.0.1:{free_port()}", "orders", 0, 0, 10, pool=Pool()))


def test_the_fetch_address_is_learned_from_getstats_once_per_process(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory("--fetch-port", "auto")  # any free port, reported in GetStats
    with Producer(broker.address) as producer:
        producer.send_batch("orders", [b"x"] * 10, queue_ids=[0] * 10)
    part = read_task.QueueRange("orders", 0, 0, 10, broker.address, 30_000)
    read_task._FETCH_ADDRESSES.clear()
    try:
        with Connection(ClientConfig(broker=broker.address)) as conn:
            found = read_task.fetch_address(conn, part)
            assert found.startswith("127.0.0.1:") and found != broker.address
            assert {broker.address: found} == read_task._FETCH_ADDRESSES
            tagged = dataclasses.replace(part, tags=("a",))
            assert read_task.fetch_address(conn, tagged) == ""  # tags: PullStream's
        table = read_all_of(broker, 10)
        assert table.column("offset").to_pylist() == list(range(10))
    finally:
        read_task._FETCH_ADDRESSES.clear()


def test_a_broker_with_the_fetch_port_off_is_read_over_pullstream(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory()  # the fetch port is off by default
    with Producer(broker.address) as producer:
        producer.send_batch("orders", [b"x"] * 10, queue_ids=[0] * 10)
    read_task._FETCH_ADDRESSES.clear()
    try:
        assert read_all_of(broker, 10).num_rows == 10
        assert {broker.address: ""} == read_task._FETCH_ADDRESSES
    finally:
        read_task._FETCH_ADDRESSES.clear()


def test_an_error_frame_hands_the_range_to_pullstream(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """A full fetch port (a limit's ERROR frame) is no reason to fail the task."""
    config = tmp_path / "broker.toml"
    config.write_text("max_connections = 1\nhandshake_timeout_ms = 60000\n")
    port = free_port()
    broker = broker_factory("--fetch-port", str(port), "--config", str(config))
    with Producer(broker.address) as producer:
        producer.send_batch("orders", [b"x"] * 100, queue_ids=[0] * 100)
    forget_fetch_ports()
    read_task._FETCH_ADDRESSES[broker.address] = f"127.0.0.1:{port}"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10):  # takes the one slot
            assert read_all_of(broker, 100).column("offset").to_pylist() == list(range(100))
        assert broker.address in read_task._FETCH_FAILED
    finally:
        forget_fetch_ports()


def test_a_pooled_connection_the_broker_closed_is_retried_on_a_new_one(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("max_connection_idle_ms = 300\n")
    port = free_port()
    broker = broker_factory("--fetch-port", str(port), "--config", str(config))
    with Producer(broker.address) as producer:
        producer.send_batch("orders", [b"x"] * 100, queue_ids=[0] * 100)
    address = f"127.0.0.1:{port}"
    forget_fetch_ports()
    read_task._FETCH_ADDRESSES[broker.address] = address
    try:
        with caplog.at_level(logging.WARNING, logger="equeue.spark"):
            assert read_all_of(broker, 100).num_rows == 100
            pooled = POOL._idle[address][-1]
            readable, _, _ = select.select([pooled], [], [], 20)  # the broker's idle close
            assert readable and pooled.recv(1, socket.MSG_PEEK) == b""
            assert read_all_of(broker, 100).num_rows == 100
        assert not [r for r in caplog.records if "fetch port" in r.getMessage()]
        assert not read_task._FETCH_FAILED
    finally:
        forget_fetch_ports()


def test_replies_from_another_broker_drop_the_cached_address(
    fetching: tuple[BrokerProcess, str],
) -> None:
    """The port answers as another broker (the expected one restarted elsewhere):
    nothing of its replies is used, the range is read over PullStream, and the
    address is learned again."""
    broker, _ = fetching
    read_task._FETCH_BROKER_IDS[broker.address] = "another-broker"
    table = read_all(broker)
    assert table.column("offset").to_pylist() == list(range(3000))
    assert broker.address not in read_task._FETCH_ADDRESSES


def test_a_peer_announcing_a_huge_frame_is_fetch_unavailable_before_any_allocation() -> None:
    """Whatever holds the port now (not our broker) cannot make us allocate 1 GiB."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        pool = Pool()
        replies = fetch_replies(address, "orders", 0, 0, 10, batch_bytes=1 << 20, pool=pool)
        peer: list[socket.socket] = []

        def answer() -> None:
            conn, _ = server.accept()
            peer.append(conn)
            conn.sendall(fetch.frame_head(fetch.REPLY, 1 << 30))

        thread = threading.Thread(target=answer)
        thread.start()
        try:
            with pytest.raises(FetchUnavailable, match="a frame of 1073741824 bytes"):
                next(replies)
        finally:
            thread.join(10)
            for conn in peer:
                conn.close()
            pool.close()
