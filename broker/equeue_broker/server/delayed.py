"""Delayed produce and cancel: the server's side of the store's timer.

A ``ProduceRequest`` with ``deliver_at_ms`` is appended with the store's
``deliver_at_ms`` (written to the log once, delivered by the store's timer on
the master: storage/timer); the reply carries offset -1 for every message (it
takes its offset when delivered) and each message's due time. The store checks
the times against ``--max-delay`` and its past tolerance and names the bad
value; this module checks the request's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from equeue_broker.server.errors import BadRequest
from equeue_broker.storage import MessageBatch, NotFound, Store
from equeue_broker.storage.producers.table import Idempotence
from equeue_proto.protocol import parse_message_id
from equeue_proto.v1 import broker_pb2 as pb

Parts = list[tuple[int, list[int] | None, MessageBatch]]
"""[(queue, message indexes, those messages)]; indexes None: every message."""


def delivery_times(request: pb.ProduceRequest, count: int) -> list[int] | None:
    """The request's ``deliver_at_ms`` (one for all, or one per message), or
    None for a plain produce; BadRequest for a shape the store cannot take."""
    times = list(request.deliver_at_ms)
    if not times:
        return None
    if request.transaction_id:
        raise BadRequest(
            f"deliver_at_ms cannot be combined with transaction_id {request.transaction_id!r}:"
            " a transaction's messages become readable when it commits; produce delayed"
            " messages without a transaction"
        )
    if len(times) not in (1, count):
        raise BadRequest(
            f"deliver_at_ms has {len(times)} entries for {count} messages: give one for all"
            " or one per message"
        )
    return times


def append_delayed(
    store: Store,
    topic: str,
    parts: Parts,
    times: Sequence[int],
    *,
    broker_id: str,
    count: int,
    sequences: dict[int, Idempotence] | None,
    counted: Callable[[int, int, int], None],
) -> pb.ProduceReply:
    """Append each queue's share of the ``count`` messages delayed; the reply
    (offsets -1). ``counted(queue, messages, stored bytes)`` for each append:
    delayed messages count as produced when accepted (written to the log),
    not again when the timer delivers them (a delivery writes a commit record,
    not the messages)."""
    queue_ids = [0] * count
    positions = [0] * count
    for queue_id, indexes, sub in parts:
        when = list(times) if len(times) == 1 or indexes is None else [times[i] for i in indexes]
        idem = None if sequences is None else sequences[queue_id]
        result = store.append(topic, queue_id, sub, idem, deliver_at_ms=when)
        if not result.duplicate:
            counted(queue_id, result.count, result.nbytes)
        where = range(count) if indexes is None else indexes
        for i, position in zip(where, result.positions(), strict=True):
            queue_ids[i] = queue_id
            positions[i] = position
    due = list(times) * count if len(times) == 1 else list(times)
    return pb.ProduceReply(
        broker_id=broker_id,
        queue_ids=queue_ids,
        offsets=[-1] * count,
        positions=positions,
        deliver_at_ms=due,
    )


def cancel(
    store: Store,
    broker_ids: Sequence[str],
    message_id: str,
    check: Callable[[str], None] | None = None,
) -> pb.CancelDelayedReply:
    """Cancel the pending delayed message ``message_id`` names; ``check(topic)``
    refuses it (a token limited to topics that do not include its topic)."""
    try:
        broker_id, position = parse_message_id(message_id)
    except ValueError as exc:
        raise BadRequest(f"{exc}: give the id Produce returned") from None
    if broker_id not in broker_ids:
        raise NotFound(
            f"message {message_id!r} is from broker {broker_id!r}, not this one "
            f"({broker_ids[0]!r}): cancel it on the broker that took it"
        )
    try:
        pending = store.cancel_delayed(position, check)
    except NotFound:
        raise NotFound(
            f"message {message_id!r} is no pending delayed message: it is unknown, "
            "already delivered or already cancelled"
        ) from None
    return pb.CancelDelayedReply(
        topic=pending.topic, queue_id=pending.queue_id, deliver_at_ms=pending.deliver_at_ms
    )
