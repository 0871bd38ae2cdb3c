"""Rules both ends of the contract must agree on, beyond the message shapes.

Lives beside the generated code so that the broker and the client share one
copy without either importing the other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MESSAGE_ID_HEX_DIGITS = 16
MAX_CONSUMER_ID = 128
_CONSUMER_ID = re.compile(r"[A-Za-z0-9._:@/-]+")
_NOT_CONSUMER_ID = re.compile(r"[^A-Za-z0-9._:@/-]")


def consumer_id_problem(consumer_id: str) -> str | None:
    """Why the broker refuses a consumer id, or None. Consumer ids are shown by
    DescribeGroup, the CLI and logs, so they are short and printable as they are:
    1-128 ASCII letters, digits and ``. _ : @ / -``."""
    if 0 < len(consumer_id) <= MAX_CONSUMER_ID and _CONSUMER_ID.fullmatch(consumer_id):
        return None
    shown = repr(consumer_id[:64]) + ("..." if len(consumer_id) > 64 else "")
    return (
        f"consumer_id {shown} ({len(consumer_id)} characters) is invalid: give 1 to "
        f"{MAX_CONSUMER_ID} ASCII letters, digits, '.', '_', ':', '@', '/' or '-'"
    )


def default_consumer_id(hostname: str, pid: int, suffix: str) -> str:
    """``<host>-<pid>-<suffix>``, made valid whatever the host name holds."""
    host = _NOT_CONSUMER_ID.sub("_", hostname)[:64] or "host"
    return f"{host}-{pid}-{suffix}"[:MAX_CONSUMER_ID]


def format_message_id(broker_id: str, position: int) -> str:
    """``<broker_id>-<log position as 16 hex digits>``: a message id names the
    broker and the record's place in its log, so it is looked up directly."""
    return f"{broker_id}-{position:0{MESSAGE_ID_HEX_DIGITS}x}"


def parse_message_id(message_id: str) -> tuple[str, int]:
    """(broker_id, position) of a message id; ``ValueError`` naming it if malformed."""
    broker_id, sep, digits = message_id.rpartition("-")
    if not sep or not broker_id or len(digits) != MESSAGE_ID_HEX_DIGITS:
        raise ValueError(f"malformed message id {message_id!r}")
    try:
        return broker_id, int(digits, 16)
    except ValueError:
        raise ValueError(f"malformed message id {message_id!r}") from None


def allocate_average(queue_ids: Sequence[int], consumer_ids: Sequence[str]) -> dict[str, list[int]]:
    """EQueue's average allocation: consumers (sorted) get contiguous ranges of
    the queues (sorted); the first ``len(queues) % len(consumers)`` get one more.

    The broker computes it over a topic's live subscribers at each heartbeat
    and grants the queues as locks (broker/server/groups.py); DescribeGroup
    reports it as each queue's owner.
    """
    queues = sorted(queue_ids)
    consumers = sorted(consumer_ids)
    if not consumers:
        return {}
    base, extra = divmod(len(queues), len(consumers))
    out: dict[str, list[int]] = {}
    start = 0
    for i, consumer in enumerate(consumers):
        size = base + (1 if i < extra else 0)
        out[consumer] = queues[start : start + size]
        start += size
    return out
