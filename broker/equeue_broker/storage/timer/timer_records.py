"""The timer's control records: "deliver" and "cancel", written into the message log.

A delayed record (``equeue_proto.record``: flags TXN | DELAYED, its due time
in ms as ``queue_offset``) is written once, when it is appended, and is
invisible like a transaction's staged record. What becomes of it is told by
control records of txn_records.py's framing (CONTROL flag, topic "", queue 0,
offset 0, the kind as tag, a compact UTF-8 JSON object as value)::

    tag "deliver" {"positions": [p, ...],
                   "queues": [[topic, queue_id, first_offset, count], ...],
                   "through": [due_ms, position],
                   "from": [due_ms, position],
                   "dropped": [p, ...]}
                  the delayed records at ``positions`` (in (due, position)
                  order) take offsets like a transaction commit's records:
                  each listed queue's records, in the order of ``positions``,
                  the offsets ``first_offset`` .. ``first_offset + count - 1``
                  (store time: this record's); a position whose queue is
                  not listed was dropped (its queue was deleted), and so was
                  each of ``dropped`` (optional; written before its topic's
                  current incarnation: the topic was deleted and created
                  again while it waited). ``through``
                  is the timer watermark after it: every delayed record with
                  (due, position) <= ``through`` is delivered or cancelled;
                  ``from`` is the watermark before it (a replica that cuts
                  this record off goes back there).
    tag "cancel"  {"position": p, "due": ms}
                  the delayed record at ``p`` (due at ``due``) is never
                  delivered.

Unknown keys are ignored, so fields can be added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from equeue_broker.storage.config import MessageLimits
from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.index.queue_state import QueueKey
from equeue_broker.storage.log.record import MessageBatch, PreparedBatch, prepare_batch

DELIVER, CANCEL = "deliver", "cancel"
TAGS = frozenset((DELIVER, CANCEL))
_LIMITS = MessageLimits(max_batch_bytes=1 << 30, max_message_bytes=1 << 30)
"""Control records are the broker's own: not held to client limits."""

Key = tuple[int, int]
"""(due ms, log position): the order delayed records are delivered in."""


@dataclass(frozen=True)
class Deliver:
    positions: tuple[int, ...]
    queues: tuple[tuple[QueueKey, int, int], ...]
    """((topic, queue_id), first offset, count) per queue."""
    through: Key
    before: Key
    dropped: tuple[int, ...] = ()
    """Positions not delivered although their queue exists: written for an
    earlier incarnation of their topic."""


@dataclass(frozen=True)
class Cancel:
    position: int
    due_ms: int


TimerControl = Deliver | Cancel


def encode_value(control: TimerControl) -> tuple[str, bytes]:
    """(tag, value) of a timer control record."""
    document: dict[str, Any]
    if isinstance(control, Deliver):
        tag = DELIVER
        document = {
            "positions": list(control.positions),
            "queues": [[t, q, first, n] for (t, q), first, n in control.queues],
            "through": list(control.through),
            "from": list(control.before),
        }
        if control.dropped:
            document["dropped"] = list(control.dropped)
    else:
        tag, document = CANCEL, {"position": control.position, "due": control.due_ms}
    return tag, json.dumps(document, separators=(",", ":")).encode()


def decode_value(tag: str, value: bytes) -> TimerControl:
    """The timer control record of ``tag`` and ``value``; ``CorruptionError`` if
    it is not one (its checksum passed: a bug, or a newer broker)."""
    try:
        document = json.loads(value)
        if tag == DELIVER:
            queues = tuple(((str(t), int(q)), int(f), int(n)) for t, q, f, n in document["queues"])
            through = document["through"]
            before = document["from"]
            return Deliver(
                tuple(int(p) for p in document["positions"]),
                queues,
                (int(through[0]), int(through[1])),
                (int(before[0]), int(before[1])),
                tuple(int(p) for p in document.get("dropped", ())),
            )
        if tag == CANCEL:
            return Cancel(int(document["position"]), int(document["due"]))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CorruptionError(f"unreadable {tag!r} control record: {exc}") from None
    raise CorruptionError(f"unknown timer control record {tag!r}")


def prepare_timer_control(control: TimerControl) -> PreparedBatch:
    """The control record as a one-message batch for the log writer."""
    tag, value = encode_value(control)
    return prepare_batch(MessageBatch([value], tags=[tag]), b"", _LIMITS)
