"""Plots from a real Prometheus (``--prometheus``): a broker with its metrics
port, Debian's prometheus scraping it every second, and the console reading
the group's lag and the topic's rate through ``query_range``; when
Prometheus does not answer, the plots come from the console's own memory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.console.prom import promql
from tests.support.observability import ConsoleProcess, PrometheusProcess, free_port, values
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def test_promql_escapes_label_values() -> None:
    assert promql("group_lag", ('a"b\\c', "t")) == (
        'sum by (group, topic) (equeue_group_topic_lag_messages{group="a\\"b\\\\c",topic="t"})'
    )
    assert promql("topic_in", None) == "sum by (topic) (rate(equeue_messages_in_total{}[1m]))"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("console-prometheus")
    broker = BrokerProcess(root / "data", "--http-port", "0")
    broker.start()
    prometheus = PrometheusProcess(root / "prometheus", [f"127.0.0.1:{broker.http_port()}"])
    try:
        prometheus.start()
        yield {"broker": broker, "prometheus": prometheus, "root": root}
    finally:
        prometheus.stop()
        broker.stop()


@pytest.mark.timeout(120)
def test_plots_come_from_prometheus_and_from_memory_when_it_fails(
    cluster: dict[str, Any],
) -> None:
    broker, prometheus = cluster["broker"], cluster["prometheus"]
    config = ClientConfig(broker=broker.address, timeout_s=5, retries=0)
    with Producer(config=config) as producer:
        producer.send_batch("t", [b"m%d" % i for i in range(40)], queue_ids=[0] * 40)
    with Admin(config=config) as admin:
        admin.commit_offsets("g", {("t", 0): 10})
    lag = 'sum(equeue_group_topic_lag_messages{group="g",topic="t"})'
    prometheus.wait_for(lag, lambda r: values(r) == [30.0], 30)
    prometheus.wait_for(  # two scrapes of the counter: a rate
        "sum(rate(equeue_messages_in_total[1m]))", bool, 30
    )

    console = ConsoleProcess(
        cluster["root"] / "console", "--broker", broker.address, "--interval", "1s",
        "--prometheus", prometheus.url, "--prometheus-step", "1s",
    )  # fmt: skip
    console.start()
    try:
        status, body, _ = console.get("/api/v1/series?kind=group_lag&key=g&key=t")
        assert status == 200 and body["source"] == "prometheus", body
        (series,) = body["series"]
        assert series["key"] == ["g", "t"] and series["values"][-1] == 30.0
        assert len(series["times_ms"]) == len(series["values"]) >= 1
        _, every, _ = console.get("/api/v1/series?kind=group_lag")
        assert ["g", "t"] in [s["key"] for s in every["series"]]
        _, rates, _ = console.get("/api/v1/series?kind=topic_in")
        assert rates["source"] == "prometheus"
        assert [s["key"] for s in rates["series"]] == [["t"]]
        # Series Prometheus does not serve come from the console's memory.
        console.round_after(0)
        _, member, _ = console.get("/api/v1/series?kind=member_in")
        assert member["source"] == "console" and "prometheus_error" not in member
    finally:
        console.stop()

    dead = ConsoleProcess(
        cluster["root"] / "console-dead", "--broker", broker.address, "--interval", "1s",
        "--prometheus", f"http://127.0.0.1:{free_port()}",
    )  # fmt: skip
    dead.start()
    try:
        dead.round_after(0)

        def from_memory() -> dict[str, Any] | None:
            _, body, _ = dead.get("/api/v1/series?kind=group_lag&key=g&key=t")
            return body if body["series"][0]["values"] else None

        body = wait_for("a lag point in the console's memory", from_memory, 30)
        assert body["source"] == "console" and "127.0.0.1" in body["prometheus_error"]
        assert body["series"][0]["values"][-1] == 30.0
    finally:
        dead.stop()
