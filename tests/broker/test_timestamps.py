"""Message timestamps in a produce request: given, or left to the broker per message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, Producer
from equeue_spark.client.errors import InvalidRequest


@pytest.fixture(params=["c", "python"])
def codec_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker encoding records in C, or with the pure-Python reference encoder."""
    env = {"EQUEUE_PURE_PYTHON": "1"} if request.param == "python" else {}
    broker = BrokerProcess(tmp_path / "data", env=env)
    broker.start()
    yield broker
    broker.kill()


def test_missing_timestamps_get_the_store_time(codec_broker: BrokerProcess) -> None:
    """A None timestamp (-1 on the wire) is the broker's store time, in either
    encoder; given ones are kept."""
    with Admin(codec_broker.address) as admin:
        admin.create_topic("ts", queues=1)
    given = 1_600_000_000_123
    with Producer(codec_broker.address) as producer:
        producer.send_batch("ts", [b"none", b"given", b"none2"], timestamps_ms=[None, given, None])
    with Admin(codec_broker.address) as admin:
        none, kept, none2 = (admin.get_message_at("ts", 0, offset) for offset in range(3))
    assert kept.timestamp_ms == given
    for message in (none, none2):
        assert message.timestamp_ms == message.store_timestamp_ms > given


def test_a_timestamp_below_minus_one_is_refused(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer, pytest.raises(InvalidRequest, match="holds -2"):
        producer.send_batch("ts", [b"v"], timestamps_ms=[-2])
