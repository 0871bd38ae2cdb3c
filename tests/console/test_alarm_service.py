"""The console's alarm loop (alarms/service.py) on hand-made snapshots: a
failing notifier or a broken rule is logged and counted, never raised into
the poll loop, and later rounds are still evaluated."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from equeue_spark.console.alarms import notify
from equeue_spark.console.alarms.rules import AlarmConfig, Notifier, Rule
from equeue_spark.console.alarms.service import Alarms
from equeue_spark.console.snapshot import Snapshot

RULE = Rule(name="lag", type="group_lag", messages=10, for_s=0, resolve_for_s=0)


def snap(round_: int, lag: int) -> Snapshot:
    group = {
        "group": "g", "topics": [{"topic": "t", "lag": lag, "lag_ms": 0}],
        "dlq_messages": 0, "dlq_resent": 0, "unreachable_brokers": [],
    }  # fmt: skip
    return Snapshot(round=round_, at_ms=0, groups=(group,))


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on exit: connections are refused


async def sent(alarms: Alarms, rounds: int) -> None:
    while alarms.send_rounds < rounds:
        await asyncio.sleep(0.01)


async def drive(alarms: Alarms, lags: list[int]) -> None:
    alarms.start()
    try:
        for i, lag in enumerate(lags):
            alarms.feed(snap(i, lag))
            # the sender's round done: the readiness signal, bounded
            await asyncio.wait_for(sent(alarms, i + 1 if alarms.rounds else 0), 10)
    finally:
        await alarms.stop()


def test_a_failing_notifier_is_counted_and_rounds_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "WEBHOOK_BACKOFF_S", ())
    hook = Notifier("dead", "webhook", {"url": f"http://127.0.0.1:{dead_port()}/", "timeout": 1.0})
    alarms = Alarms(AlarmConfig((RULE,), (hook,)), "http://console")
    asyncio.run(drive(alarms, [50, 50, 0]))
    assert alarms.rounds == 3
    view = alarms.view()
    assert view["available"] is True and view["active"] == []
    assert [r["labels"] for r in view["resolved"]] == [{"group": "g", "topic": "t"}]
    assert "dead" in str(view["notifications"][0]["last_error"])
    metrics = alarms.metrics()
    assert any('notifier="dead",status="firing",result="failed"' in line for line in metrics)
    assert 'equeue_alarm_errors_total{stage="send"} 0' in metrics


def test_a_broken_evaluation_is_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    alarms = Alarms(AlarmConfig((RULE,), ()), "http://console")

    def broken(*_: Any) -> None:
        raise KeyError("lag")

    monkeypatch.setattr(alarms.engine, "step", broken)
    asyncio.run(drive(alarms, [50]))
    assert (alarms.rounds, alarms.evaluation_errors) == (0, 1)
    assert 'equeue_alarm_errors_total{stage="evaluate"} 1' in alarms.metrics()
