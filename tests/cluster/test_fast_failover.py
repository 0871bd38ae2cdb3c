"""A dead master is replaced without waiting for its ZooKeeper session; a paused
one is not replaced (docs/replication.md, "How a dead master is detected").

The judgement itself (``MasterWatch``, fast tier) against real sockets: a
closed port is refused, a listening one accepted, and a master is reported
only after a reply from it, once per epoch.

Three brokers of one group on the session's ZooKeeper, with a session timeout
(40 s) far beyond any wait here: an election that happens within these tests
can only come from the replicas' report that the master refuses connections
(``liveness.py``), and the logs say it did (``MASTER GONE``, ``FAST FAILOVER``).
A SIGSTOPped master is probed by its replicas (they log that it accepts
connections) and keeps its mastership and epoch after SIGCONT. Each test
starts from the group in sync (the killed member stays down).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import uuid
from collections.abc import Iterator

import grpc
import pytest

from equeue_broker.replication.election import GroupElection
from equeue_broker.replication.liveness import Listening, MasterWatch, probe, split_address
from equeue_broker.testing_group import Group, GroupConfig, Member
from equeue_broker.testing_zk import ZooKeeperProcess
from equeue_proto.v1 import broker_pb2 as pb
from tests.support.waits import wait_for

SESSION_MS = 40_000
"""Longer than every bounded wait below: no session expires during a test."""
WAIT_S = 30.0
TOPIC = "t"


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory, zookeeper: ZooKeeperProcess) -> Iterator[Group]:
    hosts = f"{zookeeper.hosts}/fast-failover-{uuid.uuid4().hex[:8]}"
    config = GroupConfig(session_timeout_ms=SESSION_MS, zk_hosts=hosts, replication="sync")
    with Group(tmp_path_factory.mktemp("fast-failover"), config) as started:
        started.start()
        master = started.wait_master(WAIT_S)
        master.admin().CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=10)
        assert write(master, b"seed")
        yield started


def write(member: Member, value: bytes) -> bool:
    """One message acknowledged by ``member``."""
    request = pb.ProduceRequest(topic=TOPIC, messages=pb.MessageColumns(
        count=1, values=value, value_lengths=[len(value)]))  # fmt: skip
    try:
        member.broker().Produce(request, timeout=10)
    except grpc.RpcError:
        return False
    return True


def logged(member: Member, *parts: str) -> int:
    """How many lines of ``member``'s log since its start hold every one of ``parts``."""
    lines = member.process.log_since_start().splitlines()
    return sum(all(part in line for part in parts) for line in lines)


@pytest.mark.slow
@pytest.mark.timeout(300)  # the first one starts the group: slow under load
def test_a_paused_master_is_not_replaced(group: Group) -> None:
    master = group.in_sync(WAIT_S)
    replicas = [m for m in group.members if m is not master]
    epoch = master.stats().epoch
    probed = "accepts connections"
    before = {r.name: logged(r, master.address, probed) for r in replicas}
    elections = {r.name: logged(r, "MASTER GONE") + logged(r, "FAST FAILOVER") for r in replicas}
    os.kill(master.process.pid, signal.SIGSTOP)
    try:
        # Readiness: each replica noticed this silence and found the master
        # accepting connections (a pause), so it asked for no election.
        for replica in replicas:
            wait_for(
                f"{replica.name} to probe the paused master",
                lambda r=replica: logged(r, master.address, probed) > before[r.name],  # type: ignore[misc]
                WAIT_S,
            )
    finally:
        os.kill(master.process.pid, signal.SIGCONT)
    stats = master.stats(timeout_s=10)
    assert (stats.role, stats.epoch) == ("master", epoch)
    assert write(master, b"after the pause")
    for replica in replicas:
        seen = replica.stats(timeout_s=10)
        assert (seen.role, seen.master, seen.epoch) == ("replica", master.address, epoch)
        after = logged(replica, "MASTER GONE") + logged(replica, "FAST FAILOVER")
        assert after == elections[replica.name], replica.process.log_tail()


