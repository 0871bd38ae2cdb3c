"""The read-only ``monitor`` role: figures without message contents or writes,
on a real broker with a tokens file (and the name server's metrics check)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from equeue_broker.namesrv.auth import may_read_metrics
from equeue_broker.server.auth import MONITOR_METHODS, TokenTable
from equeue_broker.server.tokens import ROLES, Principal
from equeue_broker.testing import BrokerProcess
from equeue_spark.client import (
    Admin,
    ClientConfig,
    PermissionDeniedError,
    Producer,
    read_range,
)

StartBroker = Callable[..., BrokerProcess]

ADMIN, MONITOR, SCOPED, CONSUMER = (
    "admin-secret-0123456789",
    "monitor-secret-01234567",
    "scoped-monitor-secret-0",
    "consumer-secret-0123456",
)
TOKENS = f"""
[[tokens]]
name = "ops"
secret = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "dashboards"
secret = "{MONITOR}"
roles = ["monitor"]

[[tokens]]
name = "team-a"
secret = "{SCOPED}"
roles = ["monitor"]
topics = ["a*"]

[[tokens]]
name = "reader"
secret = "{CONSUMER}"
roles = ["consume"]
"""


def fast(broker: str, token: str) -> ClientConfig:
    return ClientConfig(broker=broker, timeout_s=5, retries=0, token=token)


@pytest.fixture
def secured(broker_factory: StartBroker, tmp_path: Path) -> str:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS)
    path.chmod(0o600)
    broker = broker_factory("--tokens-file", str(path))
    with Producer(config=fast(broker.address, ADMIN)) as producer:
        producer.send_batch("a1", [b"x", b"y"], queue_ids=[0, 0])
        producer.send_batch("b1", [b"z"], queue_ids=[0])
    with Admin(config=fast(broker.address, ADMIN)) as admin:
        admin.commit_offsets("ga", {("a1", 0): 1})
        admin.commit_offsets("gb", {("b1", 0): 0})
    return broker.address


def test_roles_and_what_implies_monitor() -> None:
    assert "monitor" in ROLES
    table = TokenTable.parse(TOKENS, "test")
    monitor = table.lookup(MONITOR)
    admin = table.lookup(ADMIN)
    reader = table.lookup(CONSUMER)
    assert monitor is not None and admin is not None and reader is not None
    assert monitor.may("monitor") and not monitor.may("consume") and not monitor.may("admin")
    assert admin.may("monitor")  # admin has every role but broker
    assert not reader.may("monitor")
    assert may_read_metrics(monitor) and may_read_metrics(admin) and not may_read_metrics(reader)
    broker_only = Principal("b", frozenset({"broker"}), None)
    assert not may_read_metrics(broker_only)
    assert {m.rsplit("/", 1)[1] for m in MONITOR_METHODS} == {
        "GetStats", "ListTopics", "DescribeTopic", "ListGroups", "DescribeGroup",
        "ListTransactions", "GetSchema", "ListOffsets",
    }  # fmt: skip


def test_monitor_reads_figures(secured: str) -> None:
    with Admin(config=fast(secured, MONITOR)) as admin:
        assert admin.stats().topics == 2
        assert sorted(t.name for t in admin.list_topics()) == ["a1", "b1"]
        assert admin.describe_topic("a1").queues[0].end_offset == 2
        assert sorted(admin.list_groups()) == ["ga", "gb"]
        assert admin.describe_group("ga").total_lag == 1
        assert admin.list_offsets("b1")[0].end_offset == 1
        admin.list_transactions()


def test_monitor_reads_no_contents_and_writes_nothing(secured: str) -> None:
    denied = "token 'dashboards' lacks role"
    with Admin(config=fast(secured, MONITOR)) as admin:
        with pytest.raises(PermissionDeniedError, match=f"{denied} 'admin' for GetMessage"):
            admin.get_message_at("a1", 0, 0)
        with pytest.raises(PermissionDeniedError, match=f"{denied} 'admin' for QueryMessages"):
            admin.query_messages("a1", key="k")
        with pytest.raises(PermissionDeniedError, match=f"{denied} 'admin' for ResetOffsets"):
            admin.reset_offsets("ga", "a1", to="earliest")
        with pytest.raises(PermissionDeniedError, match=f"{denied} 'admin' for CreateTopic"):
            admin.create_topic("c1", queues=1)
    with (
        Producer(config=fast(secured, MONITOR)) as producer,
        pytest.raises(PermissionDeniedError, match=f"{denied} 'produce'"),
    ):
        producer.send_batch("a1", [b"no"])
    with pytest.raises(PermissionDeniedError, match=f"{denied} 'consume' for Pull"):
        list(read_range("a1", 0, 0, config=fast(secured, MONITOR)))


def test_a_scoped_monitor_token_sees_its_topics_only(secured: str) -> None:
    with Admin(config=fast(secured, SCOPED)) as admin:
        assert [t.name for t in admin.list_topics()] == ["a1"]
        assert admin.list_groups() == ["ga"]
        assert admin.describe_group("ga").total_lag == 1
        assert admin.stats().topics == 1
        with pytest.raises(PermissionDeniedError, match="may not use topic 'b1'"):
            admin.describe_topic("b1")
        with pytest.raises(PermissionDeniedError, match="may not use group 'gb'"):
            admin.describe_group("gb")


def test_a_consume_token_still_lacks_the_admin_reads(secured: str) -> None:
    with (
        Admin(config=fast(secured, CONSUMER)) as admin,
        pytest.raises(
            PermissionDeniedError, match="token 'reader' lacks role 'admin' for GetStats"
        ),
    ):
        admin.stats()
