"""Giving messages back: ``Consumer.nack`` and the group's retry topic.

A consumer of group G that cannot process a message gives it back with
``nack``; the broker copies it to ``%RETRY%G`` for a later delivery (the
group's next back-off step, or the delay given) or, past
``max_reconsume_times``, to ``%DLQ%G`` (broker.proto, "Retry and dead
letters"). The consumer's own position moves on as usual.

A consumer of G reads ``%RETRY%G`` beside its topics (consumer.py). What it
reads there is handed to the application as a ``RetryMessage``: topic, queue
and offset of the origin (from the copy's headers), so the application sees
the message it failed on; the copy's own address stays inside it, for the
next ``nack`` of it (the broker then counts one more delivery) and for the
retry topic's progress, which the consumer commits like any queue's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from equeue_proto.retry_topics import ORIGIN_TOPIC
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import EqueueError, InvalidRequest
from equeue_spark.client.records import Message
from equeue_spark.client.route import name_broker

if TYPE_CHECKING:
    from equeue_spark.client.connection import Connection
    from equeue_spark.client.routing import Routes

MAX_ERROR_BYTES = 1024
"""Error text kept with a given-back message (the broker keeps no more)."""
MAX_NACK_ENTRIES = 1_000
"""Messages per Nack request (the broker's limit); more are sent in several."""
MAX_RECONSUME_TIMES = 0xFFFF_FFFF


class RetryMessage(Message):
    """A message read from the group's retry topic, as the application sees
    it: ``topic``/``queue_id``/``offset`` are its origin's; ``retry`` is
    True and ``deliveries`` counts this delivery. ``message_id`` names the
    copy in the retry topic (``Admin.get_message`` fetches it);
    ``origin.message_id`` the original."""

    retry_address: tuple[str, int, int]
    """(retry topic, queue id, offset) of the copy read: what ``nack`` names."""

    @property
    def deliveries(self) -> int:
        return super().deliveries + 1


def redelivered(message: Message) -> Message:
    """``message`` read from a retry topic, dressed as its origin (module doc);
    a copy without origin headers (not the broker's) is left as it is."""
    origin = message.origin
    if origin is None:
        return message
    out = RetryMessage(*message._replace(
        topic=origin.topic, queue_id=origin.queue_id, offset=origin.offset
    ))  # fmt: skip
    out.retry_address = (message.topic, message.queue_id, message.offset)
    return out


def is_retry_copy(message: Message, retry: str) -> bool:
    return message.topic == retry and any(k == ORIGIN_TOPIC for k, _ in message.headers)


def check_reconsume_times(value: int | None) -> int:
    """``NackRequest.max_reconsume_times`` (0: the broker's default)."""
    if value is None:
        return 0
    bad = isinstance(value, bool) or not isinstance(value, int)
    if bad or not 0 <= value <= MAX_RECONSUME_TIMES:
        raise ValueError(
            f"max_reconsume_times must be an int from 0 (the broker's default) to "
            f"{MAX_RECONSUME_TIMES}, got {value!r}"
        )
    return value


def _delay_ms(delay_s: float | None) -> int:
    if delay_s is None:
        return -1
    if (
        isinstance(delay_s, bool)
        or not isinstance(delay_s, int | float)
        or not (0 <= delay_s < float("inf"))
    ):
        raise InvalidRequest(f"delay_s {delay_s!r} must be a number of seconds >= 0 (or None)")
    return round(delay_s * 1000)


def _error_text(error: object) -> str:
    if error is None:
        return ""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    encoded = text.encode("utf-8")
    if len(encoded) <= MAX_ERROR_BYTES:
        return text
    return encoded[:MAX_ERROR_BYTES].decode("utf-8", "ignore")


def address_of(message: Message) -> tuple[str, int, int]:
    """Where the broker finds the copy to give back: the retry topic's
    address for a retried message, else its own."""
    if isinstance(message, RetryMessage):
        return message.retry_address
    return message.topic, message.queue_id, message.offset


def send_nacks(
    routes: Routes,
    group: str,
    messages: Sequence[Message],
    *,
    delay_s: float | None,
    error: object,
    max_reconsume_times: int,
) -> list[pb.NackOutcome]:
    """Give ``messages`` back, one Nack request per broker group holding
    some (its master, ``Routes.on_master``); outcomes in ``messages`` order.
    An error names the broker group; groups asked before it stand."""
    delay_ms = _delay_ms(delay_s)
    text = _error_text(error)
    by_group: dict[str, list[int]] = {}
    for i, message in enumerate(messages):
        by_group.setdefault(routes.message_group(message.broker_id), []).append(i)
    outcomes: list[pb.NackOutcome | None] = [None] * len(messages)
    for broker, rows in sorted(by_group.items()):
        for start in range(0, len(rows), MAX_NACK_ENTRIES):
            chunk = rows[start : start + MAX_NACK_ENTRIES]
            request = pb.NackRequest(group=group, max_reconsume_times=max_reconsume_times)
            for i in chunk:
                topic, queue_id, offset = address_of(messages[i])
                request.entries.add(
                    topic=topic, queue_id=queue_id, offset=offset, delay_ms=delay_ms, error=text
                )
            reply = _nack_on(routes, broker, request)
            if len(reply.outcomes) != len(chunk):
                raise EqueueError(
                    f"broker {broker!r} answered {len(reply.outcomes)} of {len(chunk)} nacks"
                )
            for i, outcome in zip(chunk, reply.outcomes, strict=True):
                outcomes[i] = outcome
    return [o for o in outcomes if o is not None]


def _nack_on(routes: Routes, broker: str, request: pb.NackRequest) -> pb.NackReply:
    """One Nack request on ``broker``'s master (the topic of its first entry
    names the route); retried like a produce: a repeat may leave a second
    copy in the retry topic (at-least-once), never none."""
    topic = request.entries[0].topic

    def call(conn: Connection, retry: bool) -> pb.NackReply:
        reply: pb.NackReply = conn.call(conn.broker.Nack, request, retry=retry)
        return reply

    try:
        return routes.on_master(topic, broker, call)
    except EqueueError as exc:
        raise name_broker(exc, broker, "") from exc


def as_messages(messages: Message | Iterable[Message]) -> list[Message]:
    """One message or many, as a list (``nack`` takes either)."""
    if isinstance(messages, Message):
        return [messages]
    out = list(messages)
    for m in out:
        if not isinstance(m, Message):
            raise InvalidRequest(f"nack takes Messages (as poll returns them), got {m!r:.80}")
    return out
