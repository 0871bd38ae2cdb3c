"""Rules both ends of the contract must agree on, beyond the message shapes.

Lives beside the generated code so that the broker and the client share one
copy without either importing the other.
"""

from __future__ import annotations

from collections.abc import Sequence

MESSAGE_ID_HEX_DIGITS = 16

BROKER_TIME = -1
"""A message timestamp of -1 in a produce request: "none given", stamp the
message with the broker's store time (as an empty ``timestamps_ms`` column
does for a whole batch). Lets one batch mix given and missing timestamps."""


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

    Every member computes the same answer from the same heartbeat reply, so a
    group agrees on who reads what without a coordinator.
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
