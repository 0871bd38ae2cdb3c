"""A group's dead letters: resend them to where they came from (once), purge them.

"Once" is remembered in the log, the broker's one source of truth: each
resend appends a record to the group's ``%RESENT%<group>`` topic (one queue,
created on first use) naming the dead letter's id and the id of the copy.
The dead-letter topic itself stays as the consumers left it (readers such as
Spark and ``equeue dlq list`` see dead letters only), the record travels to
replicas and survives restarts like any message, and a resend asks the
``%RESENT%`` topic which ids it already holds. The copy is appended before its
record: a crash between the two (a window of one append) can resend a dead
letter a second time, never lose one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from equeue_broker.server.auth import Principal
from equeue_broker.server.errors import BadRequest
from equeue_broker.server.retry import ensure_topic
from equeue_broker.storage import AppendResult, MessageBatch, NotFound, Store
from equeue_proto.protocol import format_message_id, parse_message_id
from equeue_proto.record import RecordError, StoredMessage, decode_record
from equeue_proto.retry_topics import (
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    OWN_HEADERS,
    dlq_topic,
    resent_topic,
)

DEAD_LETTER_ID = "equeue.dlq.id"
"""On a resent copy and its %RESENT% record: the dead letter's id."""
RESENT_ID = "equeue.resent.id"
"""On a %RESENT% record: the id of the copy appended to the origin topic."""
MAX_RESEND_IDS = 1_000
MAX_RESEND_ALL = 10_000
"""Dead letters one ``all`` resend handles; a larger topic takes more calls."""
_READ_BATCH = 1_000


@dataclass
class Resent:
    resent: int = 0
    already_resent: int = 0
    not_found: list[str] = field(default_factory=list)
    new_message_ids: list[str] = field(default_factory=list)


class DeadLetters:
    def __init__(
        self, store: Store, broker_ids: Sequence[str], created: Callable[[], None],
        appended: Callable[[AppendResult], None] | None = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.appended = appended
        """Told of every append (the broker's byte and message counters)."""
        self.broker_id = broker_ids[0]
        self.broker_ids = tuple(broker_ids)
        """Every id of this broker a message id may carry (name, data directory id)."""
        self.created = created

    def resend(
        self, group: str, ids: Sequence[str], every: bool, scope: Principal | None
    ) -> Resent:
        if every == bool(ids):
            raise BadRequest("give message_ids, or all (not both)")
        if len(ids) > MAX_RESEND_IDS:
            raise BadRequest(f"{len(ids)} message ids; the limit is {MAX_RESEND_IDS} per call")
        done = self._resent(group)
        out = Resent()
        chosen: list[StoredMessage] = []
        if every:
            for letter in self._letters(group):
                if letter.position not in done:
                    chosen.append(letter)
                if len(chosen) >= MAX_RESEND_ALL:
                    break
        else:
            seen: set[int] = set()
            for message_id in ids:
                named = self._letter(group, message_id)
                if named is None:
                    out.not_found.append(message_id)
                elif named.position in done or named.position in seen:
                    out.already_resent += 1
                else:
                    seen.add(named.position)
                    chosen.append(named)
        origins = [self._origin(letter, scope) for letter in chosen]  # all checked first
        for letter, (topic, queue_id) in zip(chosen, origins, strict=True):
            out.new_message_ids.append(self._resend_one(group, letter, topic, queue_id))
            out.resent += 1
        return out

    def purge(self, group: str) -> int:
        """Delete the group's dead-letter topic (and its resend records); the
        messages it held."""
        held = 0
        for topic in (dlq_topic(group), resent_topic(group)):
            try:
                meta = self.store.topic_admin.describe(topic)
            except NotFound:
                continue
            if topic == dlq_topic(group):
                for q in meta.queues:
                    info = self.store.topic_admin.queue_info(topic, q.queue_id)
                    held += info.end - info.earliest
            self.store.topic_admin.delete_topic(topic)
        return held

    def _resend_one(self, group: str, letter: StoredMessage, topic: str, queue_id: int) -> str:
        letter_id = format_message_id(self.broker_id, letter.position).encode()
        headers = [(k, v) for k, v in letter.headers if k not in OWN_HEADERS]
        headers.append((DEAD_LETTER_ID, letter_id))
        copy = MessageBatch(
            [letter.value], [letter.key], [letter.tag], [headers], [letter.producer_timestamp_ms]
        )
        result = self.store.append(topic, queue_id, copy)
        (position,) = result.positions()
        new_id = format_message_id(self.broker_id, position)
        ensure_topic(self.store, resent_topic(group), self.created)
        marks = [(DEAD_LETTER_ID, letter_id), (RESENT_ID, new_id.encode())]
        record = MessageBatch([b""], headers=[marks])
        mark = self.store.append(resent_topic(group), 0, record)
        if self.appended is not None:
            self.appended(result)
            self.appended(mark)
        return new_id

    def _origin(self, letter: StoredMessage, scope: Principal | None) -> tuple[str, int]:
        """Where a dead letter goes back to; NotFound if that queue is gone."""
        own = dict(letter.headers)
        topic = own.get(ORIGIN_TOPIC, b"").decode(errors="replace")
        try:
            queue_id = int(own.get(ORIGIN_QUEUE, b"-1"))
        except ValueError:
            queue_id = -1
        letter_id = format_message_id(self.broker_id, letter.position)
        if not topic or queue_id < 0:
            raise BadRequest(f"dead letter {letter_id} names no origin topic and queue")
        if scope is not None:
            scope.check_topic(topic)
        try:
            self.store.topic_admin.queue_info(topic, queue_id)
        except NotFound:
            raise NotFound(
                f"dead letter {letter_id} came from {topic}/{queue_id}, which no longer "
                "exists; nothing was resent: resend the others by id (equeue dlq resend "
                "GROUP --ids ...), create the queue again, or purge the dead letters "
                "(equeue dlq purge GROUP)"
            ) from None
        return topic, queue_id

    def _resent(self, group: str) -> set[int]:
        """Positions of the dead letters resent before (from %RESENT%<group>)."""
        done: set[int] = set()
        for record in self._read_all(resent_topic(group)):
            raw = dict(record.headers).get(DEAD_LETTER_ID, b"").decode(errors="replace")
            try:
                done.add(parse_message_id(raw)[1])
            except ValueError:
                continue
        return done

    def _letters(self, group: str) -> Iterator[StoredMessage]:
        return self._read_all(dlq_topic(group))

    def _read_all(self, topic: str) -> Iterator[StoredMessage]:
        try:
            meta = self.store.topic_admin.describe(topic)
        except NotFound:
            return
        for q in meta.queues:
            offset = self.store.topic_admin.queue_info(topic, q.queue_id).earliest
            while True:
                result = self.store.reads.read(topic, q.queue_id, offset, max_messages=_READ_BATCH)
                yield from result.messages
                # Past retention's cut the read answers with the earliest offset: go on there.
                if result.next_offset >= result.end or result.next_offset <= offset:
                    break
                offset = result.next_offset

    def _letter(self, group: str, message_id: str) -> StoredMessage | None:
        """The dead letter ``message_id`` names in the group's topic, or None."""
        try:
            broker_id, position = parse_message_id(message_id)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if broker_id not in self.broker_ids:
            return None
        try:
            record = self.store.reads.record_at(position)
            letter = decode_record(record, 0)
        except (NotFound, RecordError):
            return None
        if letter.topic != dlq_topic(group):
            return None
        return letter
