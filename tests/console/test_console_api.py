"""The console as a real process (``python -m equeue_spark.console``) against
real brokers: its JSON API's numbers equal the client's and the CLI's, admin
actions need an admin token, and a SIGKILLed broker shows as not answering."""

from __future__ import annotations

import io
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
import trustme

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_spark.client import Admin, ClientConfig, Consumer, Producer
from tests.support.observability import ConsoleProcess
from tests.support.waits import wait_for

ADMIN, MONITOR, SCOPED = (
    "console-admin-secret-0123",
    "console-monitor-secret-01",
    "console-scoped-secret-012",
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
name = "team-r"
secret = "{SCOPED}"
roles = ["monitor"]
topics = ["r*"]
"""


def fast(address: str, token: str | None = None) -> ClientConfig:
    return ClientConfig(broker=address, timeout_s=5, retries=0, token=token)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Path]]:
    root = tmp_path_factory.mktemp("console-secured")
    tokens = root / "tokens.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    broker = BrokerProcess(root / "data", "--tokens-file", str(tokens))
    broker.start()
    try:
        with Producer(config=fast(broker.address, ADMIN)) as producer:
            producer.send_batch(
                "t", [b"m%d" % i for i in range(30)], queue_ids=[i % 2 for i in range(30)]
            )
        with Admin(config=fast(broker.address, ADMIN)) as admin:
            admin.commit_offsets("g", {("t", 0): 5, ("t", 1): 2})
        yield broker, tokens
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def console(secured: tuple[BrokerProcess, Path]) -> Iterator[ConsoleProcess]:
    broker, tokens = secured
    poller_token = tokens.parent / "monitor.token"
    poller_token.write_text(MONITOR)
    process = ConsoleProcess(
        tokens.parent / "console", "--broker", broker.address, "--token-file", str(poller_token),
        "--tokens-file", str(tokens), "--interval", "1s", reader=MONITOR,
    )  # fmt: skip
    process.start()
    try:
        yield process
    finally:
        process.stop()


def cli_describe(address: str, group: str, token_file: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "equeue_spark.cli", "--broker", address, "--token-file",
         str(token_file), "--json", "groups", "describe", group],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    document: dict[str, Any] = json.loads(out.stdout)
    return document


@pytest.mark.timeout(120)
def test_the_api_shows_what_the_cli_and_the_client_see(
    console: ConsoleProcess, secured: tuple[BrokerProcess, Path]
) -> None:
    broker, tokens = secured
    console.round_after(0)
    status, group, _ = console.get("/api/v1/groups/g")
    assert status == 200
    admin_token = tokens.parent / "admin.token"
    admin_token.write_text(ADMIN)
    cli = cli_describe(broker.address, "g", admin_token)
    assert group["group"]["total_lag"] == cli["total_lag"] == 23
    lags = {(q["topic"], q["queue_id"]): q["lag"] for q in group["group"]["queues"]}
    assert lags == {(q["topic"], q["queue_id"]): q["lag"] for q in cli["queues"]}
    # lag_ms is an age: the console's, taken earlier, is not older than the CLI's.
    ((topic_lag),) = group["group"]["topics"]
    assert (topic_lag["topic"], topic_lag["lag"]) == ("t", 23)
    assert 0 < topic_lag["lag_ms"] <= max(q["lag_ms"] for q in cli["queues"])

    status, topics, _ = console.get("/api/v1/topics")
    (topic,) = [t for t in topics["topics"] if t["name"] == "t"]
    assert (topic["stored"], topic["queue_count"], topic["backlog"]) == (30, 4, 23)
    status, one, _ = console.get("/api/v1/topics/t")
    assert [q["end_offset"] for q in one["topic"]["queues"]] == [15, 15, 0, 0]
    assert one["groups"] == [
        {"group": "g", "topic": "t", "lag": 23, "lag_ms": one["groups"][0]["lag_ms"]}
    ]

    status, cluster, headers = console.get("/api/v1/cluster")
    (member,) = cluster["members"]
    assert member["state"] == "live" and member["role"] == "master"
    with Admin(config=fast(broker.address, ADMIN)) as admin:
        stats = admin.stats()
    assert member["stats"]["broker_id"] == stats.broker_id
    assert member["stats"]["disk_size_bytes"] > member["stats"]["disk_free_bytes"] > 0
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'self'" in headers["Content-Security-Policy"]

    status, txns, _ = console.get("/api/v1/transactions")
    assert status == 200 and txns["transactions"] == [] and txns["delayed"] == []
    status, series, _ = console.get("/api/v1/series?kind=group_lag&key=g&key=t")
    assert series["series"][0]["values"][-1] == 23.0
    before = len(series["series"][0]["values"])
    console.round_after(cluster["round"])
    status, series, _ = console.get("/api/v1/series?kind=group_lag&key=g&key=t")
    assert len(series["series"][0]["values"]) > before
    assert console.get("/api/v1/series?kind=nope")[0] == 400
    assert console.get("/api/v1/groups/nobody")[0] == 404
    assert console.get("/healthz")[0] == 200
    assert console.get("/readyz")[0] == 200
    status, exposition, _ = console.get("/metrics")
    assert status == 200 and "equeue_console_poll_overruns_total " in exposition
    rounds = [
        x for x in exposition.splitlines() if x.startswith("equeue_console_poll_rounds_total")
    ]
    assert int(rounds[0].split()[1]) >= 2
    status, page, headers = console.get("/groups/g")
    assert status == 200 and 'data-page="groups" data-arg="g"' in page
    # A monitor token reads no message contents: the broker says so.
    status, body, _ = console.get("/api/v1/messages?topic=t&queue=0&offset=0&count=2")
    assert status == 403 and "error" in body


@pytest.mark.timeout(60)
def test_a_console_with_users_shows_nothing_without_a_token(console: ConsoleProcess) -> None:
    for path in ("/api/v1/cluster", "/api/v1/groups/g", "/api/v1/messages?id=x", "/metrics"):
        status, body, _ = console.request("GET", path)
        assert status == 401 and "log in" in body["error"], path
    assert console.request("GET", "/api/v1/cluster", token="not-a-token")[0] == 401
    assert console.request("GET", "/healthz")[0] == 200
    assert console.request("POST", "/api/v1/login", {"token": "nope"})[0] == 401
    # A browser logs in once; its cookie then stands for the admin token.
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    login = urllib.request.Request(
        console.address + "/api/v1/login", data=json.dumps({"token": ADMIN}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    with opener.open(login, timeout=20) as response:
        assert json.loads(response.read())["admin"] is True
        cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    with opener.open(console.address + "/api/v1/whoami", timeout=20) as response:
        assert json.loads(response.read())["user"] == "ops"
    # The admin's own token reads message contents.
    with opener.open(console.address + "/api/v1/messages?topic=t&queue=0&offset=0&count=2") as r:
        assert [m["value"]["text"] for m in json.loads(r.read())["messages"]] == ["m0", "m2"]


@pytest.mark.timeout(60)
def test_events_announce_each_round(console: ConsoleProcess) -> None:
    request = urllib.request.Request(console.address + "/api/v1/events")
    request.add_header("Authorization", f"Bearer {MONITOR}")
    with urllib.request.urlopen(request, timeout=20) as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        lines: list[str] = []
        while len([x for x in lines if x.startswith("data: ")]) < 2:
            lines.append(stream.readline().decode().strip())
    rounds = [json.loads(x[len("data: ") :])["round"] for x in lines if x.startswith("data: ")]
    assert rounds[1] > rounds[0]


@pytest.mark.timeout(60)
def test_rates_come_from_the_counters(
    console: ConsoleProcess, secured: tuple[BrokerProcess, Path]
) -> None:
    broker, _ = secured

    def in_rate() -> float | None:
        with Producer(config=fast(broker.address, ADMIN)) as producer:
            producer.send_batch("r", [b"x"] * 50, queue_ids=[0] * 50)
        _, body, _ = console.get("/api/v1/series?kind=topic_in&key=r")
        values: list[float] = body["series"][0]["values"]
        return max(values) if values and max(values) > 0 else None

    assert wait_for("a produce rate on r", in_rate, 30) > 0
    _, topics, _ = console.get("/api/v1/topics")
    (topic,) = [t for t in topics["topics"] if t["name"] == "r"]
    assert topic["in_rate"] is not None and topic["in_rate"] >= 0


@pytest.mark.timeout(60)
def test_open_transactions_and_pending_delayed_messages(
    console: ConsoleProcess, secured: tuple[BrokerProcess, Path]
) -> None:
    with Producer(config=fast(secured[0].address, ADMIN)) as producer:
        producer.send_batch("later", [b"d"], queue_ids=[0], delay_s=600)
        producer.send_batch("staged", [b"s1", b"s2"], queue_ids=[0, 0], transaction_id="tx-1")

    def shown() -> dict[str, Any] | None:
        _, body, _ = console.get("/api/v1/transactions")
        return body if body["transactions"] and body["delayed"] else None

    body = wait_for("the transaction and the delayed message", shown, 30)
    (txn,) = body["transactions"]
    assert txn["transaction_id"].endswith("tx-1") and txn["messages"] == 2
    assert [(d["topic"], d["pending"]) for d in body["delayed"]] == [("later", 1)]
    with Admin(config=fast(secured[0].address, ADMIN)) as admin:
        assert admin.abort_transactions([txn["transaction_id"]]) == 1


@pytest.mark.timeout(60)
def test_a_topic_scoped_token_sees_its_topics_only(
    console: ConsoleProcess, secured: tuple[BrokerProcess, Path]
) -> None:
    with Producer(config=fast(secured[0].address, ADMIN)) as producer:
        producer.send_batch("r", [b"x"], queue_ids=[0])

    def scoped_topics() -> list[str] | None:
        _, topics, _ = console.get("/api/v1/topics", SCOPED)
        return [t["name"] for t in topics["topics"]] or None

    assert wait_for("topic r polled", scoped_topics, 30) == ["r"]
    assert console.get("/api/v1/topics/t", SCOPED)[0] == 404
    assert console.get("/api/v1/topics/t")[0] == 200
    assert console.get("/api/v1/groups", SCOPED)[1]["groups"] == []
    assert console.get("/api/v1/groups/g", SCOPED)[0] == 404
    assert console.get("/api/v1/series?kind=group_lag", SCOPED)[1]["series"] == []
    assert console.get("/api/v1/series?kind=group_lag")[1]["series"] != []


@pytest.mark.timeout(120)
def test_admin_actions_need_an_admin_token(
    console: ConsoleProcess, secured: tuple[BrokerProcess, Path]
) -> None:
    broker, _ = secured
    body = {"topic": "t", "to": "earliest"}
    assert console.request("POST", "/api/v1/groups/g/reset", body)[0] == 401
    status, refused, _ = console.request("POST", "/api/v1/groups/g/reset", body, MONITOR)
    assert status == 403 and "admin" in refused["error"]
    assert console.request("POST", "/api/v1/groups/g/reset", body, ADMIN, "text/plain")[0] == 415
    status, bad, _ = console.request("POST", "/api/v1/groups/g/reset", {"topic": "t"}, ADMIN)
    assert status == 400 and "earliest" in bad["error"]

    status, done, _ = console.request("POST", "/api/v1/groups/g/reset", body, ADMIN)
    assert status == 200 and done == {"ok": True, "group": "g", "topic": "t", "total_lag": 30}
    with Admin(config=fast(broker.address, ADMIN)) as admin:
        assert admin.describe_group("g").total_lag == 30
        status, grown, _ = console.request("POST", "/api/v1/topics/t/queues", {"count": 1}, ADMIN)
        assert status == 200 and grown["queue_count"] == 5
        assert len(admin.describe_topic("t").queues) == 5
    status, purge, _ = console.request("POST", "/api/v1/groups/g/dlq/purge", {}, ADMIN)
    assert status == 400 and "confirm" in purge["error"]
    # The console's new figures arrive with the next round.
    after = console.round_after(console.get("/api/v1/cluster")[1]["round"])
    _, group, _ = console.get("/api/v1/groups/g")
    assert group["group"]["total_lag"] == 30 and group["round"] >= after["round"]


@pytest.mark.timeout(120)
def test_read_only_without_a_tokens_file_and_the_browser(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    console = ConsoleProcess(tmp_path / "console", "--broker", broker.address, "--interval", "1s")
    try:
        with Producer(config=fast(broker.address)) as producer:
            ids = producer.send_batch(
                "b", [b'{"n": 1}', b"\xff\xfe", b"plain"], keys=[b"k1", b"k2", b"k1"],
                headers=[[("h", b"v")], [], []], queue_ids=[0, 0, 0],
            )  # fmt: skip
        console.start()
        console.round_after(0)
        status, refused, _ = console.request(
            "POST", "/api/v1/groups/g/reset", {"topic": "b", "to": "latest"}, ADMIN
        )
        assert status == 403 and "read-only" in refused["error"]

        _, page, _ = console.get("/api/v1/messages?topic=b&queue=0&offset=0&count=10")
        assert [m["offset"] for m in page["messages"]] == [0, 1, 2] and page["next_offset"] == 3
        first, binary, _ = page["messages"]
        assert first["value"]["json"] == {"n": 1} and first["key"]["text"] == "k1"
        assert first["headers"] == [{"name": "h", "size": 1, "truncated": False, "text": "v"}]
        assert binary["value"]["hex"] == "fffe"
        _, by_id, _ = console.get(f"/api/v1/messages?id={ids[1].message_id}")
        assert by_id["messages"][0]["offset"] == 1
        _, by_key, _ = console.get("/api/v1/messages?topic=b&key=k1")
        assert sorted(m["offset"] for m in by_key["messages"]) == [0, 2]
        status, bad, _ = console.get("/api/v1/messages?topic=b&queue=x&offset=0")
        assert status == 400 and "queue" in bad["error"]
        assert_schema_decoded(console, broker.address)

        broker.kill()  # the one broker gone: shown, and the console not ready

        def member_state() -> str | None:
            _, body, _ = console.get("/api/v1/cluster")
            (member,) = body["members"]
            return member["state"] if member["state"] != "live" else None

        assert wait_for("the broker not answering", member_state, 15) == "unreachable"
        status, why, _ = console.get("/readyz")
        assert status == 503 and "no broker answered" in why
        _, topics, _ = console.get("/api/v1/topics")
        assert "topics" in topics["stale"] and topics["errors"]
        assert "b" in [t["name"] for t in topics["topics"]]  # the last known rows
    finally:
        console.stop()
        broker.stop()


@pytest.mark.timeout(120)
def test_dead_letters_shown_resent_and_purged(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    console = ConsoleProcess(
        tmp_path / "console", "--broker", broker.address, "--interval", "1s",
        "--tokens-file", str(tokens), reader=ADMIN,
    )  # fmt: skip
    try:
        with Admin(config=fast(broker.address)) as admin, Producer(broker.address) as producer:
            admin.create_topic("work", queues=1)
            producer.send_batch("work", [b"a", b"b"], queue_ids=[0, 0])
            with Consumer(
                broker.address, group="D", topics=["work"], max_reconsume_times=1
            ) as consumer:
                dead: list[str] = []

                def nacked() -> bool | None:
                    for message in consumer.poll(timeout_s=0.5):
                        # The second delivery's nack sends it to %DLQ%D.
                        (outcome,) = consumer.nack(message, delay_s=0.1, error="bad")
                        if outcome.action == "dlq":
                            dead.append(message.message_id)
                    consumer.commit()
                    return len(dead) >= 2 or None

                wait_for("two dead letters", nacked, 30)
        console.start()

        def dlq_counted() -> dict[str, Any] | None:
            status, body, _ = console.get("/api/v1/groups/D")
            return body["group"] if status == 200 and body["group"]["dlq_messages"] == 2 else None

        assert wait_for("the DLQ counted", dlq_counted, 30)["dlq_resent"] == 0
        assert console.get("/api/v1/groups/D/dlq?limit=x")[0] == 400
        _, letters, _ = console.get("/api/v1/groups/D/dlq")
        assert sorted(m["value"]["text"] for m in letters["messages"]) == ["a", "b"]
        first = letters["messages"][0]["id"]
        status, resent, _ = console.request(
            "POST", "/api/v1/groups/D/dlq/resend", {"ids": [first]}, ADMIN
        )
        assert status == 200 and resent["resent"] == 1
        status, resent, _ = console.request(
            "POST", "/api/v1/groups/D/dlq/resend", {"all": True}, ADMIN
        )
        assert status == 200 and (resent["resent"], resent["already_resent"]) == (1, 0)
        status, purged, _ = console.request(
            "POST", "/api/v1/groups/D/dlq/purge", {"confirm": "D"}, ADMIN
        )
        assert status == 200 and purged["purged"] == 2
        with Admin(config=fast(broker.address)) as admin:
            assert admin.dead_letters("D") == []
    finally:
        console.stop()
        broker.stop()


@pytest.mark.timeout(60)
def test_https_listener(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    cert, key, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    console = ConsoleProcess(
        tmp_path / "console", "--broker", "127.0.0.1:1", "--interval", "1s",
        "--http-tls-cert", str(cert), "--http-tls-key", str(key),
    )  # fmt: skip
    console.start()
    try:
        assert console.address.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(ca_file))
        with urllib.request.urlopen(console.address + "/healthz", context=context) as response:
            assert response.status == 200
        # Nothing answers at 127.0.0.1:1: the console serves and says it is not ready.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(console.address + "/readyz", context=context)
        refused.value.close()
        assert refused.value.code == 503
    finally:
        console.stop()


ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "raw", "type": "bytes"}],
}


def assert_schema_decoded(console: ConsoleProcess, address: str) -> None:
    """A value written with a topic's Avro schema shows decoded (bytes as base64)."""
    with Admin(config=fast(address)) as admin:
        admin.create_topic("orders", queues=1)
        admin.set_schema("orders", ORDER)
    data = io.BytesIO()
    fastavro.schemaless_writer(data, fastavro.parse_schema(ORDER), {"id": 7, "raw": b"\x00\x01"})
    with Producer(address, validate=True) as producer:
        producer.send_batch("orders", [data.getvalue()], queue_ids=[0])

    def schema_shown() -> dict[str, Any] | None:
        _, body, _ = console.get("/api/v1/topics")
        found = [t for t in body["topics"] if t["name"] == "orders" and t["schema"]]
        return found[0] if found else None

    orders = wait_for("the topic's schema on the topics page", schema_shown, 30)
    assert orders["schema"] == {"version": 1, "type": "AVRO"}
    assert orders["retention"][0]["broker"] == ""
    _, page, _ = console.get("/api/v1/messages?topic=orders&queue=0&offset=0")
    (message,) = page["messages"]
    assert message["decoded"] == {"version": 1, "type": "AVRO", "value": {"id": 7, "raw": "AAE="}}


@pytest.mark.timeout(180)
def test_a_killed_broker_shows_as_not_answering(tmp_path: Path) -> None:
    with LocalCluster(tmp_path).start(namesrvs=1, brokers=("a", "b")) as cluster:
        with Admin(config=ClientConfig(namesrv=cluster.namesrv, timeout_s=5)) as admin:
            admin.create_topic("k", queues=2)
        console = ConsoleProcess(
            tmp_path / "console", "--namesrv", cluster.namesrv, "--interval", "1s"
        )
        console.start()
        try:

            def states() -> dict[str, str]:
                _, body, _ = console.get("/api/v1/cluster")
                return {m["broker"]: m["state"] for m in body["members"]}

            wait_for("both brokers live", lambda: states() == {"a": "live", "b": "live"}, 30)
            _, body, _ = console.get("/api/v1/cluster")
            assert body["namesrvs"] == [
                {"address": cluster.namesrv, "state": "up", "brokers": 2, "error": ""}
            ]
            cluster.brokers["b"].kill()
            # Within one round (1 s) plus the GetStats deadline (2 s), with margin for a loaded box.
            wait_for("b not answering", lambda: states().get("b") in ("unreachable", "down"), 15)
            # a still answers (the name servers may call it suspect a moment
            # if its registration was late on a loaded machine).
            _, body, _ = console.get("/api/v1/cluster")
            (a,) = [m for m in body["members"] if m["broker"] == "a"]
            assert a["state"] in ("live", "suspect") and a["stats"] is not None
            status, topics, _ = console.get("/api/v1/topics")
            (topic,) = [t for t in topics["topics"] if t["name"] == "k"]
            assert status == 200 and topic["brokers"] == ["a"]
            assert "b" in topic["unreachable_brokers"]
            assert console.get("/api/v1/groups")[0] == 200
        finally:
            console.stop()


@pytest.mark.timeout(90)
def test_alarms_on_the_api_and_metrics_for_those_who_may_see_them(
    console: ConsoleProcess, secured: tuple[BrokerProcess, Path]
) -> None:
    """Without rules ``available: false``; with ``--alarm-lag`` (no notifier)
    the lagging group's alarm is listed and counted, and a topic-scoped token
    does not see alarms of other topics (docs/alarms.md has the end-to-end
    tests with notifications)."""
    status, body, _ = console.get("/api/v1/alarms")
    assert status == 200 and body["available"] is False and body["active"] == []
    broker, tokens = secured
    poller_token = tokens.parent / "monitor.token"
    alarmed = ConsoleProcess(
        tokens.parent / "console-alarms", "--broker", broker.address, "--token-file",
        str(poller_token), "--tokens-file", str(tokens), "--interval", "1s",
        "--alarm-lag", "1", "--alarm-for", "0s", reader=MONITOR,
    )  # fmt: skip
    alarmed.start()
    try:

        def firing() -> list[dict[str, Any]] | None:
            _, body, _ = alarmed.get("/api/v1/alarms")
            found = [a for a in body["active"] if a["labels"] == {"group": "g", "topic": "t"}]
            return found if found and found[0]["state"] == "firing" else None

        (alarm,) = wait_for("g's lag alarm firing", firing, 30)
        lag = cli_describe(broker.address, "g", poller_token)["total_lag"]
        assert alarm["value"] == lag and alarm["threshold"] == 1 and alarm["alarm"] == "flag-lag"
        _, body, _ = alarmed.get("/api/v1/alarms")
        assert body["available"] is True and body["notifications"] == []
        assert [r["name"] for r in body["rules"]] == ["flag-lag"]
        _, scoped, _ = alarmed.get("/api/v1/alarms", SCOPED)
        assert scoped["active"] == [] and scoped["rules"] == body["rules"]
        status, exposition, _ = alarmed.get("/metrics")
        assert status == 200
        assert (
            'equeue_alarm_firing{alarm="flag-lag",type="group_lag",group="g",topic="t",'
            'broker="",member="",replica=""} 1'
        ) in exposition.splitlines()
    finally:
        alarmed.stop()
