"""A group's dead letters (``%DLQ%<group>``): list, resend, purge.

A message given back (``Consumer.nack``) more than ``max_reconsume_times``
times lands in the group's dead-letter topic, on the broker group that held
it, with its history in its headers (``Message.origin``, ``deliveries``,
``error``). Nobody consumes it automatically. ``Admin`` lists them (read
through the ordinary pull path, like any topic), resends them to where they
came from (each at most once; the broker remembers) and purges them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from equeue_proto.protocol import parse_message_id
from equeue_proto.retry_topics import dlq_topic
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import EqueueError, InvalidRequest, NotFoundError
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.records import Message, decode_records
from equeue_spark.client.route import name_broker

if TYPE_CHECKING:
    from equeue_spark.client.connection import Connection
    from equeue_spark.client.routing import Routes

T = TypeVar("T")

MAX_LIST = 100_000
"""Dead letters one ``list_dead_letters`` call returns at most."""
MAX_RESEND_IDS = 1_000
"""Ids per ResendDeadLetters request (the broker's limit); more go in several."""
MAX_RESEND_ALL = 10_000
"""Dead letters the broker resends per ``all`` request; a fuller topic takes
more requests (sent until one resends fewer)."""
MAX_RESEND_CALLS = 10_000
"""A bound on the requests of one ``all`` resend (10^8 dead letters)."""


def _hosts(routes: Routes, group: str) -> list[tuple[str, int]]:
    """(broker group, queue id) of every queue of the group's dead-letter
    topic; empty when it has none (nothing dead-lettered yet, or purged)."""
    topic = dlq_topic(group)
    try:
        route = routes.route(topic, refresh=True)
    except NotFoundError:
        return []
    return route.queues()


def list_dead_letters(routes: Routes, group: str, max_messages: int = 1000) -> list[Message]:
    """The group's dead letters, oldest first per broker group, at most
    ``max_messages`` (up to ``MAX_LIST``)."""
    if not 1 <= max_messages <= MAX_LIST:
        raise InvalidRequest(f"max_messages {max_messages} must be between 1 and {MAX_LIST}")
    topic = dlq_topic(group)
    out: list[Message] = []
    for broker, queue_id in _hosts(routes, group):
        left = max_messages - len(out)
        if left <= 0:
            break

        def read(conn: Connection, _last: bool, q: int = queue_id, n: int = left) -> list[Message]:
            return _read_queue(conn, topic, q, n)

        try:
            out += routes.read_on(topic, broker, read)
        except EqueueError as exc:
            raise name_broker(exc, broker, "") from exc
    return out


def _read_queue(conn: Connection, topic: str, queue_id: int, limit: int) -> list[Message]:
    """Up to ``limit`` messages of one queue from its earliest retained offset."""
    info = conn.call(conn.admin.DescribeTopic, pb.DescribeTopicRequest(name=topic))
    queue = next((q for q in info.queues if q.queue_id == queue_id), None)
    if queue is None or queue.end_offset <= queue.earliest_offset:
        return []
    start = queue.earliest_offset
    end = min(queue.end_offset, start + limit)
    out: list[Message] = []
    for reply in stream_replies(conn, topic, queue_id, start, end):
        if reply.count:
            out += decode_records(reply.records, reply.broker_id)
    return out[:limit]


def resend_dead_letters(
    routes: Routes, group: str, message_ids: Sequence[str] = (), every: bool = False
) -> pb.ResendDeadLettersReply:
    """Append dead letters back to their origin topic and queue, each at most
    once: those named (ids as ``list_dead_letters`` gives them), or with
    ``every`` all not resent yet. One request per broker group; the replies
    merged (ids the broker does not know as the group's dead letters are in
    ``not_found``)."""
    if bool(message_ids) == every:
        raise InvalidRequest("name the dead letters to resend (ids), or resend all, not both")
    merged = pb.ResendDeadLettersReply()
    requests: list[tuple[str, pb.ResendDeadLettersRequest]] = []
    if every:
        for broker in sorted({broker for broker, _ in _hosts(routes, group)}):
            requests.append((broker, pb.ResendDeadLettersRequest(group=group, all=True)))
    else:
        for broker, ids in sorted(_by_broker(routes, message_ids).items()):
            for start in range(0, len(ids), MAX_RESEND_IDS):
                chunk = ids[start : start + MAX_RESEND_IDS]
                requests.append(
                    (broker, pb.ResendDeadLettersRequest(group=group, message_ids=chunk))
                )
    for broker, request in requests:
        for _ in range(MAX_RESEND_CALLS):
            reply = _on_master(routes, broker, functools.partial(_resend, request=request))
            merged.resent += reply.resent
            merged.already_resent += reply.already_resent
            merged.not_found.extend(reply.not_found)
            merged.new_message_ids.extend(reply.new_message_ids)
            if not request.all or reply.resent < MAX_RESEND_ALL:
                break
    return merged


def _resend(conn: Connection, request: pb.ResendDeadLettersRequest) -> pb.ResendDeadLettersReply:
    """Not retried: a resend that was applied but not answered would be
    skipped as "already resent" by the retry, and reported wrongly."""
    reply: pb.ResendDeadLettersReply = conn.call(conn.admin.ResendDeadLetters, request, retry=False)
    return reply


def purge_dead_letters(routes: Routes, group: str) -> int:
    """Delete the group's dead-letter topic on every broker group holding
    it; the messages it held (0 when there was none)."""
    purged = 0
    request = pb.PurgeDeadLettersRequest(group=group)
    for broker in sorted({broker for broker, _ in _hosts(routes, group)}):

        def purge(conn: Connection) -> pb.PurgeDeadLettersReply:
            reply: pb.PurgeDeadLettersReply = conn.call(conn.admin.PurgeDeadLetters, request)
            return reply

        purged += _on_master(routes, broker, purge).purged
    routes.invalidate(dlq_topic(group))
    return purged


def _by_broker(routes: Routes, message_ids: Sequence[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for message_id in message_ids:
        try:
            broker_id, _ = parse_message_id(message_id)
        except ValueError as exc:
            raise InvalidRequest(f"{exc}; give ids as 'equeue dlq list' prints them") from None
        out.setdefault(routes.message_group(broker_id), []).append(message_id)
    return out


def _on_master(routes: Routes, broker: str, call: Callable[[Connection], T]) -> T:
    """An Admin RPC on ``broker``'s master; an error names the broker group."""
    address = routes.broker_address(broker)
    try:
        return call(routes.connection(address))
    except EqueueError as exc:
        raise name_broker(exc, broker, address) from exc
