"""Clients of a secured cluster (docs/cluster.md, "Security and trust"), on
real processes on 127.0.0.1: ``Producer``, ``Consumer``, ``Admin``, the CLI
and Spark send name servers the TLS settings and the token they send brokers
(``connection.open_channel``). A client without a token, or with one whose
topic patterns exclude the topic, gets a final error naming the name server
at once, not ``BrokerUnavailable`` after a retry loop."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from equeue_broker.testing import LocalCluster, local_cluster
from equeue_spark.cli import main
from equeue_spark.client import (
    Admin,
    AuthenticationError,
    BrokerUnavailable,
    ClientConfig,
    Consumer,
    Message,
    NotFoundError,
    PermissionDeniedError,
    Producer,
)
from tests.support.namesrv_tokens import (
    ADMIN_SECRET,
    BROKER_SECRET,
    CLIENT_SECRET,
    SCOPED_SECRET,
    tokens_toml,
)
from tests.support.waits import wait_for

TOKENS = tokens_toml("orders-only", ["produce", "consume"])
# One tokens file for both (brokers ignore the broker role).
NAMESRV_ENV = {"EQUEUE_NAMESRV_TOKENS": TOKENS}
BROKER_ENV = {"EQUEUE_BROKER_TOKENS": TOKENS, "EQUEUE_NAMESRV_TOKEN": BROKER_SECRET}
FAST_REGISTRATION = ("--register-interval-ms", "200")
QUICK_S = 5.0
"""A refusal comes within this: one round trip, not failover_timeout_s (30 s)."""


@pytest.fixture(autouse=True)
def no_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test passes: no token or TLS setting from the environment."""
    for name in ("EQUEUE_TOKEN", "EQUEUE_TLS_CA", "EQUEUE_TLS_CERT", "EQUEUE_TLS_KEY",
                 "EQUEUE_NAMESRV", "EQUEUE_BROKER"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two name servers and brokers a, b, all requiring tokens; topics
    ``orders`` and ``payments`` (2 queues on each broker), routed."""
    with local_cluster(
        2,
        ("a", "b"),
        broker_flags=FAST_REGISTRATION,
        namesrv_env=NAMESRV_ENV,
        broker_env=BROKER_ENV,
    ) as started:
        with Admin(config=config(started, ADMIN_SECRET)) as admin:
            for topic in ("orders", "payments"):
                admin.create_topic(topic, queues=2)
                routed = functools.partial(queue_count, admin, topic, 4)
                wait_for(f"{topic} routed", routed, 30)
        yield started


def queue_count(admin: Admin, topic: str, count: int) -> bool:
    """Whether ``topic``'s route has ``count`` queues (False: not routed yet)."""
    try:
        return len(admin.route(topic).queues()) == count
    except NotFoundError:
        return False


def config(cluster: LocalCluster, token: str, **settings: Any) -> ClientConfig:
    return ClientConfig(namesrv=cluster.namesrv, token=token, timeout_s=10, **settings)


def read(consumer: Consumer, count: int) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(0.5)
    return got


def refused(call: Callable[[], object], error: type[Exception]) -> str:
    """``call``'s error, which must be ``error`` and come quickly; its message."""
    started = time.monotonic()
    with pytest.raises(error) as raised:
        call()
    assert time.monotonic() - started < QUICK_S, f"{error.__name__} took a retry loop"
    return str(raised.value)


@pytest.mark.timeout(180)
def test_clients_with_tokens_produce_and_consume(cluster: LocalCluster) -> None:
    app = config(cluster, CLIENT_SECRET)
    keys = [b"k%d" % i for i in range(40)]
    with Producer(config=app) as producer:
        results = producer.send_batch("orders", [b"v-" + k for k in keys], keys=keys)
    assert {r.broker_id for r in results} == {"a", "b"}  # routed over both groups
    with Consumer(config=app, group="g", topics=["orders"], start="earliest") as consumer:
        got = read(consumer, 40)
        consumer.commit()
    assert sorted(m.key for m in got if m.key) == sorted(keys)
    assert {m.broker_id for m in got} == {"a", "b"}
    with Admin(config=config(cluster, ADMIN_SECRET)) as admin:
        assert sorted(b.broker_name for b in admin.cluster_brokers()) == ["a", "b"]
        assert admin.describe_group("g").total_lag == 0
    # A scoped token reads its own topics' routes.
    with Producer(config=config(cluster, SCOPED_SECRET)) as producer:
        assert len(producer.send_batch("orders", [b"scoped"])) == 1


@pytest.mark.timeout(180)
def test_no_token_or_an_unknown_one_is_refused_at_once(cluster: LocalCluster) -> None:
    for token in ("", "not-a-known-secret-at-all"):
        settings = config(cluster, token)
        with Producer(config=settings) as producer:
            send = functools.partial(producer.send_batch, "orders", [b"x"])
            message = refused(send, AuthenticationError)
        assert "name server 127.0.0.1:" in message and "UNAUTHENTICATED" in message
        assert "--token-file" in message  # says where a token goes
        with Admin(config=settings) as admin:
            refused(functools.partial(admin.route, "orders"), AuthenticationError)
            refused(admin.cluster_brokers, AuthenticationError)
        # A consumer that could read nothing says so when it is made.
        subscribe = functools.partial(Consumer, config=settings, group="g2", topics=["orders"])
        refused(subscribe, AuthenticationError)


@pytest.mark.timeout(180)
def test_a_token_for_other_topics_is_denied_the_route(cluster: LocalCluster) -> None:
    scoped = config(cluster, SCOPED_SECRET)
    with Producer(config=scoped) as producer:
        message = refused(lambda: producer.send_batch("payments", [b"x"]), PermissionDeniedError)
    assert "name server 127.0.0.1:" in message
    assert "may not use topic 'payments'" in message and "PERMISSION_DENIED" in message
    with Admin(config=scoped) as admin:
        refused(lambda: admin.route("payments"), PermissionDeniedError)
        assert len(admin.route("orders").queues()) == 4
    refused(lambda: Consumer(config=scoped, group="g3", topics=["payments"]), PermissionDeniedError)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    started = time.monotonic()
    code = main(["--timeout-s", "10", *args])
    assert time.monotonic() - started < 60
    out, err = capsys.readouterr()
    return code, out, err


def token_file(tmp_path: Path, secret: str) -> str:
    path = tmp_path / f"token-{secret[:5]}"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.mark.timeout(180)
def test_cli_with_a_token_file(
    cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = ("--namesrv", cluster.namesrv)
    app = ("--token-file", token_file(tmp_path, CLIENT_SECRET))
    code, out, err = cli(capsys, *ns, *app, "--json", "cluster", "routes", "orders")
    assert code == 0, err
    assert json.loads(out)["queues"] == [["a", 0], ["a", 1], ["b", 0], ["b", 1]]
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line {i}\n" for i in range(10)))
    code, _, err = cli(capsys, *ns, *app, "produce", "orders", "--file", str(lines))
    assert code == 0, err
    # consume asks the brokers to describe the topic first, an admin call.
    ops = ("--token-file", token_file(tmp_path, ADMIN_SECRET))
    code, out, err = cli(capsys, *ns, *ops, "--json", "consume", "orders", "--group", "cli",
                         "--from", "earliest", "--timeout", "3")  # fmt: skip
    assert code == 0, err
    values = [json.loads(line)["value"] for line in out.splitlines()]
    assert {f"line {i}" for i in range(10)} <= set(values)
    # Without a token: exit 1 at once, naming the name server and the status.
    started = time.monotonic()
    code, _, err = cli(capsys, *ns, "cluster", "routes", "orders")
    assert time.monotonic() - started < QUICK_S
    assert code == 1 and "name server 127.0.0.1:" in err and "UNAUTHENTICATED" in err
    scoped = ("--token-file", token_file(tmp_path, SCOPED_SECRET))
    code, _, err = cli(capsys, *ns, *scoped, "cluster", "routes", "payments")
    assert code == 1 and "PERMISSION_DENIED" in err


def flags(prefix: str, files: tuple[str, str, str]) -> tuple[str, ...]:
    """``PREFIXca CA PREFIXcert CERT PREFIXkey KEY``."""
    return tuple(x for name, file in zip(("ca", "cert", "key"), files, strict=True)
                 for x in (prefix + name, file))  # fmt: skip


@pytest.mark.timeout(240)
def test_tls_and_tokens_to_name_servers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Name servers and brokers with mutual TLS and tokens: one set of client
    settings (CA, client certificate, token) reaches both."""
    ca = trustme.CA()
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "ccert", "ckey")}
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("client@example.org")
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["ccert"]))
    client.private_key_pem.write_to_path(str(files["ckey"]))
    path = {name: str(file) for name, file in files.items()}
    serve = ("--tls-cert", path["cert"], "--tls-key", path["key"], "--tls-client-ca", path["ca"])
    mine = (path["ca"], path["ccert"], path["ckey"])  # the CA, a client certificate and key
    namesrv_flags = (*serve, *flags("--broker-tls-", mine))
    broker_flags = (*serve, *FAST_REGISTRATION, *flags("--namesrv-tls-", mine))
    with local_cluster(
        1,
        ("a",),
        namesrv_flags=namesrv_flags,
        broker_flags=broker_flags,
        namesrv_env=NAMESRV_ENV,
        broker_env=BROKER_ENV,
    ) as secured:
        tls = {"tls_ca": path["ca"], "tls_cert": path["ccert"], "tls_key": path["ckey"]}
        with Admin(config=config(secured, ADMIN_SECRET, **tls)) as admin:
            assert [b.broker_name for b in admin.cluster_brokers()] == ["a"]
            admin.create_topic("t", queues=1)
            wait_for("t routed", functools.partial(queue_count, admin, "t", 1), 30)
            assert admin.route("t").queues() == [("a", 0)]
        app = config(secured, CLIENT_SECRET, **tls)
        with Producer(config=app) as producer:
            producer.send_batch("t", [b"over tls"])
        with Consumer(config=app, group="g", topics=["t"], start="earliest") as consumer:
            assert [m.value for m in read(consumer, 1)] == [b"over tls"]
        # The CLI's TLS options and token file reach the name server too.
        code, out, err = cli(
            capsys, "--namesrv", secured.namesrv, "--tls-ca", path["ca"],
            "--tls-cert", path["ccert"], "--tls-key", path["ckey"],
            "--token-file", token_file(tmp_path, CLIENT_SECRET), "--json", "cluster", "routes", "t",
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(out)["queues"] == [["a", 0]]
        # No client certificate, or plaintext: the name server is not reached.
        for settings in ({"tls_ca": path["ca"]}, {}):
            with Admin(config=config(secured, CLIENT_SECRET, **settings)) as admin:
                message = refused(functools.partial(admin.route, "t"), BrokerUnavailable)
            assert "no name server answers" in message
        # TLS right, no token: the token is what is refused.
        with Admin(config=config(secured, "", **tls)) as admin:
            assert "UNAUTHENTICATED" in refused(lambda: admin.route("t"), AuthenticationError)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_spark_reads_through_a_secured_name_server(spark: Any, cluster: LocalCluster) -> None:
    with Producer(config=config(cluster, CLIENT_SECRET)) as producer:
        producer.send_batch("payments", [b"p%d" % i for i in range(20)])

    def load(token: str) -> Any:
        return (
            spark.read.format("equeue")
            .option("namesrv", cluster.namesrv)
            .option("topic", "payments")
            .option("token", token)
            .load()
        )

    rows = load(CLIENT_SECRET).select("broker", "value").collect()
    assert sorted(r.value for r in rows) == sorted(b"p%d" % i for i in range(20))
    with pytest.raises(Exception, match="PERMISSION_DENIED"):
        load(SCOPED_SECRET).collect()
