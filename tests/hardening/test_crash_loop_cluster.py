"""The cluster crash loop of ``hardening/crash_loop_cluster.py``, bounded: two master kills.

A group of three brokers (ZooKeeper failover, ``--replication sync``) under two
raw producers, an idempotent client producer (through the name server) and a
consumer; its master is SIGKILLed twice, each time a new master
takes over and the killed broker rejoins as a replica. At the end every
acknowledged message is in the final master's log exactly once (the client
producer's retries across the failovers appended nothing twice), at its
acknowledged offset, nothing a consumer read is gone, and every member holds
the same log. ``make crash-loop-cluster`` runs 20 kills.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hardening import crash_loop_cluster
from hardening.crash_loop_cluster import ClusterLoopConfig, summary

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)


@pytest.mark.timeout(300)  # above the budgets below: 2 x (30 + 60) s, plus start and end
def test_two_master_kills_lose_and_duplicate_nothing(tmp_path: Path, zk_hosts: str) -> None:
    config = ClusterLoopConfig(
        kills=2, min_run_s=0.5, max_run_s=1.0, zk_hosts=zk_hosts, seed=7,
        failover_timeout_s=30.0, rejoin_timeout_s=60.0,
    )  # fmt: skip
    result = crash_loop_cluster.run(config, tmp_path)
    print(summary(result))
    assert result.all_problems() == []
    assert len(result.kills) == 2
    accounting = result.accounting
    assert accounting is not None
    assert accounting.acked >= 500, "too little traffic to mean anything"
    assert accounting.lost == 0
    assert accounting.duplicated == 0
    assert accounting.duplicated_in_doubt == 0
    assert accounting.client_acked > 0, "the idempotent client producer got nothing through"
    assert accounting.moved == 0
    assert accounting.consumed > 0
    assert all(k.new_master and k.first_ack_s is not None for k in result.kills)
