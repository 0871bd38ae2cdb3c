"""The grpc.health.v1 service per role (issue 26, item 12; docs/operations.md,
"Health checks"), with a real master and replica: a replica, which refuses
writes, says so (``equeue.v1.Broker/writes`` NOT_SERVING) while it serves
reads (``""``, ``equeue.v1.Broker`` and ``equeue.v1.Broker/reads`` SERVING),
and the statuses follow the roles when an operator swaps them (SetRole).
Changes are seen through ``Watch`` streams: no polling, no sleeps."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
WRITES = "equeue.v1.Broker/writes"
ALWAYS = ("", "equeue.v1.Broker", "equeue.v1.Admin", "equeue.v1.Broker/reads")
CALL_S = 30


class Member:
    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.channel = grpc.insecure_channel(broker.address)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.admin = pb_grpc.AdminStub(self.channel)
        self.data = pb_grpc.BrokerStub(self.channel)

    def status(self, service: str) -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        return int(self.health.Check(request, timeout=CALL_S).status)

    def watch(self, service: str) -> Iterator[health_pb2.HealthCheckResponse]:
        request = health_pb2.HealthCheckRequest(service=service)
        stream: Iterator[health_pb2.HealthCheckResponse] = self.health.Watch(request, timeout=60)
        return stream

    def produce(self) -> grpc.StatusCode:
        request = pb.ProduceRequest(
            topic="t", messages=pb.MessageColumns(count=1, values=b"v", value_lengths=[1])
        )
        try:
            self.data.Produce(request, timeout=CALL_S)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            return code
        return grpc.StatusCode.OK


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[Member, Member]]:
    with BrokerProcess(tmp_path / "master", "--broker-name", "g") as master:
        replica = BrokerProcess(
            tmp_path / "replica", "--broker-name", "g", "--role", "replica",
            "--master", master.address,
        )  # fmt: skip
        with replica:
            members = Member(master), Member(replica)
            yield members
            for member in members:
                member.channel.close()


@pytest.mark.timeout(120)
def test_a_replica_reports_its_writes_not_serving_and_follows_its_role(
    group: tuple[Member, Member],
) -> None:
    master, replica = group
    for member in group:
        assert [member.status(name) for name in ALWAYS] == [SERVING] * len(ALWAYS)
    assert master.status(WRITES) == SERVING
    assert replica.status(WRITES) == NOT_SERVING
    assert master.produce() == grpc.StatusCode.OK
    assert replica.produce() == grpc.StatusCode.FAILED_PRECONDITION  # as its health says

    # An operator swaps the roles; each member's Watch sees its writes follow.
    replica_writes, master_writes = replica.watch(WRITES), master.watch(WRITES)
    assert next(replica_writes).status == NOT_SERVING
    assert next(master_writes).status == SERVING
    replica.admin.SetRole(pb.SetRoleRequest(role="master", epoch=1), timeout=CALL_S)
    assert next(replica_writes).status == SERVING
    follow = pb.SetRoleRequest(role="replica", master=replica.broker.address, epoch=1)
    master.admin.SetRole(follow, timeout=CALL_S)
    assert next(master_writes).status == NOT_SERVING
    for stream in (replica_writes, master_writes):
        stream.cancel()  # type: ignore[attr-defined]
    assert replica.produce() == grpc.StatusCode.OK
    assert master.produce() == grpc.StatusCode.FAILED_PRECONDITION
    for member in group:  # reads go on being served on both
        assert [member.status(name) for name in ALWAYS] == [SERVING] * len(ALWAYS)


@pytest.mark.timeout(120)
def test_a_stopping_broker_reports_not_serving_before_it_goes(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data") as broker:
        member = Member(broker)
        overall = member.watch("")
        assert next(overall).status == SERVING
        assert broker.process is not None
        broker.process.send_signal(signal.SIGTERM)  # a clean stop
        assert next(overall).status == NOT_SERVING
        # A Watch is a call in flight: ended here, the broker need not wait its
        # shutdown grace for it.
        overall.cancel()  # type: ignore[attr-defined]
        assert broker.stop() == 0
        member.channel.close()