@pytest.mark.slow
@pytest.mark.timeout(300)  # the first one starts the group: slow under load
def test_a_killed_master_is_replaced_before_its_session_expires(group: Group) -> None:
    master = group.in_sync(WAIT_S)
    replicas = [m for m in group.members if m is not master]
    epoch = master.stats().epoch
    group.kill(master)
    # Its session lives for 40 s after the kill: only the fast path elects sooner.
    new = group.wait_master(WAIT_S, exclude=[master])
    wait_for(
        "a write acknowledged by the new master", lambda: write(new, b"after the kill"), WAIT_S
    )
    assert new.stats().epoch == epoch + 1
    assert any(logged(r, "MASTER GONE", master.address) for r in replicas)
    assert any(logged(r, "FAST FAILOVER", master.address) for r in replicas)
    other = next(r for r in replicas if r is not new)
    wait_for("the other replica to follow the new master", lambda: following(other, new), WAIT_S)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_master_stopped_cleanly_logs_no_error(group: Group) -> None:
    """SIGTERM: the master leaves the election and its replication streams end;
    the in-sync set it then reports is not published (its publisher is shut
    down) and nothing is logged as an error (it once logged ``on_isr_change
    failed`` with a traceback)."""
    master = group.in_sync(WAIT_S)
    assert master.process.process is not None
    master.close()
    master.process.stop()
    errors = [line for line in master.process.log_since_start().splitlines() if " ERROR " in line]
    assert errors == [], master.process.log_tail()
    group.wait_master(WAIT_S, exclude=[master])


def following(replica: Member, master: Member) -> bool:
    try:
        return replica.stats().master == master.address
    except grpc.RpcError:
        return False


# -- the replica's judgement, on real sockets (fast) --------------------------------------


@pytest.fixture
def ports() -> Iterator[tuple[str, str]]:
    """(an address that listens, an address nothing listens on)."""
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        (host, port), (_, refusing) = listening.getsockname(), closed.getsockname()
        yield f"{host}:{port}", f"{host}:{refusing}"


def test_a_master_refusing_connections_is_reported_once_per_epoch(
    ports: tuple[str, str],
) -> None:
    _, dead = ports
    reports: list[tuple[str, int]] = []
    watch = MasterWatch(lambda master, epoch: reports.append((master, epoch)))

    async def scenario() -> None:
        assert await probe(dead) is Listening.REFUSED
        assert not await watch.broken(dead, 3)  # never answered: proves nothing
        watch.contact(dead, 3)
        assert await watch.broken(dead, 3)
        assert not await watch.broken(dead, 3)  # once per epoch
        watch.contact(dead, 4)
        assert await watch.broken(dead, 4)

    asyncio.run(scenario())
    assert reports == [(dead, 3), (dead, 4)]


def test_a_listening_master_is_not_reported(ports: tuple[str, str]) -> None:
    alive, _ = ports
    reports: list[tuple[str, int]] = []
    watch = MasterWatch(lambda master, epoch: reports.append((master, epoch)))

    async def scenario() -> None:
        assert await probe(alive) is Listening.ACCEPTED
        watch.contact(alive, 1)
        assert not await watch.broken(alive, 1)
        await watch.stalled(alive, 1, 3.5)  # a pause: said, not reported
        assert watch.stall_said

    asyncio.run(scenario())
    assert reports == []
    assert split_address("[::1]:5000") == ("::1", 5000)
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_address("nohost")


# -- the election's side, on a real ZooKeeper (members in this process) -------------------


@pytest.mark.timeout(120)
def test_a_report_removes_only_the_reported_master_of_the_current_epoch(
    zookeeper: ZooKeeperProcess,
) -> None:
    """A wrong report removes nothing; a report about the live master of the
    current epoch removes its znode, electing the in-sync replica at once -- and
    the reported master, alive here, is demoted by its own watch (what a
    REJECTing firewall would cause: no two masters)."""
    hosts = f"{zookeeper.hosts}/fast-report-{uuid.uuid4().hex[:8]}"
    made: list[GroupElection] = []

    def member(broker_id: str) -> GroupElection:
        election = GroupElection(hosts, "g", broker_id, f"{broker_id}:1", lambda: 0,
                                 session_timeout_s=SESSION_MS / 1000)  # fmt: skip
        made.append(election)
        election.start(wait_s=WAIT_S)
        return election

    try:
        a = member("a")
        wait_for("a master", a.is_master, WAIT_S)
        b = member("b")
        wait_for("b to see a", lambda: b.current().master is not None, WAIT_S)
        a.publish_isr(["b"])
        b.master_gone("a:1", 2)  # an epoch that is not the current one
        b.master_gone("x:1", 1)  # not the master
        wait_for("both reports handled", lambda: b.gone_reports_handled == 2, WAIT_S)
        assert b.masters_removed == 0 and a.is_master() and not b.is_master()
        b.master_gone("a:1", 1)
        wait_for("b elected", b.is_master, WAIT_S)
        wait_for("a demoted by its own watch", lambda: not a.is_master(), WAIT_S)
        assert b.masters_removed == 1
        view = b.current()
        assert view.epoch is not None and (view.epoch.epoch, view.epoch.master_id) == (2, "b")
        assert view.isr == ("b",)  # a left the in-sync set with its epoch
    finally:
        for election in made:
            election.close()
