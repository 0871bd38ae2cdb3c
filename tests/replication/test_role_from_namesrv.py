"""A member of a group run without ZooKeeper that missed a promotion (down
while ``equeue cluster promote`` ran) learns the new master from the name
servers' registration reply (docs/replication.md, "Failover: manual"): an
old master restarted with its old flags steps down before its ready line
and truncates its unreplicated tail; a replica restarted with its old
``--master`` follows the new master. Real processes on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import grpc
import pytest

from equeue_broker.testing import BrokerProcess, NameServerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli import main
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

GROUP = "g"


def values(tag: str, count: int) -> list[bytes]:
    return [b"%s-%d" % (tag.encode(), i) for i in range(count)]


def stats(broker: BrokerProcess) -> pb.BrokerStats:
    client = RawClient(broker.address)
    try:
        return client.stats()
    finally:
        client.close()


def role(broker: BrokerProcess) -> tuple[str, str, int]:
    s = stats(broker)
    return s.role, s.master, s.epoch


def records(broker: BrokerProcess) -> bytes:
    """Every record of the topic's one queue, raw, as pulled."""
    client = RawClient(broker.address)
    out, offset = b"", 0
    try:
        for _ in range(1000):  # bounded: each pull returns at least one record or ends
            reply = client.broker.Pull(
                pb.PullRequest(topic="t", queue_id=0, offset=offset, max_messages=10_000,
                               max_bytes=8 << 20), timeout=10)  # fmt: skip
            if reply.count == 0:
                return out
            out, offset = out + reply.records, reply.next_offset
        raise AssertionError("the queue never ended")
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_members_that_missed_a_promotion_learn_it_from_the_name_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = NameServerProcess(tmp_path / "ns")
    ns.start()
    # Small chunks: a reply holds at most one chunk of the log.
    flags = ("--broker-name", GROUP, "--namesrv", ns.address, "--register-interval-ms", "500",
             "--chunk-size", str(1 << 20), "--max-message-bytes", "65536")  # fmt: skip
    m = BrokerProcess(tmp_path / "m", *flags)
    brokers = [m]
    try:
        m.start()
        old_master = m.address
        r1, r2 = (BrokerProcess(tmp_path / n, *flags, "--role", "replica", "--master", old_master)
                  for n in ("r1", "r2"))  # fmt: skip
        brokers += [r1, r2]
        r1.start()
        r2.start()
        mc = RawClient(m.address)
        mc.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        mc.produce("t", values("first", 50))
        end = mc.stats().log_end_position
        wait_for("replicas caught up", lambda: all(stats(x).log_end_position == end
                 for x in (r1, r2)), 30)  # fmt: skip

        # r2 goes down; the master takes writes (async) that r1, stopped, gets
        # at most one reply of (at most 1 MiB), then dies.
        r2.kill()
        os.kill(r1.pid, signal.SIGSTOP)
        try:
            for i in range(6):
                mc.produce("t", [b"tail-%d-" % i + bytes(50_000)] * 10)
            old_end = mc.stats().log_end_position
        finally:
            m.kill()
            os.kill(r1.pid, signal.SIGCONT)
        mc.close()

        # The operator promotes the one member it can reach.
        cli = ["--timeout-s", "10", "--retries", "0", "cluster", "promote", GROUP]
        assert main([*cli, "--brokers", r1.address]) == 0, capsys.readouterr().err
        assert role(r1) == ("master", "", 1)
        assert stats(r1).role_reason == "SetRole: promoted to epoch 1"
        rc = RawClient(r1.address)
        rc.produce("t", values("epoch1", 10))
        rc.close()
        agreed = records(r1)
        new_end = stats(r1).log_end_position
        assert new_end < old_end - (1 << 20)  # the old master has a tail to cut

        # The old master, restarted with its old flags, is a replica of r1
        # from its ready line on (its first registration's reply said so).
        m.start()
        assert role(m) == ("replica", r1.address, 1)
        assert "DEPOSED: the name servers route group g to" in m.log_since_start()
        why = f"the name servers route group g to {r1.address} (epoch 1)"
        assert stats(m).role_reason == why
        assert main(["--broker", m.address, "stats"]) == 0
        assert re.search(
            rf"^role since +\S+ \S+ \({re.escape(why)}\)$", capsys.readouterr().out, re.M
        )
        with pytest.raises(grpc.RpcError) as refused:
            RawClient(m.address).produce("t", [b"no"])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        wait_for("the old master to truncate and follow",
                 lambda: stats(m).log_end_position == new_end, 30)  # fmt: skip
        assert records(m) == agreed and b"epoch1-9" in agreed
        assert "REPLICA TRUNCATES its log" in m.log_since_start()

        # The replica that was down, restarted following the dead old master.
        r2.start()
        assert role(r2) == ("replica", r1.address, 1)
        wait_for("the returning replica to follow", lambda: records(r2) == agreed, 30)
    finally:
        for x in brokers:
            x.kill()
        ns.kill()
