"""Only a master aborts idle transactions: a replica's own abort would be a
record the master never wrote, forking the replica's log from the master's
(it then had to truncate, or replication stopped). The replica learns of the
master's aborts from the copied log instead."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, Producer
from tests.support.waits import wait_for

TIMEOUT_MS = 1_500


def _open(address: str) -> set[str]:
    with Admin(address) as admin:
        return {t.transaction_id for t in admin.list_transactions().transactions}


@pytest.mark.timeout(120)
def test_a_replica_never_expires_transactions_itself(tmp_path: Path) -> None:
    flags = ("--transaction-timeout-ms", str(TIMEOUT_MS), "--flush", "sync")
    master = BrokerProcess(tmp_path / "master", *flags)
    replica = BrokerProcess(tmp_path / "replica", *flags)
    try:
        master.start()
        replica.flags += ["--role", "replica", "--master", master.address]
        replica.start()
        with Admin(master.address) as admin:
            admin.create_topic("t", 1)
        with Producer(master.address) as producer:
            for name in ("idle-1", "idle-2", "kept"):
                producer.transaction(name).send_batch("t", [b"x"], queue_ids=[0])
            wait_for("the replica to copy them", lambda: _open(replica.address) >= {"kept"}, 30)
            # keep one alive past several timeouts by staging into it: the
            # replica must not abort it (its idle clock is the master's)
            deadline = time.monotonic() + 3 * TIMEOUT_MS / 1000
            while time.monotonic() < deadline:
                producer.transaction("kept").send_batch("t", [b"y"], queue_ids=[0])
                assert "kept" in _open(replica.address)
                time.sleep(TIMEOUT_MS / 5000)
            wait_for("the master to abort the idle ones", lambda: _open(master.address) == {"kept"})
            wait_for("the replica to follow", lambda: _open(replica.address) == {"kept"}, 30)
            producer.send_batch("t", [b"after"], queue_ids=[0])
        with Admin(master.address) as m, Admin(replica.address) as r:
            end = m.stats().log_end_position
            wait_for("the replica to catch up", lambda: r.stats().log_end_position == end, 30)
    finally:
        master.stop()
        replica.stop()
    log = replica.log_since_start()
    assert "TRUNCATES" not in log and "REPLICATION STOPPED" not in log, log[-2000:]
    assert "aborting" not in log, log[-2000:]
