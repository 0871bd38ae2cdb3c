"""A real Prometheus (Debian's ``prometheus``) scrapes a real cluster: two
name servers, broker group ``a`` (master + replica) and ``b``, every process
with ``--http-port 0``. Its query API must agree with the operator's view
(``equeue groups describe --json``, run as a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_spark.client import Admin, ClientConfig, NotFoundError, Producer
from tests.support.observability import PrometheusProcess, require_prometheus, values
from tests.support.waits import wait_for

# Above the sum of the internal bounded waits (starts, routes, each Prometheus wait_for).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

EQUEUE = Path(sys.executable).parent / "equeue"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, BrokerProcess]]:
    require_prometheus()  # before starting anything
    started = LocalCluster(tmp_path / "cluster", broker_flags=("--http-port", "0"),
                           namesrv_flags=("--http-port", "0"))  # fmt: skip
    try:
        started.start(namesrvs=2, brokers=("a", "b"))
        master = started.brokers["a"]
        replica = BrokerProcess(
            tmp_path / "cluster" / "broker-a-replica", "--broker-name", "a",
            "--namesrv", started.namesrv, "--role", "replica", "--master", master.address,
            "--http-port", "0",
        )  # fmt: skip
        replica.start()
        try:
            yield started, replica
        finally:
            replica.stop()
    finally:
        started.stop()


def describe(namesrv: str, group: str) -> dict[str, object]:
    done = subprocess.run(
        [str(EQUEUE), "--namesrv", namesrv, "--timeout-s", "10", "groups", "describe", group,
         "--json"],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    document: dict[str, object] = json.loads(done.stdout)
    return document


def test_prometheus_scrapes_the_cluster(
    cluster: tuple[LocalCluster, BrokerProcess], tmp_path: Path
) -> None:
    local, replica = cluster
    a, b = local.brokers["a"], local.brokers["b"]
    processes = [*local.namesrvs, a, b, replica]
    targets = [f"127.0.0.1:{p.http_port()}" for p in processes]
    with Admin(namesrv=local.namesrv) as admin:
        admin.create_topic("orders", 2)

        def routed() -> bool:  # the brokers register the new topic on their own time
            try:
                return len(admin.route("orders").queues()) == 4
            except NotFoundError:
                return False

        wait_for("orders routed to both groups", routed, 30)
    with Producer(config=ClientConfig(namesrv=local.namesrv, timeout_s=10)) as producer:
        for i in range(40):
            producer.send("orders", b"order-%d" % i)
    for broker, offsets in ((a, {("orders", 0): 3}), (b, {("orders", 1): 1})):
        with Admin(config=ClientConfig(broker=broker.address, timeout_s=10)) as direct:
            direct.commit_offsets("g", offsets)
    expected = describe(local.namesrv, "g")["total_lag"]
    assert isinstance(expected, int) and 0 < expected < 40

    with PrometheusProcess(tmp_path / "prometheus", targets, scrape_s=1.0) as prometheus:
        prometheus.wait_for("up == 1", lambda r: len(r) == len(targets))
        lag = prometheus.wait_for(
            'sum(equeue_group_topic_lag_messages{group="g"})',
            lambda r: values(r) == [expected],
        )
        assert values(lag) == [expected]
        # Masters only: the replica of ``a`` does not export the group's lag.
        by_instance = prometheus.query(
            'count by (instance) (equeue_group_topic_lag_messages{group="g"})'
        )
        assert {s["metric"]["instance"] for s in by_instance} == {
            f"127.0.0.1:{a.http_port()}", f"127.0.0.1:{b.http_port()}",
        }  # fmt: skip
        connected = prometheus.wait_for("equeue_replica_connected == 1", lambda r: len(r) == 1)
        assert connected[0]["metric"]["broker"] == "a"
        prometheus.wait_for(
            'equeue_broker_role{role="replica"} == 1',
            lambda r: [s["metric"]["instance"] for s in r] == [f"127.0.0.1:{replica.http_port()}"],
        )
        members = prometheus.wait_for(
            'equeue_namesrv_members{state="live"}', lambda r: values(r) == [3.0, 3.0]
        )
        assert {s["metric"]["cluster"] for s in members} == {"DefaultCluster"}
        b_target = f"127.0.0.1:{b.http_port()}"
        b.kill()
        prometheus.wait_for(f'up{{instance="{b_target}"}} == 0', lambda r: len(r) == 1, 15)


def test_prometheus_scrapes_https_with_a_monitor_token(tmp_path: Path) -> None:
    require_prometheus()
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    cert, key, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[tokens]]\nname = "prometheus"\nsecret = "prometheus-secret-0123"\nroles = ["monitor"]\n'
    )
    tokens.chmod(0o600)
    token_file = tmp_path / "token"
    token_file.write_text("prometheus-secret-0123\n")
    broker = BrokerProcess(
        tmp_path / "broker", "--http-port", "0", "--tls-cert", str(cert), "--tls-key", str(key),
        "--tokens-file", str(tokens),
    )  # fmt: skip
    broker.start()
    try:
        target = f"127.0.0.1:{broker.http_port()}"
        with PrometheusProcess(
            tmp_path / "prometheus", [target], scheme="https", ca_file=ca_file,
            token_file=token_file,
        ) as prometheus:  # fmt: skip
            prometheus.wait_for("up == 1", lambda r: len(r) == 1)
            role = prometheus.wait_for(
                'equeue_broker_role{role="master"}', lambda r: values(r) == [1.0]
            )
            assert role[0]["metric"]["instance"] == target
    finally:
        broker.stop()
