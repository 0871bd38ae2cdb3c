"""The name server (equeue-namesrv) and brokers registering with it (--namesrv)."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from equeue_broker.namesrv.routes import Limits, NameServerError, RouteTable
from equeue_broker.testing import BrokerProcess, NameServerProcess
from equeue_proto.protocol import route_queues
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client import Admin


def registration(name: str, *topics: tuple[str, int], address: str = "127.0.0.1:1") -> (
    pb.RegisterBrokerRequest
):  # fmt: skip
    request = pb.RegisterBrokerRequest(cluster="c1", broker_name=name, address=address)
    for topic, queues in topics:
        request.topics.add(
            name=topic, incarnation=7,
            queues=[pb.RouteQueue(queue_id=q, writable=True, readable=True) for q in range(queues)],
        )  # fmt: skip
    return request


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the route table ----------------------------------------------------------------


def test_route_lists_brokers_by_name_and_replaces_snapshots() -> None:
    table = RouteTable(expiry_s=10)
    table.register(registration("b", ("orders", 2)))
    table.register(registration("a", ("orders", 3), ("other", 1)))
    route = table.route("orders")
    assert [b.broker_name for b in route.brokers] == ["a", "b"]
    pairs = [(b.broker_name, [q.queue_id for q in b.queues]) for b in route.brokers]
    assert route_queues(pairs) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    table.register(registration("a", ("other", 1)))  # orders deleted on a
    assert [b.broker_name for b in table.route("orders").brokers] == ["b"]
    with pytest.raises(NameServerError) as caught:
        table.route("missing")
    assert caught.value.code == grpc.StatusCode.NOT_FOUND


def test_silent_brokers_expire_and_unregister_needs_the_same_address() -> None:
    clock = Clock()
    table = RouteTable(expiry_s=10, clock=clock)
    table.register(registration("a", ("t", 1)))
    clock.now += 5
    table.register(registration("b", ("t", 1)))
    clock.now += 6
    assert [b.broker_name for b in table.brokers()] == ["b"]
    assert not table.unregister("b", 0, "10.0.0.1:5")  # a different process's address
    assert table.unregister("b", 0, "127.0.0.1:1")
    assert table.brokers() == []


def test_bad_registrations_are_refused_naming_the_value() -> None:
    table = RouteTable(expiry_s=10, limits=Limits(max_brokers=2, max_topics_per_broker=2,
                                                  max_queues_per_topic=4))  # fmt: skip
    cases = [
        (registration("a b"), grpc.StatusCode.INVALID_ARGUMENT, "'a b'"),
        (registration("a", address="nope"), grpc.StatusCode.INVALID_ARGUMENT, "'nope'"),
        (registration("a", ("t", 5)), grpc.StatusCode.RESOURCE_EXHAUSTED, "max_queues_per_topic"),
        (registration("a", ("t", 1), ("u", 1), ("v", 1)), grpc.StatusCode.RESOURCE_EXHAUSTED,
         "max_topics_per_broker"),
    ]  # fmt: skip
    for request, code, text in cases:
        with pytest.raises(NameServerError) as caught:
            table.register(request)
        assert caught.value.code == code and text in str(caught.value)
    table.register(registration("a"))
    table.register(registration("b"))
    with pytest.raises(NameServerError, match="max_brokers"):
        table.register(registration("c"))
    table.register(registration("a", ("t", 1)))  # a known broker may always re-register


# -- processes -------------------------------------------------------------------------


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []

    def start(kind: str, *flags: str) -> BrokerProcess:
        if kind == "namesrv":
            process: BrokerProcess = NameServerProcess(tmp_path / f"ns{len(started)}", *flags)
        else:
            process = BrokerProcess(tmp_path / f"broker{len(started)}", *flags)
        process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def stub(address: str) -> pb_grpc.NameServerStub:
    return pb_grpc.NameServerStub(grpc.insecure_channel(address))


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def brokers_on(address: str) -> list[str]:
    reply = stub(address).ListBrokers(pb.ListBrokersRequest(), timeout=5)
    return [b.broker_name for b in reply.brokers]


@pytest.mark.timeout(120)
def test_namesrv_process_ready_line_health_and_clean_stop(
    processes: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    namesrv = processes("namesrv")
    assert namesrv.address.startswith("127.0.0.1:")
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(namesrv.address))
    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert brokers_on(namesrv.address) == []
    # A port in use: exit 3; a bad flag: exit 2 with one line naming it.
    taken = subprocess.run(
        [sys.executable, "-m", "equeue_broker.namesrv", "--port", str(namesrv.port)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert taken.returncode == 3, taken.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "equeue_broker.namesrv", "--broker-expiry-ms", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "broker_expiry_ms must be positive" in bad.stderr
    config = tmp_path / "ns.toml"
    config.write_text('broker-expiry-ms = "soon"\n')
    bad_file = subprocess.run(
        [sys.executable, "-m", "equeue_broker.namesrv", "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad_file.returncode == 2 and "broker_expiry_ms" in bad_file.stderr
    assert namesrv.stop() == 0
    assert "stopped cleanly" in namesrv.log_since_start()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_brokers_register_with_every_namesrv_and_expire(
    processes: Callable[..., BrokerProcess],
) -> None:
    ns = [processes("namesrv", "--broker-expiry-ms", "1500") for _ in range(2)]
    namesrv = ",".join(n.address for n in ns)
    flags = ("--namesrv", namesrv, "--register-interval-ms", "200", "--cluster", "east")
    a = processes("broker", "--broker-name", "a", *flags)
    b = processes("broker", "--broker-name", "b", *flags)
    plain = processes("broker")  # no --namesrv: registers nowhere
    for n in ns:  # registered before the ready line
        assert brokers_on(n.address) == ["a", "b"]
    listed = stub(ns[0].address).ListBrokers(pb.ListBrokersRequest(cluster="east")).brokers
    assert [(e.broker_name, e.address, e.cluster) for e in listed] == [
        ("a", a.address, "east"), ("b", b.address, "east")
    ]  # fmt: skip
    # A topic change reaches every name server at once (well within the interval).
    with Admin(a.address) as admin:
        admin.create_topic("orders", queues=2)
    with Admin(b.address) as admin:
        admin.create_topic("orders", queues=3)
    with Admin(plain.address) as admin:
        admin.create_topic("orders", queues=1)

    def route(address: str) -> list[tuple[str, int]]:
        try:
            reply = stub(address).GetRoute(pb.GetRouteRequest(topic="orders"), timeout=5)
        except grpc.RpcError:
            return []
        return route_queues(
            [(e.broker_name, [q.queue_id for q in e.queues]) for e in reply.brokers]
        )

    for n in ns:
        wait_for(functools.partial(lambda a: len(route(a)) == 5, n.address), 5)
    # Message ids name the broker by its name.
    with Admin(a.address) as admin:
        assert admin.stats().broker_id == "a"
    # SIGKILL: no goodbye, the name servers drop it after the expiry.
    a.kill()
    for n in ns:
        wait_for(functools.partial(lambda a: brokers_on(a) == ["b"], n.address), 10)
    assert route(ns[0].address) == [("b", 0), ("b", 1), ("b", 2)]
    # Back under its name: its queues come back.
    a.start()
    wait_for(lambda: len(route(ns[1].address)) == 5, 10)
    # A name server restarted knows nothing, then everything after the next registrations.
    ns[0].kill()
    ns[0].start()
    wait_for(lambda: brokers_on(ns[0].address) == ["a", "b"], 10)
    # SIGTERM: the broker unregisters at once.
    assert b.stop() == 0
    assert brokers_on(ns[1].address) == ["a"]
