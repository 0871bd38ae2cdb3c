"""Reads from replicas and failover as clients see it (docs/cluster.md): a name
server, a master and a replica (manual roles) on 127.0.0.1; routes name both
with their roles; read_from_replicas and Spark's readFromReplicas read from the
replica; the master SIGKILLed, a consumer goes on on the replica, writes and
commits fail clearly; the replica restarted as master is routed to within
seconds and a waiting producer's retry lands there."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

from equeue_broker.namesrv.routes import RouteTable
from equeue_broker.replication.role import MASTER, REPLICA, BrokerRole
from equeue_broker.server.membership import MembershipService
from equeue_broker.server.registration import Registrar
from equeue_broker.storage import Store
from equeue_broker.testing import BrokerProcess, NameServerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.cli import main
from equeue_spark.client import (
    Admin,
    BrokerUnavailable,
    ClientConfig,
    Consumer,
    NotFoundError,
    NotMasterError,
    Producer,
    SendResults,
)
from equeue_spark.client.records import Message
from equeue_spark.spark.errors import InvalidOption
from equeue_spark.spark.options import ReadOptions
from tests.support.waits import wait_for

TOPIC = "orders"


def member(name: str, address: str, role: str, epoch: int, instance: str) -> (
    pb.RegisterBrokerRequest
):  # fmt: skip
    request = pb.RegisterBrokerRequest(
        cluster="c1", broker_name=name, address=address, role=role, epoch=epoch,
        instance_id=instance, replica_id=0 if role == "master" else 1,
    )  # fmt: skip
    request.topics.add(name=TOPIC, queues=[pb.RouteQueue(queue_id=0, writable=True)])
    return request


def test_the_newest_epoch_is_the_routed_master() -> None:
    table = RouteTable(expiry_s=60)
    table.register(member("g", "127.0.0.1:1", "master", 4, "old"))
    table.register(member("g", "127.0.0.1:2", "replica", 4, "r1"))
    table.register(member("g", "127.0.0.1:3", "master", 5, "new"))
    table.register(member("g", "127.0.0.1:1", "master", 4, "old"))  # the deposed one goes on
    (entry,) = table.route(TOPIC).brokers
    assert (entry.address, entry.epoch) == ("127.0.0.1:3", 5)
    assert list(entry.replica_addresses) == ["127.0.0.1:2"]
    routed = {b.address: b.routed_master for b in table.brokers()}
    assert routed == {"127.0.0.1:1": False, "127.0.0.1:2": False, "127.0.0.1:3": True}
    # Same epoch: the member that became master last wins, however often the other registers.
    table.register(member("g", "127.0.0.1:2", "master", 5, "r1"))
    table.register(member("g", "127.0.0.1:3", "master", 5, "new"))
    assert table.route(TOPIC).brokers[0].address == "127.0.0.1:2"


@pytest.mark.timeout(60)
def test_a_role_change_registers_at_once(tmp_path: Path, open_store: Callable[..., Store]) -> None:
    """A failover's role change (BrokerRole.set, from an election's thread)
    reaches the name server at once, not at the next interval (60 s here).
    The name server checks each claim with the registered address, so that
    address serves ``Membership`` from the same role."""
    namesrv = NameServerProcess(tmp_path / "ns")
    namesrv.start()
    role = BrokerRole(REPLICA, "127.0.0.1:1")

    async def learnt_s() -> float:
        member = grpc.aio.server()
        pb_grpc.add_MembershipServicer_to_server(MembershipService("g", "i1", role), member)
        port = member.add_insecure_port("127.0.0.1:0")
        await member.start()
        registrar = Registrar(
            open_store(), [namesrv.address], cluster="c1", broker_name="g",
            address=f"127.0.0.1:{port}", instance_id="i1", interval_s=60, role=role,
        )  # fmt: skip
        registrar.follow()
        running = asyncio.create_task(registrar.run())
        async with grpc.aio.insecure_channel(namesrv.address) as channel:
            stub = pb_grpc.NameServerStub(channel)

            async def seen(wanted: tuple[str, int], within_s: float) -> float:
                started = time.monotonic()
                while time.monotonic() - started < within_s:
                    listed = await stub.ListBrokers(pb.ListBrokersRequest(), timeout=5)
                    if [(b.role, b.epoch) for b in listed.brokers] == [wanted]:
                        return time.monotonic() - started
                    await asyncio.sleep(0.05)
                raise AssertionError(f"the name server never listed {wanted}")

            await seen((REPLICA, 0), 10)
            threading.Thread(
                target=role.set, args=(MASTER, "", 3), kwargs={"why": "a test"}
            ).start()
            elapsed = await seen((MASTER, 3), 10)
        running.cancel()
        await registrar.close()
        await member.stop(None)
        return elapsed

    try:
        assert asyncio.run(learnt_s()) < 2
    finally:
        namesrv.kill()


def test_bad_replica_read_settings_are_refused_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="read_from_replicas needs a cluster"):
        Consumer("127.0.0.1:1", read_from_replicas=True)
    with pytest.raises(ValueError, match="failover_timeout_s must be 0-3600 seconds, got -1"):
        ClientConfig(namesrv="127.0.0.1:1", failover_timeout_s=-1)
    with pytest.raises(InvalidOption, match="readFromReplicas='yes': must be true or false"):
        ReadOptions.parse({"namesrv": "127.0.0.1:1", "topic": "t", "readFromReplicas": "yes"},
                          streaming=False)  # fmt: skip
    with pytest.raises(InvalidOption, match="readFromReplicas='true': needs a cluster"):
        ReadOptions.parse({"broker": "127.0.0.1:1", "topic": "t", "readFromReplicas": "true"},
                          streaming=False)  # fmt: skip
    assert main(["--broker", "127.0.0.1:1", "consume", "t", "--read-from-replicas"]) == 2
    assert "--read-from-replicas needs --namesrv" in capsys.readouterr().err


class Broker:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.admin = pb_grpc.AdminStub(self.channel)

    def stats(self) -> pb.BrokerStats:
        reply: pb.BrokerStats = self.admin.GetStats(pb.GetStatsRequest(), timeout=10)
        return reply

    def consumed(self) -> int:
        return int(self.stats().consumed_total)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[NameServerProcess, BrokerProcess, BrokerProcess]]:
    namesrv = NameServerProcess(tmp_path / "ns", "--broker-expiry-ms", "60000")
    namesrv.start()
    flags = ("--broker-name", "g", "--namesrv", namesrv.address)
    master = BrokerProcess(tmp_path / "master", *flags)
    master.start()
    replica = BrokerProcess(
        tmp_path / "replica", *flags, "--role", "replica", "--master", master.address
    )
    replica.start()
    try:
        yield namesrv, master, replica
    finally:
        for process in (replica, master, namesrv):
            process.kill()


def routed(admin: Admin) -> tuple[str, list[str]] | None:
    """(master, replicas) of group g in the route; None before the topic is registered."""
    try:
        entry = admin.route(TOPIC).entry("g")
    except NotFoundError:  # the registration after a topic change is on its way
        return None
    return entry.address, list(entry.replica_addresses)


def read(consumer: Consumer, count: int, timeout_s: float = 60) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(timeout_s=0.5)
    return got


def values(messages: list[Message]) -> set[bytes]:
    return {m.value for m in messages}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_reads_from_replicas_and_failover(
    group: tuple[NameServerProcess, BrokerProcess, BrokerProcess],
    spark: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    namesrv, master, replica = group
    ns = namesrv.address
    fast = ClientConfig(namesrv=ns, timeout_s=5.0, retries=1, backoff_s=0.05)
    with Admin(config=fast) as admin:
        admin.create_topic(TOPIC, queues=2)
        # Routes name the master and its replica, each with its role.
        wait_for("both members in the route", lambda: routed(admin) == (
            master.address, [replica.address]), 30)  # fmt: skip
        roles = {b.address: (b.role, b.routed_master) for b in admin.cluster_brokers()}
        assert roles == {master.address: ("master", True), replica.address: ("replica", False)}
    assert main(["--namesrv", ns, "cluster", "routes", TOPIC]) == 0
    assert replica.address in capsys.readouterr().out
    assert main(["--namesrv", ns, "cluster", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert any("replica" in line and replica.address in line for line in listed)

    first = [b"first-%d" % i for i in range(40)]
    with Producer(config=fast) as producer:
        producer.send_batch(TOPIC, first)
    m, r = Broker(master.address), Broker(replica.address)
    wait_for("the replica to catch up", lambda: (
        r.stats().log_end_position == m.stats().log_end_position), 30)  # fmt: skip

    # read_from_replicas: everything from the replica, the commit on the master.
    served = m.consumed(), r.consumed()
    with Consumer(config=fast, group="g1", topics=[TOPIC], read_from_replicas=True) as c1:
        assert values(read(c1, 40)) == set(first)
        c1.commit()
    assert (m.consumed(), r.consumed() - served[1]) == (served[0], 40)
    with Admin(config=fast) as admin:
        assert sum(admin.broker_admin("g").fetch_offsets("g1").values()) == 40
    # The CLI's --read-from-replicas: the same, printed.
    argv = ["--namesrv", ns, "consume", TOPIC, "--read-from-replicas", "--max", "40"]
    assert main([*argv, "--timeout", "30"]) == 0
    assert capsys.readouterr().out.count("value=first-") == 40
    assert (m.consumed(), r.consumed() - served[1]) == (served[0], 80)

    # Spark, one batch read with readFromReplicas: every row, served by the replica.
    before = r.consumed()
    rows = (
        spark.read.format("equeue").option("namesrv", ns).option("topic", TOPIC)
        .option("readFromReplicas", "true").option("timeoutMs", "10000").load()
        .select("broker", "value").collect()
    )  # fmt: skip
    assert {bytes(row.value) for row in rows} == set(first) and len(rows) == 40
    assert {row.broker for row in rows} == {"g"}
    assert r.consumed() - before == 40 and m.consumed() == served[0]

    # The master SIGKILLed: a consumer without the option goes on on the replica.
    with Consumer(config=fast, group="g2", topics=[TOPIC]) as first_reader:
        assert values(read(first_reader, 40)) == set(first)
        first_reader.commit()
    second = [b"second-%d" % i for i in range(30)]
    with Producer(config=fast) as producer:
        producer.send_batch(TOPIC, second)
    wait_for("the replica to catch up", lambda: (
        r.stats().log_end_position == m.stats().log_end_position), 30)  # fmt: skip
    master.kill()
    # A consumer of the group that starts now, with the master gone (one kept
    # running through the kill may already hold the second batch: its pulls,
    # parked on the master, were answered before the kill).
    c2 = Consumer(config=fast, group="g2", topics=[TOPIC])
    try:
        before = r.consumed()
        assert values(read(c2, 30)) == set(second)
        assert r.consumed() - before >= 30
        with pytest.raises(BrokerUnavailable, match=r"(?s)no reachable master.*next commit"):
            c2.commit()  # retryable: kept for the next commit

        # No master: writes fail clearly once failover_timeout_s passes.
        no_master = r"broker group 'g' has no reachable master \(waited failover_timeout_s=1;"
        with (
            Producer(config=fast, failover_timeout_s=1.0) as producer,
            pytest.raises(BrokerUnavailable, match=no_master),
        ):
            producer.send_batch(TOPIC, [b"keyed"], keys=[b"k"])
        # A Spark task whose first member (the master) is gone reads the next one.
        from pyspark.sql.types import StructType

        from equeue_spark.spark.arrow import arrow_schema, read_schema
        from equeue_spark.spark.read_task import QueueRange, read_range

        struct = StructType.fromDDL(read_schema(False))
        assert isinstance(struct, StructType)
        with Admin(replica.address) as direct:
            ends = {q.queue_id: q.end_offset for q in direct.list_offsets(TOPIC)}
        tasks = [
            QueueRange(topic=TOPIC, queue_id=q, start=0, end=end, broker=master.address,
                       fallbacks=(replica.address,), timeout_ms=5000, broker_name="g")
            for q, end in ends.items()
        ]  # fmt: skip
        rows = [b for task in tasks for b in read_range(task, arrow_schema(struct))]
        assert sum(batch.num_rows for batch in rows) == 70
        # A write sent to the replica itself is refused as NotMasterError.
        with Admin(replica.address) as direct:
            with Producer(replica.address) as single, pytest.raises(NotMasterError):
                single.send_batch(TOPIC, [b"x"])
            assert direct.stats().role == "replica"

        # A waiting producer: its retries land on the replica restarted as master.
        waiting: Future[SendResults] = Future()

        def send() -> None:
            with Producer(config=fast, failover_timeout_s=60.0) as producer:
                try:
                    waiting.set_result(producer.send_batch(TOPIC, [b"after"], keys=[b"k"]))
                except Exception as exc:  # handed to the test thread
                    waiting.set_exception(exc)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        replica.stop()
        promoted = BrokerProcess(replica.data_dir, "--broker-name", "g", "--namesrv", ns,
                                 log_path=tmp_path / "promoted.log")  # fmt: skip
        promoted.start()
        try:
            started = time.monotonic()
            with Admin(config=fast) as admin:
                wait_for("the route to name the new master", lambda: (
                    admin.route(TOPIC).entry("g").address == promoted.address), 10)  # fmt: skip
            learnt_s = time.monotonic() - started
            assert learnt_s < 5, f"the name server learnt the new master in {learnt_s:.1f} s"
            (result,) = waiting.result(timeout=60)
            assert result.broker_id == "g"
            sender.join(timeout=30)
            c2.commit()  # the commit that failed goes through now, on the new master
            with Admin(promoted.address) as direct:
                committed = direct.fetch_offsets("g2")
                assert sum(committed.values()) == 70
                assert direct.stats().role == "master"
                # c2's member is gone: it moves to the new master and reads on.
                assert values(read(c2, 1)) == {b"after"}
                assert direct.stats().consumed_total >= 1
        finally:
            promoted.kill()
    finally:
        c2.close()
