"""Transaction check-back across a failover (manual promotion, a name server).

A broker group of a master and a replica registers with a name server. A
producer (its own process) stages a transaction with a producer group on the
master and is SIGKILLed; a second producer of the group, found through the name
server, answers the master's checks "unknown" twice and then "commit". After
the first check (its record copied to the replica) the master is SIGKILLed and
the replica promoted (SetRole): it continues the count the log gave it (it
never starts again at 0), the second producer's stream reconnects to it through
the name server, and the commit becomes visible there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess, NameServerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, read_range
from tests.broker.test_txn_checks import GROUP, TOPIC, WAIT_S, ProducerProcess, producers
from tests.support.waits import wait_for

__all__ = ["producers"]  # the fixture, shared with the broker tests

BROKER = "g1"
CHECK_FLAGS = (
    "--txn-check-after", "1s", "--txn-check-interval", "4s", "--txn-check-max", "10",
    "--flush", "sync", "--broker-name", BROKER, "--register-interval-ms", "300",
)  # fmt: skip


def _open(address: str) -> list[pb.TransactionInfo]:
    with Admin(address) as admin:
        return list(admin.list_transactions().transactions)


def _stats(address: str) -> pb.BrokerStats:
    with Admin(address) as admin:
        return admin.stats()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[NameServerProcess, BrokerProcess, BrokerProcess]]:
    namesrv = NameServerProcess(tmp_path / "ns")
    namesrv.start()
    flags = (*CHECK_FLAGS, "--namesrv", namesrv.address)
    master = BrokerProcess(tmp_path / "m", *flags)
    replica = BrokerProcess(tmp_path / "r", *flags)
    try:
        master.start()
        replica.flags += ["--role", "replica", "--master", master.address]
        replica.start()
        yield namesrv, master, replica
    finally:
        master.kill()
        replica.kill()
        namesrv.kill()


@pytest.mark.timeout(180)
def test_the_promoted_replica_continues_the_checks_and_commits(
    group: tuple[NameServerProcess, BrokerProcess, BrokerProcess],
    producers: Callable[..., ProducerProcess],
) -> None:
    namesrv, master, replica = group
    with Admin(master.address) as admin:
        admin.create_topic(TOPIC, 2)
    target = f"namesrv={namesrv.address}"
    b = producers(target, "--checker", "unknown-then-commit")
    b.expect("READY")
    wait_for("B's stream on the master", lambda: _stats(master.address).check_streams == 1, WAIT_S)
    a = producers(target, "--stage", "TF", "--topic", TOPIC, "--broker", BROKER)
    a.expect("STAGED")
    a.kill()
    wait_for("the first check answered", lambda: len(b.checks()) >= 1, WAIT_S)

    def copied() -> int | None:
        listing = _open(replica.address)
        checks = listing[0].checks if listing else 0
        return checks if checks >= 1 else None

    before = wait_for("the check record on the replica", copied, WAIT_S)
    master.kill()
    with Admin(replica.address) as admin:
        admin.set_role("master", epoch=1)
    [info] = _open(replica.address)
    assert info.checks >= before and info.group == GROUP  # continued, not restarted

    def visible() -> bool:
        config = ClientConfig(broker=replica.address)
        values = [m.value for q in (0, 1) for batch in read_range(TOPIC, q, 0, config=config)
                  for m in batch]  # fmt: skip
        return sorted(values) == sorted(f"m{i}".encode() for i in range(10))

    wait_for("the commit on the new master", visible, 60)
    assert _open(replica.address) == []
    assert len(b.checks()) >= 3  # unknown, unknown, commit: the last from the new master
    assert _stats(replica.address).transaction_checks_answered >= 1
