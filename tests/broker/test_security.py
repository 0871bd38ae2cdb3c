"""TLS, mutual TLS, token authentication and authorization, on real broker processes.

Certificates come from ``trustme`` (a throwaway CA per test module). Tokens
are given as a TOML file and through ``$EQUEUE_BROKER_TOKENS``.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from equeue_broker.server.auth import TokenTable
from equeue_broker.server.errors import BadRequest
from equeue_broker.testing import BrokerProcess
from equeue_spark.cli import main as cli_main
from equeue_spark.client import (
    Admin,
    AuthenticationError,
    BrokerUnavailable,
    ClientConfig,
    Consumer,
    PermissionDeniedError,
    Producer,
    read_range,
)
from equeue_spark.client.connection import Connection
from equeue_spark.client.transactions import abort_transactions, commit_transactions

StartBroker = Callable[..., BrokerProcess]

ADMIN, ETL, READER, ORDERS = (
    "admin-secret-0123456789",
    "etl-secret-0123456789ab",
    "reader-secret-012345678",
    "orders-writer-secret-01",
)
TOKENS = f"""
[[tokens]]
name = "ops"
secret = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "etl"
sha256 = "{hashlib.sha256(ETL.encode()).hexdigest()}"
roles = ["produce", "consume"]

[[tokens]]
name = "reader"
secret = "{READER}"
roles = ["consume"]

[[tokens]]
name = "orders-writer"
secret = "{ORDERS}"
roles = ["produce", "consume"]
topics = ["orders*"]
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("equeue-client@example.org")
    files = {
        "ca": root / "ca.pem",
        "cert": root / "server.pem",
        "key": root / "server.key",
        "client_cert": root / "client.pem",
        "client_key": root / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return files


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS)
    path.chmod(0o600)
    return path


def fast(broker: str, **kwargs: object) -> ClientConfig:
    return ClientConfig(broker=broker, timeout_s=5, retries=0, **kwargs)  # type: ignore[arg-type]


