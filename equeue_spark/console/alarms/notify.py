"""Sending a round's alarm transitions (design 30, 3.5): one webhook POST in
Alertmanager's webhook format (version 4) and one email per notifier and
round, at most ``PER_MINUTE`` notifications per notifier per minute (the rest
held and sent as one summary later), a failed send retried with the next
rounds (at most ``RETRY_ROUNDS``). Blocking I/O (``urllib``, ``smtplib``) runs
in ``asyncio.to_thread`` so the console's loop never waits on it.
"""

from __future__ import annotations

import asyncio
import email.policy
import hashlib
import json
import logging
import os
import smtplib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any

from equeue_spark.console.alarms.engine import Transition
from equeue_spark.console.alarms.rules import AlarmConfig, Notifier, is_loopback, smtp_host_port

log = logging.getLogger(__name__)

PER_MINUTE = 10
"""Notifications per notifier per minute; transitions past it wait for the next."""
MAX_ALERTS = 50
"""Alerts listed in one notification; the rest are counted ("12 more")."""
RETRY_ROUNDS = 3
WEBHOOK_BACKOFF_S: tuple[float, ...] = (1.0, 2.0, 4.0)
SMTP_TIMEOUT_S = 10.0
ZERO_TIME = "0001-01-01T00:00:00Z"
MAIL_POLICY = email.policy.default.clone(max_line_length=998)
"""RFC 5322's hard limit: the default (78) folds a subject that starts with
"[" right after "Subject:", which parsers then read with a leading space."""


class SendError(Exception):
    """A notification that could not be delivered (logged, counted, retried)."""


