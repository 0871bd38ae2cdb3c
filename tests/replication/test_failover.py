"""Failover with real broker processes on 127.0.0.1 (docs/replication.md,
"Failover"): elections through a real ZooKeeper (a master SIGKILLed and
replaced, its divergent tail truncated when it returns, no unclean election,
ZooKeeper stopped), and manual promotion with ``equeue cluster promote``
(master dead and alive), with epoch fencing."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from equeue_broker.replication.election import BASE_PATH, Layout, read_view
from equeue_broker.replication.follower import StaleReply, check_reply_epoch
from equeue_broker.replication.role import REPLICA, BrokerRole
from equeue_broker.replication.zk_hosts import parse_hosts
from equeue_broker.server.app import broker_id_for
from equeue_broker.storage import Store
from equeue_broker.storage.config import MessageLimits, StorageConfig
from equeue_broker.storage.log.record import MessageBatch
from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_zk import ZooKeeperProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.cli import main
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

GROUP = "g"
CHUNK = str(64 << 10)  # small chunks: a divergent tail spans sealed chunks
SESSION_MS = 2000


class Client(RawClient):
    def records(self, topic: str = "t") -> list[bytes]:
        """Every record of queue 0 of ``topic``, raw, as pulled."""
        out: list[bytes] = []
        offset = 0
        for _ in range(10_000):
            reply = self.broker.Pull(
                pb.PullRequest(topic=topic, queue_id=0, offset=offset, max_messages=10_000,
                               max_bytes=8 << 20),
                timeout=30,
            )  # fmt: skip
            if reply.count == 0:
                return out
            out.append(reply.records)
            offset = reply.next_offset
        raise AssertionError("too many pulls")


def values(tag: str, count: int, size: int = 100) -> list[bytes]:
    return [(b"%s-%d-" % (tag.encode(), i)).ljust(size, b"x") for i in range(count)]


def refused(call: Callable[[], object]) -> str:
    """The details of the FAILED_PRECONDITION ``call`` gets."""
    with pytest.raises(grpc.RpcError) as error:
        call()
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION, error.value.details()
    return error.value.details() or ""


def instance_id(broker: BrokerProcess) -> str:
    return str(broker_id_for(broker.data_dir))  # kept in the data directory


def role(broker: BrokerProcess) -> tuple[str, str, int] | None:
    client = Client(broker.address)
    try:
        stats = client.try_stats()
        return None if stats is None else (stats.role, stats.master, stats.epoch)
    finally:
        client.close()


# -- automatic failover through ZooKeeper ------------------------------------------------


@pytest.fixture
def zk(zookeeper_factory: Callable[[], ZooKeeperProcess]) -> ZooKeeperProcess:
    return zookeeper_factory()  # private: this test stops and restarts it


@pytest.fixture
def kazoo(zk: ZooKeeperProcess) -> Iterator[KazooClient]:
    client = KazooClient(zk.hosts)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


@pytest.mark.slow  # 16 s: three brokers, a kill, an election (make test runs it)
@pytest.mark.timeout(240)
def test_zookeeper_failover(tmp_path: Path, zk: ZooKeeperProcess, kazoo: KazooClient) -> None:
    hosts = f"{zk.hosts}/failover"
    layout = Layout(GROUP, parse_hosts(hosts)[1] + BASE_PATH)
    flags = ("--broker-name", GROUP, "--chunk-size", CHUNK, "--max-message-bytes", "65536",
             "--zookeeper", hosts,
             "--zk-session-timeout-ms", str(SESSION_MS))  # fmt: skip
    a, b, c = (BrokerProcess(tmp_path / name, *flags) for name in "abc")
    brokers = [a, b, c]
    try:
        a.start()
        wait_for("a to be elected", lambda: role(a) == ("master", "", 1), 30)
        b.start()
        c.start()
        ids = {instance_id(x): x for x in brokers}

        def isr() -> set[str]:
            try:
                return set(read_view(kazoo, layout).isr)
            except KazooException:  # reconnecting after ZooKeeper's restart
                return set()

        def caught_up(master: BrokerProcess, *replicas: BrokerProcess) -> bool:
            end = Client(master.address).stats().log_end_position
            return all(Client(r.address).stats().log_end_position == end for r in replicas)

        m = Client(a.address)
        m.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        m.produce("t", values("first", 200))
        wait_for("b and c in sync", lambda: isr() == set(ids) and caught_up(a, b, c), 30)
        assert role(b) == ("replica", a.address, 1)
        assert m.stats().failover == "zookeeper"
        details = refused(lambda: m.admin.SetRole(pb.SetRoleRequest(role="master", epoch=9)))
        assert "fails over through ZooKeeper" in details

        # (c) ZooKeeper stopped: the master keeps serving, nobody changes role,
        # for twice the session timeout.
        zk.stop()
        m.produce("t", values("zk-down", 100))
        deadline = time.monotonic() + 2 * SESSION_MS / 1000
        while time.monotonic() < deadline:
            assert [role(x) for x in brokers] == [
                ("master", "", 1), ("replica", a.address, 1), ("replica", a.address, 1)
            ]  # fmt: skip
            time.sleep(0.2)
        zk.start()  # same port and data: the sessions are restored
        wait_for("b and c in sync again", lambda: isr() == set(ids) and caught_up(a, b, c), 30)

        # (a) The replicas paused while the master takes async writes they never
        # get (over chunk boundaries), then the master SIGKILLed: an in-sync
        # replica becomes master of epoch 2 and takes writes.
        agreed = m.stats().log_end_position
        for x in (b, c):
            os.kill(x.pid, signal.SIGSTOP)
        try:
            for i in range(4):  # quick: the paused replicas must stay in sync
                m.produce("t", values(f"divergent-{i}", 100, 1000))  # ~420 KB
            diverged = m.stats().log_end_position
            assert diverged - agreed > 3 * int(CHUNK)
            killed = time.monotonic()
            a.kill()
        finally:
            for x in (b, c):
                os.kill(x.pid, signal.SIGCONT)
        m.close()

        def new_master() -> BrokerProcess | None:
            return next((x for x in (b, c) if (role(x) or ("",))[0] == "master"), None)

        try:
            promoted = wait_for("a new master", new_master, SESSION_MS / 1000 + 10)
        except AssertionError as exc:  # say why, for a failure seen once on a loaded CI
            raise AssertionError(f"{exc}; ZooKeeper: {read_view(kazoo, layout)}\n"
                                 + "\n".join(f"--- {x.log_path}:\n{x.log_since_start()[-4000:]}"
                                              for x in (b, c))) from None  # fmt: skip
        elected_s = time.monotonic() - killed
        other = c if promoted is b else b
        assert role(promoted) == ("master", "", 2)
        nm = Client(promoted.address)
        nm.produce("t", values("after", 50))
        wait_for("the other replica to follow", lambda: role(other) == ("replica",
                 promoted.address, 2) and caught_up(promoted, other), 30)  # fmt: skip

        # The old master returns: it follows, and cuts exactly its divergent tail
        # (into sealed chunks), then holds the new master's log byte for byte.
        a.start()
        wait_for("a to follow", lambda: role(a) == ("replica", promoted.address, 2), 30)
        wait_for("a to catch up", lambda: caught_up(promoted, a, other), 30)
        cut = re.findall(r"REPLICA TRUNCATES its log from (\d+) to (\d+) \((\d+) bytes lost, "
                         r"into sealed chunks\)", a.log_since_start())  # fmt: skip
        # Where epoch 2 starts: at least the new master's log end when it won
        # the election (ZooKeeper's start_position); its epoch marker may lie a
        # little later, when its follower applied a reply that sat in its socket
        # while it was stopped before the promotion stopped it. The log's marker
        # decides; the byte-for-byte comparison below proves the cut exact.
        epoch = read_view(kazoo, layout).epoch
        assert epoch is not None and epoch.epoch == 2
        assert len(cut) == 1, cut
        start = int(cut[0][1])
        assert agreed <= epoch.start_position <= start < diverged - 2 * int(CHUNK)
        assert cut == [(str(diverged), str(start), str(diverged - start))]
        assert Client(a.address).records() == nm.records() == Client(other.address).records()
        # At most one reply (within one chunk) reached the stopped replicas.
        assert not any(b"divergent-3" in r for r in nm.records())

        # (b) No unclean election: the replicas stop (out of the in-sync set),
        # the master acknowledges a write alone and dies: nobody is elected, and
        # the replicas say why; when it returns it is elected, nothing lost.
        master_id = instance_id(promoted)
        for x in (a, other):
            x.stop()
        wait_for("the in-sync set to be the master alone", lambda: isr() == {master_id}, 30)
        nm.produce("t", values("alone", 20))
        acknowledged = nm.records()
        nm.close()
        promoted.kill()
        for x in (a, other):
            x.start()
        for x in (a, other):
            wait_for(
                "the replica to say why nobody is elected",
                lambda x=x: "no unclean election" in x.log_since_start(),  # type: ignore[misc]
                SESSION_MS / 1000 + 15,
            )
            assert role(x) == ("replica", "", 2)
            refused(lambda x=x: Client(x.address).produce("t", [b"no"]))  # type: ignore[misc]
        promoted.start()
        wait_for("the last in-sync member re-elected", lambda: role(promoted) == ("master", "",
                 3), SESSION_MS / 1000 + 15)  # fmt: skip
        assert Client(promoted.address).records() == acknowledged
        print(f"failover: new master {elected_s:.1f} s after the SIGKILL")
    finally:
        for x in brokers:
            x.kill()


# -- manual promotion and fencing --------------------------------------------------------


@pytest.mark.timeout(180)
def test_manual_promotion_and_fencing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ("--broker-name", GROUP, "--chunk-size", CHUNK, "--max-message-bytes", "65536")
    m = BrokerProcess(tmp_path / "m", *flags)
    m.start()
    follow = ("--role", "replica", "--master", m.address)
    r1, r2 = (BrokerProcess(tmp_path / n, *flags, *follow) for n in ("r1", "r2"))
    brokers = [m, r1, r2]
    try:
        r1.start()
        r2.start()
        mc = Client(m.address)
        mc.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        mc.produce("t", values("first", 100))
        assert mc.stats().failover == "manual"
        end = mc.stats().log_end_position
        wait_for("replicas caught up", lambda: all(Client(x.address).stats().log_end_position
                 == end for x in (r1, r2)), 30)  # fmt: skip
        wait_for("the master to see them", lambda: sum(r.connected and r.lag_bytes == 0
                 for r in mc.stats().replicas) == 2, 30)  # fmt: skip
        members = ",".join(x.address for x in brokers)
        cli = ["--timeout-s", "10", "--retries", "0", "cluster", "promote", GROUP]

        # Master alive: an in-sync replica is promoted (epoch 1); the old master
        # is fenced: a replica of it, refusing writes.
        assert main([*cli, "--brokers", members]) == 0, capsys.readouterr().err
        said = capsys.readouterr().out
        first = next(x for x in (r1, r2) if f"promoted {x.address}" in said)
        assert "epoch 1 (in sync with master" in said, said
        assert role(first) == ("master", "", 1)
        assert role(m) == ("replica", first.address, 1)
        details = refused(lambda: mc.produce("t", [b"no"]))
        assert first.address in details
        fc = Client(first.address)
        fc.produce("t", values("epoch1", 10))
        wait_for("the old master to follow", lambda: Client(m.address).records() ==
                 fc.records(), 30)  # fmt: skip

        # A stale promotion is refused, naming both epochs.
        oc = Client((r2 if first is r1 else r1).address)
        details = refused(
            lambda: oc.admin.SetRole(pb.SetRoleRequest(role="master", epoch=1), timeout=10)
        )
        assert "promote to epoch 1" in details and "seen epoch 1" in details
        oc.close()

        # Master dead: the reachable replica with the greatest log end (said).
        first.kill()
        assert main([*cli, "--brokers", members]) == 0, capsys.readouterr().err
        said = capsys.readouterr().out
        assert f"{first.address}: unreachable" in said
        assert "epoch 2 (no master answered" in said, said
        second = next(x for x in (m, r1, r2) if f"promoted {x.address}" in said)
        sc = Client(second.address)
        sc.produce("t", values("epoch2", 10))
        rest = next(x for x in (m, r1, r2) if x not in (first, second))
        wait_for("the rest to follow", lambda: Client(rest.address).records() == sc.records(), 30)

        # (e) Fencing on the replication stream: a request from a replica that
        # saw a newer epoch deposes this master (it stops taking writes).
        stub = pb_grpc.ReplicationStub(sc.channel)
        ask = pb.ReplicateRequest(position=0, chunk_capacity=int(CHUNK), epoch=2, wait_ms=0)
        reply = next(iter(stub.Replicate(iter([ask]), timeout=10)))
        assert reply.epoch == 2 and reply.data
        newer = pb.ReplicateRequest(position=0, chunk_capacity=int(CHUNK), epoch=3)
        with pytest.raises(grpc.RpcError) as stale:
            list(stub.Replicate(iter([newer]), timeout=10))
        assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert role(second) == ("replica", "", 3)
        refused(lambda: sc.produce("t", [b"no"]))
    finally:
        for x in brokers:
            x.kill()


def test_a_replica_refuses_a_reply_from_an_older_epoch() -> None:
    seen = BrokerRole(REPLICA, "m:1", 4)
    with pytest.raises(StaleReply, match="epoch 3, older than epoch 4"):
        check_reply_epoch(seen, 3)
    check_reply_epoch(seen, 5)
    assert seen.view.epoch == 5


def test_zookeeper_excludes_role_flags() -> None:
    from equeue_broker.server.config import parse_args

    for extra in (["--role", "master"], ["--master", "h:1"]):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--zookeeper", "z:2181", "--broker-name", "g", *extra])
        assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        parse_args(["--zookeeper", "z:2181"])  # no --broker-name
    assert parse_args(["--zookeeper", "z:2181/c", "--broker-name", "g"]).zookeeper == "z:2181/c"


def test_the_epoch_history_is_derived_from_the_log(tmp_path: Path) -> None:
    """Markers survive a restart through the checkpoint, and are rebuilt from
    the log alone when the checkpoint is gone."""
    config = StorageConfig(
        tmp_path, chunk_capacity_bytes=64 << 10, limits=MessageLimits(max_message_bytes=4096)
    )
    with Store(config, background=False) as store:
        store.create_topic("t", 1)
        store.write_epoch_marker(1)
        for i in range(40):  # rolls chunks: the markers lie in sealed ones
            store.append("t", 0, MessageBatch(values(f"e1-{i}", 10, 400)))
        start = store.log_end
        store.write_epoch_marker(2)
        store.append("t", 0, MessageBatch(values("e2", 3)))
        assert store.epochs.entries() == [(1, 0), (2, start)]
        assert store.epochs.end_of(1) == start and store.epochs.end_of(2) is None
    with Store(config, background=False) as store:
        assert store.epochs.entries() == [(1, 0), (2, start)]
    for name in ("checkpoint.json", "checkpoint.json.bak"):
        (tmp_path / name).unlink(missing_ok=True)
    with Store(config, background=False) as store:
        assert store.epochs.entries() == [(1, 0), (2, start)]
        assert store._state.log.chunks[0].sealed
