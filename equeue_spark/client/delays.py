"""Delayed delivery on the client side: delivery times and durations.

A message produced with a delivery time (broker.proto, "Delayed delivery") is
written at once but read by nobody until then. ``Producer.send_batch`` takes
``delay_s`` (seconds from now) or ``deliver_at`` (an aware ``datetime``; a
naive one is taken as UTC; or ms since the epoch), for the batch, or one per
message; this module turns either into ``ProduceRequest.deliver_at_ms``.

The broker checks the times (no further ahead than its ``--max-delay``, not
further back than its tolerance); here only what is wrong whatever the
broker says is refused: a negative delay, both forms at once, a sequence of
the wrong length, a time before 1970.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Sequence

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import InvalidRequest

When = dt.datetime | int
"""A delivery time: a ``datetime`` (naive = UTC) or ms since the epoch."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_FORMS = "a duration like 500ms, 30s, 1.5m, 2h or 7d (a bare number is seconds)"


def parse_duration_s(text: str) -> float:
    """Seconds in ``text``: a number and an optional unit (ms, s, m, h, d;
    none = seconds). ValueError naming the text and the forms taken."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not {DURATION_FORMS}")
    return float(match.group(1)) * _UNIT_S[(match.group(2) or "s").lower()]


def parse_time_ms(text: str) -> int:
    """ms since the epoch of an ISO 8601 time (``2027-01-31T09:00:00+01:00``;
    ``Z`` for UTC; without a zone: UTC). ValueError naming the text."""
    try:
        parsed = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO 8601 time like 2027-01-31T09:00:00Z "
            "(a time without a zone is UTC)"
        ) from None
    return time_ms(parsed)


def time_ms(when: When) -> int:
    """ms since the epoch of a delivery time (a naive ``datetime`` is UTC)."""
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        ms = round(when.timestamp() * 1000)
    elif isinstance(when, int) and not isinstance(when, bool):
        ms = when
    else:
        raise InvalidRequest(
            f"deliver_at {when!r}: give a datetime or an int of ms since the epoch"
        )
    if ms < 0:
        raise InvalidRequest(f"deliver_at {when!r} is before 1970; give a time to deliver at")
    return ms


def _delay_ms(delay_s: float, now_ms: int) -> int:
    if isinstance(delay_s, bool) or not isinstance(delay_s, int | float):
        raise InvalidRequest(f"delay_s {delay_s!r}: give a number of seconds")
    if not math.isfinite(delay_s) or delay_s < 0:
        raise InvalidRequest(f"delay_s {delay_s!r} must be a finite number of seconds >= 0")
    return now_ms + round(delay_s * 1000)


def deliver_at_ms(
    count: int,
    delay_s: float | Sequence[float] | None = None,
    deliver_at: When | Sequence[When] | None = None,
    now_ms: int | None = None,
) -> list[int]:
    """``ProduceRequest.deliver_at_ms`` for a batch of ``count`` messages:
    empty (deliver now) when neither is given; one entry for a batch-wide
    time; ``count`` entries for one per message."""
    if delay_s is not None and deliver_at is not None:
        raise InvalidRequest("give delay_s or deliver_at, not both")
    if delay_s is None and deliver_at is None:
        return []
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if delay_s is not None:
        if isinstance(delay_s, Sequence):
            return _per_message("delay_s", [_delay_ms(d, now) for d in delay_s], count)
        return [_delay_ms(delay_s, now)]
    assert deliver_at is not None
    if isinstance(deliver_at, Sequence):
        return _per_message("deliver_at", [time_ms(w) for w in deliver_at], count)
    return [time_ms(deliver_at)]


def _per_message(name: str, times: list[int], count: int) -> list[int]:
    if len(times) != count:
        raise InvalidRequest(f"{name} has {len(times)} items for {count} messages; give one each")
    return times


def refuse_staged(request: pb.ProduceRequest) -> None:
    """A transaction's messages become readable at its commit: a delayed one
    cannot be one of them (the broker would refuse it; say why here)."""
    if request.transaction_id and len(request.deliver_at_ms):
        raise staged_delay_error(request.transaction_id)


def staged_delay_error(txn_id: str) -> InvalidRequest:
    return InvalidRequest(
        f"transaction {txn_id!r}: a delayed message cannot be staged in a transaction "
        "(its messages become readable at the commit); send it outside the transaction "
        "with Producer.send_batch(..., delay_s=...)"
    )
