"""The broker's HTTP listener (``--http-port``): /metrics, /healthz, /readyz on
real broker processes; the exposition parsed by prometheus_client's own parser
and compared with what the Admin RPCs say."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme
from prometheus_client.parser import text_string_to_metric_families

from equeue_broker.server.metrics import METRICS
from equeue_broker.testing import BrokerProcess, NameServerProcess
from equeue_spark.client import Admin, ClientConfig, Producer, read_range
from tests.broker.delayed_support import nack, produce, pull_until
from tests.support.raw_client import RawClient

StartBroker = Callable[..., BrokerProcess]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

MONITOR, PRODUCER, SCOPED = "monitor-secret-0123", "producer-secret-012", "scoped-secret-01234"
TOKENS = f"""
[[tokens]]
name = "dashboards"
secret = "{MONITOR}"
roles = ["monitor"]

[[tokens]]
name = "app"
secret = "{PRODUCER}"
roles = ["produce"]

[[tokens]]
name = "team-a"
secret = "{SCOPED}"
roles = ["monitor", "produce"]
topics = ["a*"]
"""


def get(
    url: str, token: str = "", context: ssl.SSLContext | None = None, method: str = "GET"
) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(url: str, token: str = "", context: ssl.SSLContext | None = None) -> Samples:
    status, body = get(url + "/metrics", token, context)
    assert status == 200, body
    samples: Samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def fast(address: str, token: str = "") -> ClientConfig:
    return ClientConfig(broker=address, timeout_s=5, retries=0, token=token)


def http_url(broker: BrokerProcess, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{broker.http_port()}"


def test_scrape_matches_the_admin_figures(broker_factory: StartBroker) -> None:
    broker = broker_factory("--http-port", "0")
    url = http_url(broker)
    values = [b"v%03d" % i for i in range(30)]
    with Producer(config=fast(broker.address)) as producer:
        producer.send_batch("t", values[:20], queue_ids=[0] * 20)
        producer.send_batch("t", values[20:], queue_ids=[1] * 10)
        producer.send_batch("later", [b"in an hour"], delay_s=3600)
        producer.transaction("tx-1").send_batch("staged", [b"staged"])
    pulled = sum(len(batch) for batch in read_range("t", 0, 0, config=fast(broker.address)))
    assert pulled == 20
    with Admin(config=fast(broker.address)) as admin:
        admin.commit_offsets("g", {("t", 0): 15, ("t", 1): 2})
        group = admin.describe_group("g")
    samples = scrape(url)
    assert value(samples, "equeue_messages_in_total", topic="t") == 30
    assert value(samples, "equeue_messages_out_total", topic="t") == 20
    assert value(samples, "equeue_bytes_in_total", topic="t") >= sum(map(len, values))
    assert value(samples, "equeue_bytes_out_total", topic="t") > 0
    # The delayed message counts once accepted; the staged one only at commit.
    assert value(samples, "equeue_broker_messages_in_total") == 31
    assert value(samples, "equeue_topic_messages", topic="t") == 30
    lag = value(samples, "equeue_group_topic_lag_messages", group="g", topic="t")
    assert lag == group.total_lag == 5 + 8
    for queue in group.queues:
        per_queue = value(
            samples, "equeue_group_lag_messages", group="g", topic="t", queue=str(queue.queue_id)
        )
        assert per_queue == queue.lag
    lag_s = value(samples, "equeue_group_topic_lag_seconds", group="g", topic="t")
    assert abs(lag_s - group.max_lag_ms / 1000) < 10  # the same age, read a moment later
    assert value(samples, "equeue_delayed_pending_messages", topic="later") == 1
    assert value(samples, "equeue_delayed_next_due_timestamp_seconds") > time.time() + 3000
    assert value(samples, "equeue_transactions_open") == 1
    assert value(samples, "equeue_transaction_oldest_age_seconds") >= 0
    assert value(samples, "equeue_broker_role", role="master") == 1
    produced = value(samples, "equeue_rpc_duration_seconds_count", method="Produce", code="OK")
    assert produced >= 2
    assert value(samples, "equeue_fsyncs_total") >= 0
    assert value(samples, "equeue_metrics_folded_label_values", label="topic") == 0
    assert any(name == "process_cpu_seconds_total" for name, _ in samples)
    assert get(url + "/healthz") == (200, "ok\n")
    assert get(url + "/readyz") == (200, "ready\n")
    assert get(url + "/readyz?writes=1") == (200, "ready\n")
    assert get(url + "/nothing")[0] == 404
    assert get(url + "/metrics", method="POST")[0] == 405


def test_every_exported_family_is_in_the_metrics_list(broker_factory: StartBroker) -> None:
    broker = broker_factory("--http-port", "0")
    with Producer(config=fast(broker.address)) as producer:
        producer.send_batch("t", [b"x"])
    _, body = get(http_url(broker) + "/metrics")
    known = {spec.name.removesuffix("_total") for spec in METRICS}
    for family in text_string_to_metric_families(body):
        if family.name.startswith(("process_", "python_")):
            continue
        assert family.name in known, family.name


def test_without_http_port_nothing_listens_nor_loads(broker_factory: StartBroker) -> None:
    broker = broker_factory("--log-format", "json")
    started = [
        json.loads(line)
        for line in broker.log_since_start().splitlines()
        if '"broker_id"' in line and line.startswith("{")
    ]
    assert started and started[-1]["http_port"] is None
    assert started[-1]["http_loaded"] is False
    with pytest.raises(RuntimeError):
        broker.http_port()


def test_tokens_401_403_and_topic_scopes(broker_factory: StartBroker, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    broker = broker_factory("--http-port", "0", "--tokens-file", str(tokens))
    with Producer(config=fast(broker.address, SCOPED)) as producer:
        producer.send_batch("a1", [b"x"])
    with Producer(config=fast(broker.address, PRODUCER)) as producer:
        producer.send_batch("b1", [b"y"])
    url = http_url(broker)
    status, body = get(url + "/metrics")
    assert status == 401 and "bearer token" in body
    assert get(url + "/metrics", "not-a-token")[0] == 401
    status, body = get(url + "/metrics", PRODUCER)
    assert status == 403 and "monitor" in body
    everything = scrape(url, MONITOR)
    assert value(everything, "equeue_messages_in_total", topic="b1") == 1
    scoped = scrape(url, SCOPED)
    assert value(scoped, "equeue_messages_in_total", topic="a1") == 1
    assert not [k for k in scoped if ("topic", "b1") in k[1]]
    assert get(url + "/healthz") == (200, "ok\n")  # probes need no token
    assert get(url + "/readyz")[0] == 200


def test_https_with_the_brokers_certificate(broker_factory: StartBroker, tmp_path: Path) -> None:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    cert, key, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    broker = broker_factory("--http-port", "0", "--tls-cert", str(cert), "--tls-key", str(key))
    context = ssl.create_default_context(cafile=str(ca_file))
    url = http_url(broker, "https")
    samples = scrape(url, context=context)
    assert value(samples, "equeue_broker_role", role="master") == 1
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        get(http_url(broker) + "/healthz")  # plaintext on the TLS port


def test_readyz_writes_on_a_replica(broker_factory: StartBroker) -> None:
    master = broker_factory("--broker-name", "m")
    replica = broker_factory(
        "--http-port", "0", "--role", "replica", "--master", master.address,
        "--broker-name", "m",
    )  # fmt: skip
    url = http_url(replica)
    assert get(url + "/readyz") == (200, "ready\n")
    status, body = get(url + "/readyz?writes=1")
    assert status == 503 and f"replica: writes go to {master.address}" in body
    samples = scrape(url)
    assert value(samples, "equeue_broker_role", role="replica") == 1
    assert value(samples, "equeue_broker_role_changes_total") == 0
    assert not [k for k in samples if k[0] == "equeue_topic_messages"]  # masters only


def test_cardinality_limits_fold_topics(broker_factory: StartBroker, tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("metrics_max_topics = 3\nmetrics_max_series = 4\n")
    broker = broker_factory(
        "--http-port", "0", "--config", str(config), "--default-queues", "1"
    )  # fmt: skip
    with Producer(config=fast(broker.address)) as producer:
        for i in range(5):
            producer.send_batch(f"t{i}", [b"x"] * (i + 1), queue_ids=[0] * (i + 1))
    samples = scrape(http_url(broker))
    topics = {dict(k[1])["topic"] for k in samples if k[0] == "equeue_messages_in_total"}
    assert topics == {"t0", "t1", "t2", "%other"}
    assert value(samples, "equeue_messages_in_total", topic="%other") == 4 + 5
    assert value(samples, "equeue_metrics_folded_label_values", label="topic") == 2
    assert value(samples, "equeue_broker_messages_in_total") == 15
    # 2 series per queue: t0 and t1 fit in 4, t2 is left out whole, t3 and t4 are folded.
    offsets = {dict(k[1])["topic"] for k in samples if k[0] == "equeue_queue_end_offset"}
    assert offsets == {"t0", "t1"}
    assert value(samples, "equeue_metrics_dropped_series", family="queue_offsets") == 2
    assert value(samples, "equeue_topic_messages", topic="t2") == 3  # aggregates complete


def test_name_server_metrics_and_probes(tmp_path: Path) -> None:
    namesrv = NameServerProcess(tmp_path / "ns", "--http-port", "0")
    namesrv.start()
    broker = BrokerProcess(
        tmp_path / "a", "--broker-name", "a", "--namesrv", namesrv.address,
    )  # fmt: skip
    try:
        broker.start()
        url = http_url(namesrv)
        samples = scrape(url)
        assert value(samples, "equeue_namesrv_members", state="live") == 1
        assert value(samples, "equeue_namesrv_member_up", broker="a", role="master") == 1
        assert value(samples, "equeue_namesrv_groups_without_master") == 0
        assert value(samples, "equeue_namesrv_registrations_total", result="accepted") >= 1
        assert get(url + "/healthz") == (200, "ok\n")
        assert get(url + "/readyz") == (200, "ready\n")
    finally:
        broker.stop()
        namesrv.stop()


def test_client_certificates_required_with_tls_client_ca(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1"), ca.issue_cert("scraper@example.org")
    files = {n: tmp_path / f"{n}.pem" for n in ("cert", "key", "ca", "ccert", "ckey")}
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    ca.cert_pem.write_to_path(str(files["ca"]))
    client.cert_chain_pems[0].write_to_path(str(files["ccert"]))
    client.private_key_pem.write_to_path(str(files["ckey"]))
    broker = broker_factory(
        "--http-port", "0", "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
        "--tls-client-ca", str(files["ca"]),
    )  # fmt: skip
    url = http_url(broker, "https")
    anonymous = ssl.create_default_context(cafile=str(files["ca"]))
    with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
        get(url + "/metrics", context=anonymous)
    with_cert = ssl.create_default_context(cafile=str(files["ca"]))
    with_cert.load_cert_chain(str(files["ccert"]), str(files["ckey"]))
    assert value(scrape(url, context=with_cert), "equeue_broker_role", role="master") == 1


def test_an_http_port_in_use_is_one_line_and_exit_3(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "equeue_broker", "--data-dir", str(tmp_path / "data"),
             "--port", "0", "--http-port", str(port)],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()  # refused before touching the data directory


def test_dead_letters_per_group_and_reserved_topics(broker_factory: StartBroker) -> None:
    broker = broker_factory("--http-port", "0")
    client = RawClient(broker.address)
    try:
        produce(client, "orders", [b"a"])

        assert nack(client, "orders", 0, delay_ms=0, max_=1).action == "retry"
        (copy,) = pull_until(client, "%RETRY%billing", 0, 1)
        assert nack(client, "%RETRY%billing", copy.offset, delay_ms=0, max_=1).action == "dlq"
    finally:
        client.close()
    samples = scrape(http_url(broker))
    assert value(samples, "equeue_group_dlq_messages", group="billing") == 1
    assert value(samples, "equeue_group_dlq_resent_messages", group="billing") == 0
    # Group topics are not topic label values: they are summed as %reserved
    # (the retry copy pulled; Nack's own appends count as in: test_metrics_paths.py).
    assert value(samples, "equeue_messages_out_total", topic="%reserved") == 1
    assert not [k for k in samples if ("topic", "%DLQ%billing") in k[1]]


def test_name_server_metrics_need_a_monitor_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    namesrv = NameServerProcess(tmp_path / "ns", "--http-port", "0", "--tokens-file", str(tokens))
    namesrv.start()
    try:
        url = http_url(namesrv)
        assert get(url + "/metrics")[0] == 401
        assert get(url + "/metrics", PRODUCER)[0] == 403
        families = scrape(url, MONITOR)
        assert any(name == "equeue_namesrv_registrations_total" for name, _ in families)
        assert get(url + "/readyz") == (200, "ready\n")
    finally:
        namesrv.stop()
