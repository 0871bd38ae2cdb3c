"""Alarm notifications to a real HTTP receiver and a real SMTP server
(aiosmtpd) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

from equeue_spark.console.alarms import notify
from equeue_spark.console.alarms.engine import Transition
from equeue_spark.console.alarms.notify import (
    PER_MINUTE,
    Dispatcher,
    SendError,
    email_message,
    post_webhook,
    send_email,
)
from equeue_spark.console.alarms.rules import AlarmConfig, Notifier, Rule

RULE = Rule(name="billing-lag", type="group_lag", messages=10_000, for_s=120)
URL = "http://127.0.0.1:8080"


def firing(group: str = "billing-eu", value: float = 12_345) -> Transition:
    return Transition(
        rule=RULE,
        labels=(("group", group), ("topic", "orders")),
        status="firing",
        value=value,
        threshold=10_000,
        unit="messages",
        starts_at=1_795_000_000.0,
    )


class Receiver:
    """A webhook receiver answering each POST with the next status of ``codes``."""

    def __init__(self, codes: list[int]) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                receiver.headers.append(dict(self.headers))
                self.send_response(codes.pop(0) if codes else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver([])
    yield r
    r.server.shutdown()
    r.server.server_close()


def hook(url: str) -> Notifier:
    return Notifier("ops", "webhook", {"url": url, "headers": {"X-Token": "t"}, "timeout": 5.0})


def test_webhook_posts_alertmanager_format(receiver: Receiver) -> None:
    dispatcher = Dispatcher(AlarmConfig((RULE,), (hook(receiver.url),)), URL)
    asyncio.run(dispatcher.dispatch([firing(), firing("billing-us")], 0.0))
    (body,) = receiver.bodies  # one POST per round, whatever the number of alarms
    assert (body["version"], body["receiver"], body["status"]) == ("4", "ops", "firing")
    first = body["alerts"][0]
    assert first["labels"] == {
        "alertname": "billing-lag",
        "type": "group_lag",
        "group": "billing-eu",
        "topic": "orders",
        "source": "equeue",
    }
    assert first["annotations"]["summary"].startswith("group billing-eu lags 12,345 messages")
    assert first["endsAt"] == "0001-01-01T00:00:00Z"
    assert first["generatorURL"] == f"{URL}/groups/billing-eu"
    assert first["equeue"] == {
        "value": 12_345,
        "threshold": 10_000,
        "unit": "messages",
        "repeat": 0,
    }
    assert len(first["fingerprint"]) == 16
    assert receiver.headers[0]["X-Token"] == "t"
    assert receiver.headers[0]["Content-Type"] == "application/json"
    assert 'equeue_alarm_notifications_total{notifier="ops",status="firing",result="sent"} 2' in (
        dispatcher.metrics()
    )


def test_webhook_retries_5xx_but_not_4xx() -> None:
    slept: list[float] = []
    flaky = Receiver([503, 502])
    try:
        post_webhook(hook(flaky.url), {"x": 1}, sleep=slept.append)
        assert (len(flaky.bodies), slept) == (3, [1.0, 2.0])
    finally:
        flaky.server.shutdown()
        flaky.server.server_close()
    rejecting = Receiver([400])
    try:
        with pytest.raises(SendError, match="HTTP 400"):
            post_webhook(hook(rejecting.url), {"x": 1}, sleep=slept.append)
        assert len(rejecting.bodies) == 1
    finally:
        rejecting.server.shutdown()
        rejecting.server.server_close()


def test_a_failed_send_is_counted_and_retried_next_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: connection refused
    bad = Notifier("dead", "webhook", {"url": f"http://127.0.0.1:{port}/", "timeout": 1.0})
    dispatcher = Dispatcher(AlarmConfig((RULE,), (bad,)), URL)
    monkeypatch.setattr(notify, "WEBHOOK_BACKOFF_S", ())  # no back-off waits here
    asyncio.run(dispatcher.dispatch([firing()], 0.0))
    assert dispatcher.views()[0]["waiting"] == 1
    assert "dead" in str(dispatcher.views()[0]["last_error"])
    asyncio.run(dispatcher.dispatch([], 5.0))
    asyncio.run(dispatcher.dispatch([], 10.0))
    assert dispatcher.views()[0]["waiting"] == 0  # given up after 3 rounds
    failed = 'equeue_alarm_notifications_total{notifier="dead",status="firing",result="failed"} 3'
    assert failed in dispatcher.metrics()


def test_at_most_ten_notifications_a_minute_then_held(receiver: Receiver) -> None:
    dispatcher = Dispatcher(AlarmConfig((RULE,), (hook(receiver.url),)), URL)
    for i in range(PER_MINUTE + 3):
        asyncio.run(dispatcher.dispatch([firing(f"g{i}")], float(i)))
    assert len(receiver.bodies) == PER_MINUTE
    asyncio.run(dispatcher.dispatch([], 61.0))  # the next minute: the held three in one POST
    assert len(receiver.bodies) == PER_MINUTE + 1
    assert [a["labels"]["group"] for a in receiver.bodies[-1]["alerts"]] == ["g10", "g11", "g12"]


class Sink:
    def __init__(self) -> None:
        self.messages: list[Envelope] = []

    async def handle_DATA(self, server: Any, session: Session, envelope: Envelope) -> str:  # noqa: N802
        self.messages.append(envelope)
        return "250 OK"


def authenticate(
    server: Any, session: Session, envelope: Envelope, mechanism: str, data: Any
) -> AuthResult:
    ok = isinstance(data, LoginPassword) and (data.login, data.password) == (b"alarm", b"pw")
    return AuthResult(success=ok)


@pytest.fixture
def smtp() -> Iterator[tuple[Sink, int]]:
    sink = Sink()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    controller = Controller(
        sink, hostname="127.0.0.1", port=port, authenticator=authenticate, auth_require_tls=False
    )
    controller.start()  # returns once the server answers
    yield sink, port
    controller.stop()


def test_email_through_a_loopback_relay_with_login(smtp: tuple[Sink, int], tmp_path: Any) -> None:
    sink, port = smtp
    password = tmp_path / "pw"
    password.write_text("pw\n")
    mail = Notifier(
        "mail",
        "email",
        {
            "to": ("ops@example.com",),
            "smtp": f"127.0.0.1:{port}",
            "tls": "auto",
            "username": "alarm",
            "password_file": str(password),
            "from": "eq@example.com",
        },
    )
    msg = email_message(mail, [firing(), firing("billing-us")], URL)
    send_email(mail, msg)
    (envelope,) = sink.messages
    assert envelope.rcpt_tos == ["ops@example.com"]
    text = (
        envelope.content.decode() if isinstance(envelope.content, bytes) else str(envelope.content)
    )
    assert "[equeue FIRING] billing-lag: group billing-eu lags 12,345 messages" in text
    assert "(+1 more)" in text and f"{URL}/alarms" in text
    wrong = Notifier("mail", "email", {**mail.settings, "password_file": str(tmp_path / "no")})
    with pytest.raises(SendError, match="cannot read"):
        send_email(wrong, msg)


def test_starttls_mode_fails_clearly_when_the_server_offers_none(smtp: tuple[Sink, int]) -> None:
    _, port = smtp
    mail = Notifier(
        "mail", "email", {"to": ("ops@x",), "smtp": f"127.0.0.1:{port}", "tls": "starttls"}
    )
    with pytest.raises(SendError, match="mail"):
        send_email(mail, email_message(mail, [firing()], URL))  # server offers no STARTTLS
