"""Backlog alarms end to end (design 30, 5.3): a real broker, the console as a
process with the short alarm flags, a real webhook receiver and a real SMTP
server requiring STARTTLS and AUTH. A lagging group fires once by webhook and
by mail and resolves once when it catches up; a lag flapping across the
threshold (and below the hysteresis band) sends no storm.

Every wait polls what the test observes (the sinks, the console's API) with a
deadline; nothing sleeps for synchronisation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, ClientConfig, Producer
from tests.support.observability import ConsoleProcess, SmtpSink, WebhookSink
from tests.support.waits import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Session.login_data is deprecated:DeprecationWarning"),
]

LAG = 100
"""--alarm-lag; with the default hysteresis 0.1 the alarm clears at 90 or less."""
RESOLVE_FOR_S = 5
"""From the rule file's [defaults]: longer than a flap's clear phase
(one or two poll rounds of 1 s), short enough to keep the test quick."""
NOTIFY_S = 30.0
"""Bound on each wait for a notification: `for` (2 s) + rounds + sending."""
RULES = f"""
[defaults]
resolve_for = "{RESOLVE_FOR_S}s"
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("alarms-live")
    broker = BrokerProcess(root / "data")
    broker.start()
    smtp = SmtpSink(root / "smtp").start()
    hook = WebhookSink().start()
    password = root / "smtp-password"
    password.write_text(smtp.password + "\n")
    rules = root / "alarms.toml"
    rules.write_text(RULES)
    console = ConsoleProcess(
        root / "console", "--broker", broker.address, "--interval", "1s",
        "--alarm-rules", str(rules), "--alarm-lag", str(LAG), "--alarm-for", "2s",
        "--alarm-repeat", "0s", "--alarm-webhook", hook.url,
        "--alarm-email", "ops@example.com", "--smtp", f"127.0.0.1:{smtp.port}",
        "--smtp-tls", "starttls", "--smtp-user", smtp.user,
        "--smtp-password-file", str(password), "--smtp-ca", str(smtp.ca_file),
        "--smtp-from", "equeue@example.com",
    )  # fmt: skip
    try:
        console.start()
        yield {"broker": broker, "console": console, "smtp": smtp, "hook": hook}
    finally:
        console.stop()
        hook.stop()
        smtp.stop()
        broker.stop()


def config(address: str) -> ClientConfig:
    return ClientConfig(broker=address, timeout_s=5, retries=0)


def produce(address: str, topic: str, count: int) -> None:
    with Producer(config=config(address)) as producer:
        producer.send_batch(topic, [b"m%d" % i for i in range(count)], queue_ids=[0] * count)


def commit(address: str, group: str, topic: str, offset: int) -> None:
    with Admin(config=config(address)) as admin:
        admin.commit_offsets(group, {(topic, 0): offset})


def alerts(hook: WebhookSink, group: str, status: str) -> list[dict[str, Any]]:
    """The webhook alerts about ``group`` with ``status``, in arrival order."""
    return [
        a
        for body in list(hook.received)
        for a in body["alerts"]
        if a["labels"].get("group") == group and a["status"] == status
    ]


def mails(smtp: SmtpSink, group: str, status: str) -> list[Any]:
    prefix = f"[equeue {status.upper()}]"
    return [
        m
        for m in list(smtp.messages)
        if m["Subject"].startswith(prefix) and f"group {group} " in m["Subject"]
    ]


def alarm_state(console: ConsoleProcess, group: str) -> str | None:
    status, body, _ = console.get("/api/v1/alarms")
    assert status == 200, body
    for alarm in body["active"]:
        if alarm["labels"].get("group") == group:
            return str(alarm["state"])
    return None


def notified(setup: dict[str, Any], group: str, status: str) -> None:
    """Wait for the first webhook alert and the first mail of ``status``."""
    wait_for(f"a {status} webhook for {group}",
             lambda: alerts(setup["hook"], group, status), NOTIFY_S)  # fmt: skip
    wait_for(f"a {status} mail for {group}",
             lambda: mails(setup["smtp"], group, status), NOTIFY_S)  # fmt: skip


def settle(console: ConsoleProcess, rounds: int = 3) -> None:
    """Let a few more rounds pass (so a second notification would have come)."""
    round_ = console.round_after(-1)["round"]
    console.round_after(round_ + rounds - 1)