def test_tls_round_trip_and_plaintext_refused(
    broker_factory: StartBroker, pki: dict[str, Path]
) -> None:
    broker = broker_factory("--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]))
    secure = fast(broker.address, tls_ca=str(pki["ca"]))
    with Producer(config=secure) as producer:
        producer.send_batch("tls", [b"over tls"], queue_ids=[0])
    assert [m.value for b in read_range("tls", 0, 0, config=secure) for m in b] == [b"over tls"]
    with pytest.raises(BrokerUnavailable), Admin(config=fast(broker.address, tls_ca="")) as admin:
        admin.list_topics()  # plaintext client against a TLS port
    # The CLI takes the same settings.
    assert cli_main(["--broker", broker.address, "--tls-ca", str(pki["ca"]), "topics", "list"]) == 0
    assert cli_main(["--broker", broker.address, "--tls-ca", "/nonexistent", "topics", "list"]) == 2


def test_mutual_tls_requires_a_client_certificate(
    broker_factory: StartBroker, pki: dict[str, Path]
) -> None:
    broker = broker_factory(
        "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]),
        "--tls-client-ca", str(pki["ca"]),
    )  # fmt: skip
    with (
        pytest.raises(BrokerUnavailable),
        Admin(config=fast(broker.address, tls_ca=str(pki["ca"]))) as admin,
    ):
        admin.list_topics()
    with_cert = fast(
        broker.address, tls_ca=str(pki["ca"]),
        tls_cert=str(pki["client_cert"]), tls_key=str(pki["client_key"]),
    )  # fmt: skip
    with Admin(config=with_cert) as admin:
        admin.create_topic("mtls", queues=1)
        assert [t.name for t in admin.list_topics()] == ["mtls"]


def test_tokens_roles_and_topic_scopes(broker_factory: StartBroker, tokens_file: Path) -> None:
    broker = broker_factory("--tokens-file", str(tokens_file))
    address = broker.address
    with (
        pytest.raises(AuthenticationError, match="missing or unknown token"),
        Admin(config=fast(address)) as anonymous,
    ):
        anonymous.list_topics()
    with (
        pytest.raises(AuthenticationError),
        Producer(config=fast(address, token="wrong-secret-000000")) as p,
    ):
        p.send_batch("orders", [b"x"])

    with Producer(config=fast(address, token=ETL)) as etl:
        etl.send_batch("orders", [b"o1"], queue_ids=[0])
        etl.send_batch("audit", [b"a1"], queue_ids=[0])
        with pytest.raises(
            PermissionDeniedError, match="token 'etl' lacks role 'admin' for ListTopics"
        ):
            Admin(config=fast(address, token=ETL)).list_topics()

    with (
        Producer(config=fast(address, token=READER)) as reader,
        pytest.raises(
            PermissionDeniedError,
            match=r"token 'reader' lacks role 'produce' for (InitProducer|Produce)",
        ),
    ):
        reader.send_batch("orders", [b"nope"])
    reading = fast(address, token=READER)
    assert [m.value for b in read_range("orders", 0, 0, config=reading) for m in b] == [b"o1"]

    scoped = fast(address, token=ORDERS)
    with Producer(config=scoped) as producer:
        producer.send_batch("orders-eu", [b"eu"], queue_ids=[0])
        with pytest.raises(PermissionDeniedError, match="may not use topic 'audit'"):
            producer.send_batch("audit", [b"sneaky"])
        with pytest.raises(PermissionDeniedError, match="may not use topic 'audit'"):
            list(producer.send_batches("audit", [[b"streamed"]]))  # checked per stream request
    with pytest.raises(PermissionDeniedError, match="may not use topic 'audit'"):
        list(read_range("audit", 0, 0, config=scoped))
    with Consumer(config=scoped, group="g", topics=["orders"], start="earliest") as consumer:
        assert [m.value for m in consumer.poll(timeout_s=5)] == [b"o1"]
        consumer.commit()

    with Admin(config=fast(address, token=ADMIN)) as admin:
        assert sorted(t.name for t in admin.list_topics()) == ["audit", "orders", "orders-eu"]
        assert admin.describe_topic("audit").queues[0].end_offset == 1  # nothing sneaked in

    # Health checks need no token (load balancers and probes have none).
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING

    log = broker.log_path.read_text()
    for secret in (ADMIN, ETL, READER, ORDERS, "wrong-secret-000000"):
        assert secret not in log


def test_tokens_from_the_environment_and_the_clients_env(
    broker_factory: StartBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EQUEUE_BROKER_TOKENS", TOKENS)
    broker = broker_factory()
    monkeypatch.delenv("EQUEUE_BROKER_TOKENS")
    monkeypatch.setenv("EQUEUE_TOKEN", ADMIN)
    with Admin(config=fast(broker.address)) as admin:
        admin.create_topic("from-env", queues=1)
    monkeypatch.setenv("EQUEUE_TOKEN", READER)
    with pytest.raises(PermissionDeniedError), Admin(config=fast(broker.address)) as admin:
        admin.delete_topic("from-env")


def test_bad_token_documents_are_rejected_naming_the_entry() -> None:
    for text, message in [
        ("tokens = 3", "expected one or more"),
        ('[[tokens]]\nname = "a"\nsecret = "short"\nroles = ["admin"]', "at least 16"),
        ('[[tokens]]\nname = "a"\nsecret = "0123456789abcdefg"\nroles = ["root"]', "roles must"),
        ('[[tokens]]\nname = "a"\nsha256 = "xyz"\nroles = ["admin"]', "64 hex digits"),
        ('[[tokens]]\nname = "a"\nsecret = "0123456789abcdefg"\nroles = ["admin"]\nmode = 1',
         "unknown keys mode"),
    ]:  # fmt: skip
        with pytest.raises(BadRequest, match=message):
            TokenTable.parse(text, "tokens.toml")


def test_broker_refuses_to_start_with_a_bad_tokens_file(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tokens]]\nname = 'x'\n")
    with pytest.raises(RuntimeError, match="did not start"):
        broker_factory("--tokens-file", str(bad))
    log = (tmp_path / "broker0.log").read_text()
    assert "cannot start" in log and "give exactly one of secret and sha256" in log


def test_data_files_are_private(broker_factory: StartBroker, tmp_path: Path) -> None:
    data_dir = tmp_path / "private"
    broker = broker_factory(data_dir=data_dir)
    with Producer(broker.address) as producer:
        producer.send_batch("perm", [b"x"], transaction_id="t1")
        producer.send_batch("perm", [b"y"])
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    for path in data_dir.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


@pytest.fixture
def no_token_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("EQUEUE_TOKEN", "EQUEUE_TLS_CA", "EQUEUE_TLS_CERT", "EQUEUE_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield


def test_client_config_hides_secrets(no_token_env: None) -> None:
    config = ClientConfig(broker="h:1", token="super-secret-token", tls_key="/k.pem")
    assert "super-secret-token" not in repr(config) and "/k.pem" not in repr(config)
    assert os.environ.get("EQUEUE_TOKEN") is None and ClientConfig().resolved_token() == ""


def test_spark_connector_passes_token_and_tls(
    spark: object, broker_factory: StartBroker, tokens_file: Path, pki: dict[str, Path]
) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    broker = broker_factory(
        "--tokens-file",
        str(tokens_file),
        "--tls-cert",
        str(pki["cert"]),
        "--tls-key",
        str(pki["key"]),
    )
    common = {"broker": broker.address, "topic": "orders-spark", "tlsCa": str(pki["ca"])}
    frame = spark.createDataFrame([(b"s1",), (b"s2",)], "value binary")
    frame.write.format("equeue").mode("append").options(**common, token=ORDERS).save()
    rows = spark.read.format("equeue").options(**common, token=READER).load().collect()
    assert sorted(r.value for r in rows) == [b"s1", b"s2"]
    with pytest.raises(Exception, match="PERMISSION_DENIED"):
        frame.write.format("equeue").mode("append").options(**common, token=READER).save()


def test_tokens_cannot_touch_each_others_transactions(
    broker_factory: StartBroker, tokens_file: Path
) -> None:
    broker = broker_factory("--tokens-file", str(tokens_file))
    etl, orders = fast(broker.address, token=ETL), fast(broker.address, token=ORDERS)
    with Producer(config=etl) as producer:
        producer.send_batch("orders", [b"etl-staged"], queue_ids=[0], transaction_id="job:1")
    with Producer(config=orders) as producer:
        producer.send_batch("orders", [b"mine"], queue_ids=[0], transaction_id="job:1")
    with Connection(orders) as conn:  # same id, another token: its own transaction only
        assert abort_transactions(conn, prefix="job") == 1
        commit_transactions(conn, [], sink="query-x", batch_id=10**9)  # fences only itself
    with Admin(config=fast(broker.address, token=ADMIN)) as admin:
        listing = admin.list_transactions()
    assert [t.transaction_id for t in listing.transactions] == ["etl@job:1"]
    assert [(s.sink, s.batch_id) for s in listing.sinks] == [("orders-writer@query-x", 10**9)]
    with Connection(etl) as conn:
        commit_transactions(conn, [("job:1", 1)], sink="query-x", batch_id=0)
    assert [m.value for b in read_range("orders", 0, 0, config=etl) for m in b] == [b"etl-staged"]
