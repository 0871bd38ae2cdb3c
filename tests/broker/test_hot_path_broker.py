"""The broker's hot paths (issue 31): what they must still do, not how fast.

An in-process broker (its gRPC server on an event loop thread of the test, a
real store, real clients over loopback) so that the test can read the broker's
state: parked pulls, the store's fsync count, the in-sync set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

from equeue_broker.server.generic_handlers import GenericOnly
from equeue_broker.server.handlers import HandlerCache
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import ClientConfig, Producer
from equeue_spark.client.connection import Connection
from tests.support.in_process import InProcessBroker

LONG_WAIT_MS = 20_000
"""A parked pull's wait: far beyond the test's own waits, so that an answer
with records can only come from the append waking it."""


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., InProcessBroker]]:
    brokers: list[InProcessBroker] = []

    def make(**settings: Any) -> InProcessBroker:
        broker = InProcessBroker(tmp_path / f"data-{len(brokers)}", **settings)
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.close()


def wait_until(ready: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:g} s"
        time.sleep(0.005)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_parked_pull_wakes_on_the_append_not_on_a_flush(
    make_broker: Callable[..., InProcessBroker], flush: str
) -> None:
    """The append itself wakes a parked pull: no flush (the interval is an
    hour) happens between them. Async: the append on the loop wakes it
    directly; sync: the committer's durable round does, from its thread."""
    broker = make_broker(flush=flush, flush_interval_ms=3_600_000)
    config = ClientConfig(broker=broker.address, timeout_s=10, retries=0)
    with Connection(config) as conn, Producer(config=config) as producer:
        producer.send_batch("t", [b"first"], queue_ids=[0])  # creates the topic
        fsyncs = broker.store.stats()["fsyncs"]
        request = pb.PullRequest(topic="t", queue_id=0, offset=1, max_wait_ms=LONG_WAIT_MS)
        answer: Future[pb.PullReply] = Future()
        threading.Thread(
            target=lambda: answer.set_result(conn.broker.Pull(request, timeout=60)), daemon=True
        ).start()
        wait_until(lambda: broker.state.waiters.parked == 1, "parked")
        producer.send_batch("t", [b"second"], queue_ids=[0])
        reply = answer.result(timeout=LONG_WAIT_MS / 2000)  # long before the pull's own wait
    assert (reply.count, reply.next_offset) == (1, 2)
    assert broker.state.waiters.parked == 0
    # Sync: one fsync per durable append and none more (no flush ran); async: none.
    assert broker.store.stats()["fsyncs"] - fsyncs == (1 if flush == "sync" else 0)


@pytest.mark.timeout(60)
def test_sync_produce_without_replicas_touches_no_replication_wait(
    make_broker: Callable[..., InProcessBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker without replicas (async replication, the default) answers a
    sync-flush produce once durable on its own disk: the in-sync set's waits
    are never entered, and the reply carries the durable offsets."""
    broker = make_broker(flush="sync")
    insync = broker.state.insync

    def no_wait(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a broker without replicas waited for replicas")

    monkeypatch.setattr(insync, "replicated", no_wait)
    monkeypatch.setattr(insync, "begin", no_wait)
    config = ClientConfig(broker=broker.address, timeout_s=10, retries=0)
    with Producer(config=config) as producer:
        first = producer.send_batch("t", [b"a", b"b"], queue_ids=[0, 0])
        second = producer.send_batch("t", [b"c"] * 3)  # keyless: one queue, round robin
    assert [r.offset for r in first] == [0, 1]
    assert len({r.queue_id for r in second}) == 1
    assert insync.members == [broker.state.instance_id]
    assert broker.store.stats()["durable_position"] == broker.store.log_end
    read = broker.store.read("t", 0, 0)
    assert [m.value for m in read.messages][:2] == [b"a", b"b"]


@pytest.mark.timeout(60)
def test_sync_produce_errors_still_answer_the_call(
    make_broker: Callable[..., InProcessBroker],
) -> None:
    """The loop-side sync path keeps the refusals: a queue that does not exist
    is NOT_FOUND (from the store, before anything is queued), and the broker
    goes on serving."""
    broker = make_broker(flush="sync")
    config = ClientConfig(broker=broker.address, timeout_s=10, retries=0)
    with Producer(config=config) as producer, Connection(config) as conn:
        producer.send_batch("t", [b"a"], queue_ids=[0])
        bad = pb.ProduceRequest(topic="t", queue_ids=[99])
        bad.messages.count = 1
        bad.messages.values = b"x"
        bad.messages.value_lengths.append(1)
        with pytest.raises(grpc.RpcError) as raised:
            conn.broker.Produce(bad, timeout=10)
        assert raised.value.code() in {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT}
        assert [r.offset for r in producer.send_batch("t", [b"b"], queue_ids=[0])] == [1]


def test_handler_cache_rebuilds_only_for_another_handler() -> None:
    built: list[object] = []

    def make(handler: object) -> object:
        built.append(handler)
        return ("wrapped", handler)

    cache = HandlerCache(make)
    first, second = object(), object()
    assert cache.wrap("/m", first) is cache.wrap("/m", first)
    assert cache.wrap("/m", second) == ("wrapped", second)  # e.g. auth's refusal for one call
    assert cache.wrap("/n", first) == ("wrapped", first)
    assert built == [first, second, first]


def test_services_are_added_as_generic_handlers_only() -> None:
    """The generated ``add_*_to_server`` functions add each service twice,
    as a generic handler and as registered methods: only the first reaches
    the server (generic_handlers.GenericOnly)."""

    class Server:
        def __init__(self) -> None:
            self.generic: list[Any] = []

        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            self.generic.extend(handlers)

    server = Server()
    shim = GenericOnly(server)  # type: ignore[arg-type]
    shim.add_generic_rpc_handlers(("broker",))
    shim.add_registered_method_handlers("equeue.v1.Broker", {"Produce": "handler"})
    assert server.generic == ["broker"]