@pytest.mark.timeout(150)
def test_a_lagging_group_fires_by_webhook_and_email_and_resolves_when_it_catches_up(
    setup: dict[str, Any],
) -> None:
    address, console = setup["broker"].address, setup["console"]
    hook, smtp = setup["hook"], setup["smtp"]
    produce(address, "t", 500)
    commit(address, "g", "t", 0)

    notified(setup, "g", "firing")
    (body,) = [
        b for b in hook.received if any(a["labels"].get("group") == "g" for a in b["alerts"])
    ]
    assert (body["version"], body["status"], body["receiver"]) == ("4", "firing", "webhook-1")
    (alert,) = body["alerts"]
    assert alert["labels"] == {
        "alertname": "flag-lag", "type": "group_lag", "group": "g", "topic": "t",
        "source": "equeue",
    }  # fmt: skip
    assert alert["equeue"]["value"] == 500 and alert["equeue"]["threshold"] == LAG
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    (mail,) = mails(smtp, "g", "firing")
    assert mail["Subject"].startswith("[equeue FIRING] flag-lag: group g lags 500 messages on t")
    assert mail["To"] == "ops@example.com" and mail["From"] == "equeue@example.com"
    assert smtp.authenticated == [True]  # AUTH after STARTTLS (the sink requires both)

    status, text, _ = console.get("/metrics")
    assert status == 200
    firing = re.search(r'^equeue_alarm_firing\{[^}]*group="g"[^}]*\} 1$', text, re.M)
    assert firing and 'topic="t"' in firing.group(0), text
    sent = 'equeue_alarm_notifications_total{notifier="webhook-1",status="firing",result="sent"} 1'
    assert sent in text.splitlines()
    status, api, _ = console.get("/api/v1/alarms")
    assert api["available"] is True
    (active,) = [a for a in api["active"] if a["labels"].get("group") == "g"]
    assert (active["alarm"], active["state"], active["value"], active["threshold"]) == (
        "flag-lag", "firing", 500, LAG,
    )  # fmt: skip
    assert active["notified_ms"] >= active["since_ms"] > 0
    assert [r["name"] for r in api["rules"]] == ["flag-lag"]
    assert api["rules"][0]["resolve_for_s"] == RESOLVE_FOR_S  # the file's [defaults]

    commit(address, "g", "t", 500)  # caught up
    notified(setup, "g", "resolved")
    settle(console)
    assert len(alerts(hook, "g", "firing")) == 1 and len(alerts(hook, "g", "resolved")) == 1
    assert len(mails(smtp, "g", "firing")) == 1 and len(mails(smtp, "g", "resolved")) == 1
    (resolved,) = alerts(hook, "g", "resolved")
    assert resolved["endsAt"] != "0001-01-01T00:00:00Z"
    status, api, _ = console.get("/api/v1/alarms")
    assert not [a for a in api["active"] if a["labels"].get("group") == "g"]
    assert [r["labels"] for r in api["resolved"]] == [{"group": "g", "topic": "t"}]
    status, text, _ = console.get("/metrics")
    assert not re.search(r'^equeue_alarm_firing\{[^}]*group="g"', text, re.M)


@pytest.mark.timeout(150)
def test_a_lag_flapping_around_the_threshold_sends_no_storm(setup: dict[str, Any]) -> None:
    address, console = setup["broker"].address, setup["console"]
    hook, smtp = setup["hook"], setup["smtp"]
    produce(address, "f", LAG + 15)
    commit(address, "gf", "f", 0)
    notified(setup, "gf", "firing")

    # Flap for ~15 s: 30 consumed (lag 85: under the threshold and the
    # hysteresis band) then 30 produced (lag 115), each step waiting until
    # the console's engine has seen it, so every crossing is evaluated.
    committed, crossings = 0, 0
    with Producer(config=config(address)) as producer:
        for _ in range(6):
            committed += 30
            commit(address, "gf", "f", committed)
            wait_for("the alarm clearing", lambda: alarm_state(console, "gf") == "resolving", 20)
            producer.send_batch("f", [b"x"] * 30, queue_ids=[0] * 30)
            wait_for("the alarm breaching", lambda: alarm_state(console, "gf") == "firing", 20)
            crossings += 2
    assert crossings == 12
    settle(console)
    assert len(alerts(hook, "gf", "firing")) == 1 and not alerts(hook, "gf", "resolved")
    assert len(mails(smtp, "gf", "firing")) == 1 and not mails(smtp, "gf", "resolved")

    commit(address, "gf", "f", LAG + 15 + 6 * 30)  # caught up for good
    notified(setup, "gf", "resolved")
    settle(console)
    assert len(alerts(hook, "gf", "firing")) == 1 and len(alerts(hook, "gf", "resolved")) == 1
    assert len(mails(smtp, "gf", "firing")) == 1 and len(mails(smtp, "gf", "resolved")) == 1
