"""The alarms inside the console process: each poll round's snapshot goes
through the engine on the console's event loop, and the round's transitions
to one sender task that notifies them. Sending never holds up polling or
serving: a slow webhook or mail server delays only the next notifications
(rounds that arrive meanwhile are merged into the next send), and any
failure is logged and counted, never raised into the poll loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from equeue_spark.console.alarms.engine import AlarmEngine, Transition
from equeue_spark.console.alarms.notify import Dispatcher
from equeue_spark.console.alarms.rules import AlarmConfig, Rule
from equeue_spark.console.snapshot import Snapshot

log = logging.getLogger("equeue.console.alarms")


class Alarms:
    """The engine, the dispatcher and the sender task of one console."""

    def __init__(self, config: AlarmConfig, external_url: str) -> None:
        self.config = config
        self.engine = AlarmEngine(config.rules)
        self.dispatcher = Dispatcher(config, external_url)
        self.rounds = 0
        """Snapshots evaluated."""
        self.evaluation_errors = 0
        self.send_errors = 0
        """Unexpected failures of a send round (a failed delivery is the
        dispatcher's own ``failed`` count, not this)."""
        self.send_rounds = 0
        """Sends completed (rounds that arrive during a send are merged)."""
        self._waiting: list[Transition] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sender(), name="alarm-sender")

    async def stop(self) -> None:
        self.dispatcher.stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def feed(self, snapshot: Snapshot) -> None:
        """One poll round (on the loop): evaluate now, send in the background."""
        try:
            transitions = self.engine.step(snapshot, time.time())
        except Exception:  # a bug in a rule must not stop the console
            self.evaluation_errors += 1
            log.exception("alarm evaluation failed (round %d)", snapshot.round)
            return
        self.rounds += 1
        for t in transitions:
            log.info("alarm %s %s: %s", t.status, t.rule.name, t.summary)
        self._waiting.extend(transitions)
        # wake the sender every round, even with nothing new: it retries
        # failed sends and releases what the rate limit held
        self._wake.set()

    async def _sender(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._waiting = self._waiting, []
            try:
                await self.dispatcher.dispatch(batch, time.time())
            except Exception:
                self.send_errors += 1
                log.exception("sending %d alarm notifications failed", len(batch))
            self.send_rounds += 1

    def view(self) -> dict[str, Any]:
        """``/api/v1/alarms``: the rules, the alarms that are on, the latest
        resolved ones and each notifier's state."""
        return {
            "available": True,
            "evaluated_rounds": self.rounds,
            "rules": [rule_view(r, self.config) for r in self.config.rules],
            "active": self.engine.views(),
            "resolved": self.engine.recently_resolved(),
            "notifications": self.dispatcher.views(),
        }

    def metrics(self) -> list[str]:
        return [
            *self.engine.metrics(),
            *self.dispatcher.metrics(),
            "# HELP equeue_alarm_errors_total alarm rounds that failed unexpectedly, by stage",
            "# TYPE equeue_alarm_errors_total counter",
            f'equeue_alarm_errors_total{{stage="evaluate"}} {self.evaluation_errors}',
            f'equeue_alarm_errors_total{{stage="send"}} {self.send_errors}',
        ]


def rule_view(rule: Rule, config: AlarmConfig) -> dict[str, Any]:
    return {
        "name": rule.name,
        "type": rule.type,
        "messages": rule.messages,
        "seconds": rule.seconds,
        "min": rule.min,
        "percent": rule.percent,
        "group": rule.group,
        "topic": rule.topic,
        "broker": rule.broker,
        "scope": rule.scope,
        "for_s": rule.for_s,
        "resolve_for_s": rule.resolve_for_s,
        "hysteresis": rule.hysteresis,
        "repeat_s": rule.repeat_s,
        "notify": [n.name for n in config.notifiers_for(rule)],
        "description": rule.describe(),
    }