def fingerprint(t: Transition) -> str:
    text = json.dumps([t.rule.name, list(t.labels)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _iso(seconds: float | None) -> str:
    if seconds is None:
        return ZERO_TIME
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def alert(t: Transition, external_url: str) -> dict[str, Any]:
    labels = {"alertname": t.rule.name, "type": t.rule.type, **dict(t.labels), "source": "equeue"}
    group = dict(t.labels).get("group")
    return {
        "status": t.status,
        "labels": labels,
        "annotations": {"summary": t.summary, **({"reason": t.reason} if t.reason else {})},
        "startsAt": _iso(t.starts_at),
        "endsAt": _iso(t.ends_at),
        "generatorURL": f"{external_url}/groups/{group}" if group else external_url,
        "fingerprint": fingerprint(t),
        "equeue": {"value": t.value, "threshold": t.threshold, "unit": t.unit, "repeat": t.repeat},
    }


def webhook_body(
    receiver: str, transitions: Sequence[Transition], external_url: str, held: int = 0
) -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) plus an ``equeue`` object per alert."""
    status = "firing" if any(t.status == "firing" for t in transitions) else "resolved"
    host = external_url.split("://", 1)[-1]
    return {
        "version": "4",
        "receiver": receiver,
        "status": status,
        "groupKey": f"equeue-console:{host}",
        "truncatedAlerts": held,
        "groupLabels": {},
        "commonLabels": {"source": "equeue"},
        "commonAnnotations": {},
        "externalURL": external_url,
        "alerts": [alert(t, external_url) for t in transitions],
    }


def email_message(
    notifier: Notifier, transitions: Sequence[Transition], external_url: str, held: int = 0
) -> EmailMessage:
    first = transitions[0]
    more = len(transitions) - 1 + held
    subject = f"[equeue {first.status.upper()}] {first.rule.name}: {first.summary}"
    msg = EmailMessage(policy=MAIL_POLICY)
    msg["Subject"] = subject + (f" (+{more} more)" if more else "")
    msg["From"] = notifier.settings.get("from") or f"equeue@{socket.gethostname()}"
    msg["To"] = ", ".join(notifier.settings["to"])
    lines = []
    for t in transitions:
        since = _iso(t.starts_at)
        lines.append(
            f"{t.status.upper()} {t.rule.name}: {t.summary}\n"
            f"  value {t.value} {t.unit}, threshold {t.threshold}, since {since}"
            + (f", repeat {t.repeat}" if t.repeat else "")
            + (f", reason {t.reason}" if t.reason else "")
        )
    if held:
        lines.append(f"{held} more alarms changed (held by the limit of {PER_MINUTE} a minute)")
    lines.append(f"Console: {external_url}/alarms")
    msg.set_content("\n\n".join(lines) + "\n")
    return msg


def post_webhook(
    notifier: Notifier, body: dict[str, Any], sleep: Callable[[float], None] = time.sleep
) -> None:
    """POST with 3 retries (1 s, 2 s, 4 s apart) on connection errors and 5xx, none on 4xx."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **notifier.settings.get("headers", {})}
    timeout = float(notifier.settings.get("timeout", 5.0))
    last = ""
    for delay in (0.0, *WEBHOOK_BACKOFF_S):
        if delay:
            sleep(delay)
        request = urllib.request.Request(notifier.settings["url"], data, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
                return
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
            if e.code < 500:
                break
        except (OSError, TimeoutError) as e:
            last = str(getattr(e, "reason", e))
    raise SendError(f"webhook {notifier.name} ({notifier.settings['url']}): {last}")


def send_email(notifier: Notifier, msg: EmailMessage) -> None:
    """SMTP_SSL for ``tls`` (and ``auto`` on 465), else STARTTLS when offered
    (required with a user, except to a loopback relay), then AUTH LOGIN."""
    s = notifier.settings
    host, port = smtp_host_port(s["smtp"])
    mode = s.get("tls", "auto")
    user = s.get("username")
    ctx = ssl.create_default_context(cafile=s.get("ca_file"))
    try:
        if mode == "tls" or (mode == "auto" and port == 465):
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(host, port, timeout=SMTP_TIMEOUT_S, context=ctx)
        else:
            smtp = smtplib.SMTP(host, port, timeout=SMTP_TIMEOUT_S)
        with smtp:
            smtp.ehlo()
            if mode == "starttls" or (
                mode == "auto" and not isinstance(smtp, smtplib.SMTP_SSL) and _offers_tls(smtp)
            ):
                smtp.starttls(context=ctx)
                smtp.ehlo()
            encrypted = isinstance(smtp.sock, ssl.SSLSocket)
            if user:
                if not encrypted and not is_loopback(host):
                    raise SendError(
                        f"email {notifier.name}: {host} offers no STARTTLS; "
                        "refusing to send the password in clear"
                    )
                smtp.login(user, _password(notifier))
            smtp.send_message(msg)
    except (OSError, smtplib.SMTPException, ssl.SSLError) as e:
        raise SendError(f"email {notifier.name} ({host}:{port}): {e}") from None


def _offers_tls(smtp: smtplib.SMTP) -> bool:
    return smtp.has_extn("starttls")


def _password(notifier: Notifier) -> str:
    path = notifier.settings.get("password_file")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            raise SendError(f"email {notifier.name}: cannot read {path} ({e.strerror})") from None
    password = os.environ.get("EQUEUE_SMTP_PASSWORD")
    if password is None:
        raise SendError(
            f"email {notifier.name}: a user is set but no password "
            "(--smtp-password-file or $EQUEUE_SMTP_PASSWORD)"
        )
    return password


@dataclass
class _Outbox:
    """One notifier's queue: transitions waiting for the rate limit or a retry."""

    pending: list[tuple[Transition, int]] = field(default_factory=list)
    """(transition, failed rounds so far)"""
    sent_at: list[float] = field(default_factory=list)
    last_error: str = ""


class Dispatcher:
    """Groups each round's transitions per notifier, limits and retries them,
    and counts the results for /metrics."""

    def __init__(self, config: AlarmConfig, external_url: str) -> None:
        self._config = config
        self.external_url = external_url
        """The console's address, for links (set once the listener is bound)."""
        self._out = {n.name: _Outbox() for n in config.notifiers}
        self.counts: dict[tuple[str, str, str], int] = {}
        """(notifier, status, result) -> notifications."""
        self.stopping = threading.Event()
        """Set when the console stops: a webhook waiting to retry gives up
        at once rather than holding the process's exit for its back-off."""

    def _backoff(self, seconds: float) -> None:
        if self.stopping.wait(seconds):
            raise SendError("the console is stopping")

    async def dispatch(self, transitions: Sequence[Transition], now: float) -> None:
        sends = []
        for n in self._config.notifiers:
            box = self._out[n.name]
            box.pending += [(t, 0) for t in transitions if n in self._config.notifiers_for(t.rule)]
            box.sent_at = [at for at in box.sent_at if now - at < 60.0]
            if box.pending and len(box.sent_at) < PER_MINUTE:
                sends.append(self._send(n, box, now))
        await asyncio.gather(*sends)

    async def _send(self, n: Notifier, box: _Outbox, now: float) -> None:
        batch, box.pending = box.pending, []
        # one notification per round; a huge round lists MAX_ALERTS and counts the rest
        shown = [t for t, _ in batch][:MAX_ALERTS]
        held = len(batch) - len(shown)
        box.sent_at.append(now)
        try:
            if n.type == "webhook":
                body = webhook_body(n.name, shown, self.external_url, held)
                await asyncio.to_thread(post_webhook, n, body, self._backoff)
            else:
                msg = email_message(n, shown, self.external_url, held)
                await asyncio.to_thread(send_email, n, msg)
            result, box.last_error = "sent", ""
        except SendError as e:
            log.warning("alarm notification failed: %s", e)
            result, box.last_error = "failed", str(e)
            box.pending = [(t, tries + 1) for t, tries in batch if tries + 1 < RETRY_ROUNDS]
        for t, _ in batch:
            key = (n.name, t.status, result)
            self.counts[key] = self.counts.get(key, 0) + 1

    def views(self) -> list[dict[str, object]]:
        return [
            {
                "notifier": n.name,
                "type": n.type,
                "waiting": len(self._out[n.name].pending),
                "last_error": self._out[n.name].last_error,
            }
            for n in self._config.notifiers
        ]

    def metrics(self) -> list[str]:
        name = "equeue_alarm_notifications_total"
        lines = [
            f"# HELP {name} alarm notifications by notifier, status and result",
            f"# TYPE {name} counter",
        ]
        for (notifier, status, result), count in sorted(self.counts.items()):
            lines.append(
                f'{name}{{notifier="{notifier}",status="{status}",result="{result}"}} {count}'
            )
        return lines
