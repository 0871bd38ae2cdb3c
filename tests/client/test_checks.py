"""The client side of check-back and extra keys: what a checker's answer
means, the Producer's arguments, and the ``keys`` header on a real broker."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import ClientConfig, Producer, TransactionResolution, read_range
from equeue_spark.client.checks import resolve
from tests.support.waits import wait_for


class Said(enum.Enum):
    YES = "commit"
    NO = "Rollback"
    WHAT = 3


def _raises(txn_id: str) -> str:
    raise RuntimeError(f"no record of {txn_id}")


@pytest.mark.parametrize(
    ("said", "meant"),
    [
        ("commit", TransactionResolution.COMMIT),
        ("ROLLBACK", TransactionResolution.ROLLBACK),
        (TransactionResolution.COMMIT, TransactionResolution.COMMIT),
        ("unknown", TransactionResolution.UNKNOWN),
        ("maybe", TransactionResolution.UNKNOWN),
        (None, TransactionResolution.UNKNOWN),
        (True, TransactionResolution.UNKNOWN),
        (Said.YES, TransactionResolution.COMMIT),  # the application's own enum
        (Said.NO, TransactionResolution.ROLLBACK),
        (Said.WHAT, TransactionResolution.UNKNOWN),
    ],
)
def test_a_checkers_answer_and_anything_else_is_unknown(said: object, meant: str) -> None:
    assert resolve(lambda _t: said, "t") == meant


def test_a_raising_checker_is_unknown_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert resolve(_raises, "t1") == TransactionResolution.UNKNOWN
    assert "transaction checker raised for t1" in caplog.text


def test_a_checker_needs_a_group() -> None:
    with pytest.raises(ValueError, match="give group= too"):
        Producer("127.0.0.1:1", checker=lambda _t: "commit")


@pytest.mark.parametrize("group", ["orders svc", "x" * 129, "-lead", "a\nb"])
def test_a_bad_group_name_is_refused_by_the_constructor(group: str) -> None:
    with pytest.raises(ValueError, match=r"producer group .* is invalid"):
        Producer("127.0.0.1:1", group=group, checker=lambda _t: "commit")


def test_extra_keys_travel_in_the_keys_header(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer:
        producer.send_batch(
            "k", [b"a", b"b"], queue_ids=[0, 0], extra_keys=[["order-1", b"cust-7"], None],
            headers=[[("region", b"eu")], []],
        )  # fmt: skip
        producer.send("k", b"c", queue_id=0, extra_keys=["order-2"])
        producer.flush()
        with pytest.raises(ValueError, match="has a 'keys' header and extra_keys"):
            producer.send_batch("k", [b"x"], headers=[[("keys", b"a")]], extra_keys=[["b"]])
        with pytest.raises(ValueError, match="holds a space"):
            producer.send("k", b"x", extra_keys=["a b"])
    config = ClientConfig(broker=broker.address)
    got = [m for batch in read_range("k", 0, 0, config=config) for m in batch]
    assert [m.headers for m in got] == [
        (("region", b"eu"), ("keys", b"order-1 cust-7")),
        (),
        (("keys", b"order-2"),),
    ]


TOKENS = """
[[tokens]]
name = "ops"
secret = "ops-secret-0123456789ab"
roles = ["admin"]

[[tokens]]
name = "reader"
secret = "reader-secret-0123456789"
roles = ["consume"]
"""


@pytest.mark.timeout(120)
def test_a_refused_check_stream_is_a_warning_and_the_broker_stays_up(
    broker_factory: Callable[..., BrokerProcess],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS)
    path.chmod(0o600)
    broker = broker_factory("--tokens-file", str(path))
    config = ClientConfig(broker=broker.address, token="reader-secret-0123456789")  # no produce
    with caplog.at_level(logging.WARNING, logger="equeue_spark.client.checks"):
        producer = Producer(config=config, group="svc", checker=lambda _t: "commit")
        try:
            wait_for("the refusal", lambda: "refused the check stream" in caplog.text, 30.0)
            assert "PERMISSION" in caplog.text or "produce" in caplog.text
            assert not producer._routes.is_down(broker.address)
        finally:
            producer.close()
