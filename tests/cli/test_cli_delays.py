"""``equeue produce --delay/--deliver-at``, ``message cancel``, ``dlq`` and
the delayed counts of ``topics describe`` and ``stats``, end to end against
a real broker process (commands run in-process through ``main``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, Consumer, Message, Producer
from tests.support.cli import Cli, Result, in_process_cli

BUDGET_S = 60.0


@pytest.fixture
def cli(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> Cli:
    return in_process_cli(broker.address, capsys)


def _produce(cli: Cli, tmp_path: Path, topic: str, lines: list[str], *flags: str) -> Result:
    path = tmp_path / f"{topic}.txt"
    path.write_text("".join(f"{line}\n" for line in lines))
    return cli("produce", topic, "--file", str(path), "--no-progress", "--json", *flags)


@pytest.mark.timeout(120)
def test_produce_delayed_describe_cancel(cli: Cli, tmp_path: Path) -> None:
    assert cli("topics", "create", "cli-later", "--queues", "1").code == 0
    summary = _produce(cli, tmp_path, "cli-later", ["a", "b"], "--delay", "1h").json()
    due = summary["deliver_at_ms"]
    assert abs(due - (time.time() * 1000 + 3_600_000)) < 60_000
    described = cli("topics", "describe", "cli-later")
    assert described.code == 0 and "delayed: 2 pending, next due" in described.out
    assert cli("--json", "topics", "describe", "cli-later").json()["delayed_pending"] == 2
    stats = cli("stats")
    assert stats.code == 0 and "2 pending" in stats.out
    cancelled = cli("--json", "message", "cancel", summary["first_message_id"]).json()
    assert cancelled["cancelled"] and cancelled["topic"] == "cli-later"
    again = cli("message", "cancel", summary["first_message_id"])
    assert again.code == 1 and "NOT_FOUND" in again.err and "Traceback" not in again.err
    text = cli("message", "cancel", summary["last_message_id"])
    assert text.code == 0 and f"cancelled {summary['last_message_id']}" in text.out
    assert cli("--json", "topics", "describe", "cli-later").json().get("delayed_pending", 0) == 0


@pytest.mark.timeout(120)
def test_produce_deliver_at_is_read_after_its_time(cli: Cli, tmp_path: Path) -> None:
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 2))
    summary = _produce(cli, tmp_path, "cli-at", ["x"], "--deliver-at", soon).json()
    due = summary["deliver_at_ms"]
    deadline = time.monotonic() + BUDGET_S
    while True:
        out = cli("--json", "consume", "cli-at", "--max", "1", "--timeout", "0.5")
        if out.code == 0 and out.out.strip():
            break
        assert time.monotonic() < deadline, "the delayed message never came"
    message = json.loads(out.out.splitlines()[0])
    assert message["value"] == "x" and message["store_timestamp_ms"] >= due


@pytest.mark.timeout(60)
def test_bad_delay_times_are_clear(cli: Cli, tmp_path: Path) -> None:
    far = _produce(cli, tmp_path, "cli-bad", ["x"], "--delay", "300d")  # beyond --max-delay
    assert far.code == 1 and "INVALID_ARGUMENT" in far.err and "Traceback" not in far.err
    assert "0 message(s) were sent" in far.err and "--max-delay" in far.err
    usage = cli("produce", "cli-bad", "--delay", "soon")
    assert usage.code == 2 and "not a duration" in usage.err
    usage = cli("produce", "cli-bad", "--delay", "400d")  # beyond what any broker takes
    assert usage.code == 2 and "longer than any broker" in usage.err


@pytest.mark.timeout(180)
def test_dlq_list_resend_purge(cli: Cli, broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("cli-work", queues=1)
        producer.send_batch("cli-work", [b"p0", b"p1"])
    dead: list[Message] = []
    with Consumer(
        broker.address, group="cli-g", topics=["cli-work"], max_reconsume_times=1,
        heartbeat_interval_s=0.2,
    ) as consumer:  # fmt: skip
        deadline = time.monotonic() + BUDGET_S
        while len(dead) < 2:
            assert time.monotonic() < deadline, "the messages never reached the DLQ"
            for m in consumer.poll(timeout_s=0.5):
                (outcome,) = consumer.nack(m, delay_s=0.1, error=f"bad {m.value.decode()}")
                if outcome.action == "dlq":
                    dead.append(m)
            consumer.commit()
    listed = cli("dlq", "list", "cli-g")
    assert listed.code == 0 and "cli-work/0@0" in listed.out and "bad p0" in listed.out
    doc = cli("--json", "dlq", "list", "cli-g").json()
    assert [m["value"] for m in doc["messages"]] == ["p0", "p1"]
    assert doc["messages"][0]["origin"]["topic"] == "cli-work"
    assert doc["messages"][0]["deliveries"] == 2
    first = doc["messages"][0]["message_id"]
    resent = cli("--json", "dlq", "resend", "cli-g", "--ids", first).json()
    assert (resent["resent"], resent["already_resent"]) == (1, 0)
    rest = cli("dlq", "resend", "cli-g", "--all")
    assert rest.code == 0 and "resent 1 dead letter(s)" in rest.out
    assert "resent 0" in cli("dlq", "resend", "cli-g", "--all").out
    unknown = cli("--json", "dlq", "resend", "cli-g", "--ids", first[:-4] + "ffff").json()
    assert unknown["not_found"] == [first[:-4] + "ffff"]
    assert "purged 2 dead letter(s)" in cli("dlq", "purge", "cli-g").out
    assert "no dead letters for group cli-g" in cli("dlq", "list", "cli-g").out
