"""The shared test helpers of tests/support/observability.py work as the
console's alarm tests will use them: a real SMTP exchange (STARTTLS, AUTH)
and a real webhook POST."""

from __future__ import annotations

import json
import smtplib
import ssl
import urllib.request
from email.message import EmailMessage
from pathlib import Path

import pytest

from tests.support.observability import SmtpSink, WebhookSink


@pytest.mark.filterwarnings("ignore:Session.login_data is deprecated:DeprecationWarning")
def test_smtp_sink_requires_starttls_and_auth(tmp_path: Path) -> None:
    with SmtpSink(tmp_path) as sink:
        message = EmailMessage()
        message["Subject"], message["From"], message["To"] = "[equeue FIRING]", "a@x", "ops@x"
        message.set_content("lag")
        with (
            smtplib.SMTP("127.0.0.1", sink.port, timeout=10) as client,
            pytest.raises(smtplib.SMTPException),
        ):
            client.send_message(message)  # no STARTTLS yet: refused
        with smtplib.SMTP("127.0.0.1", sink.port, timeout=10) as client:
            client.starttls(context=ssl.create_default_context(cafile=str(sink.ca_file)))
            client.login(sink.user, sink.password)
            client.send_message(message)
    assert [m["Subject"] for m in sink.messages] == ["[equeue FIRING]"]
    assert sink.authenticated == [True]


def test_webhook_sink_collects_posted_json() -> None:
    with WebhookSink() as sink:
        request = urllib.request.Request(
            sink.url, data=json.dumps({"status": "firing"}).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
    assert sink.received == [{"status": "firing"}]
