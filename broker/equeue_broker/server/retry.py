"""Retry and dead-letter topics: the reserved names and ``Nack``.

A consumer that cannot process a message gives it back with ``Nack``
(docs/operations.md, "Retry and dead letters"). The broker reads the message
where the consumer read it and appends a copy to the group's retry topic
``%RETRY%<group>``, delayed by the group's next back-off step (a delayed
append: the store's timer delivers it, so it is written once and survives
restarts and failover like any delayed message). The copy carries where it
came from in ``equeue.*`` headers; a copy read back from the retry topic and
given back again keeps them and counts one more delivery. Past
``max_reconsume_times`` retries the copy goes to ``%DLQ%<group>`` at once, with
the reason, and nobody consumes it automatically.

Both topics have one queue and are created by the broker on first use; every
name starting with ``%`` is reserved for them (users cannot create such
topics or groups). The log is the only record: a retry's history is in its
headers, so nothing else has to survive a restart or travel to replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from equeue_broker.server.errors import BadRequest
from equeue_broker.storage import AppendResult, MessageBatch, NotFound, ReadStatus, Store
from equeue_broker.storage.errors import AlreadyExists, LimitExceeded, StorageError
from equeue_broker.storage.meta.names import validate_group
from equeue_proto.protocol import format_message_id
from equeue_proto.record import StoredMessage
from equeue_proto.retry_topics import (
    DELIVERIES,
    DLQ_REASON,
    ERROR,
    ORIGIN_ID,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    OWN_HEADERS,
    RESERVED,
    RETRY_PREFIX,
    dlq_topic,
    resent_topic,
    retry_topic,
)

MAX_NACK_ENTRIES = 1_000
MAX_ERROR_BYTES = 1_024
RETRY = "retry"
DLQ = "dlq"


def group_topics(group: str) -> tuple[str, str, str]:
    """The topics the broker keeps for ``group`` (deleted with it)."""
    return retry_topic(group), dlq_topic(group), resent_topic(group)


def reserved_problem(kind: str, name: str) -> str | None:
    """Why a user may not name a topic or group ``name``; None if they may."""
    if not name.startswith(RESERVED):
        return None
    return (
        f"{kind} name {name!r} is reserved: names starting with '%' are reserved for "
        "the retry and dead-letter topics (%RETRY%<group>, %DLQ%<group>) the broker "
        "creates itself; choose a name starting with a letter or digit"
    )


def check_user_name(kind: str, name: str) -> None:
    """INVALID_ARGUMENT for a topic or group name a user may not create."""
    problem = reserved_problem(kind, name)
    if problem is not None:
        raise BadRequest(problem)


def check_reshape(name: str, change: str) -> None:
    """INVALID_ARGUMENT for a change (``change``: "deleted", "given queues", ...)
    to a topic the broker keeps for a group: they have one queue, and go with
    their group."""
    if name.startswith(RESERVED):
        raise BadRequest(
            f"topic {name!r} is a group's retry or dead-letter topic, which the broker "
            f"keeps (one queue, consumed by the group) and cannot be {change}: delete "
            "the group (equeue groups delete GROUP) or purge its dead letters "
            "(equeue dlq purge GROUP) instead"
        )


def user_group(name: str) -> str:
    """A group name from a request: valid, and not a reserved one."""
    check_user_name("group", name)
    return validate_group(name)


def ensure_topic(store: Store, name: str, created: Callable[[], None]) -> None:
    """Create a broker-owned topic (one queue) unless it exists; ``created``
    is told when this call made it (the name servers learn of it)."""
    try:
        store.topic_admin.describe(name)
        return
    except NotFound:
        pass
    limit = store.config.max_topics // 2
    owned = sum(1 for t in store.topic_admin.listing() if t.name.startswith(RESERVED))
    if owned >= limit:  # Nack names any group: keep room for users' own topics
        raise LimitExceeded(
            f"cannot create {name!r}: the broker keeps {owned} retry and dead-letter "
            f"topics, at most half the broker's topics ({limit} of "
            f"{store.config.max_topics}); delete groups no longer used (equeue groups "
            "delete GROUP removes theirs)"
        )
    try:
        store.topic_admin.create_topic(name, 1)
    except AlreadyExists:  # another Nack made it meanwhile
        return
    created()


@dataclass(frozen=True)
class NackPlan:
    """What one entry became: where its copy goes, when, with which headers."""

    action: str
    deliveries: int
    deliver_at_ms: int
    message: StoredMessage
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Outcome:
    action: str
    deliveries: int
    deliver_at_ms: int
    message_id: str


@dataclass(frozen=True)
class NackEntry:
    topic: str
    queue_id: int
    offset: int
    delay_ms: int
    error: str


class Retries:
    """``Nack`` against one store: plans every entry, then appends the copies
    (all retries in one delayed append, all dead letters in one append)."""

    def __init__(
        self,
        store: Store,
        broker_id: str,
        backoff_ms: Sequence[int],
        max_delay_ms: int,
        *,
        created: Callable[[], None],
        group_backoff_ms: Mapping[str, Sequence[int]] | None = None,
        appended: Callable[[AppendResult], None] | None = None,
    ) -> None:
        self.store = store
        self.appended = appended
        """Told of every copy appended (the broker's byte and message counters)."""
        self.broker_id = broker_id
        self.backoff_ms = tuple(backoff_ms)
        self.group_backoff_ms = {g: tuple(s) for g, s in (group_backoff_ms or {}).items()}
        self.max_delay_ms = max_delay_ms
        self.created = created

    def nack(self, group: str, entries: Sequence[NackEntry], max_retries: int) -> list[Outcome]:
        if not entries:
            raise BadRequest("entries must not be empty: name the messages to give back")
        if len(entries) > MAX_NACK_ENTRIES:
            raise BadRequest(
                f"{len(entries)} entries; the limit is {MAX_NACK_ENTRIES} per Nack: split them"
            )
        now = int(time.time() * 1000)
        read = self._prefetch(entries)
        plans = [self._plan(group, entry, max_retries, now, read) for entry in entries]
        ids: dict[int, str] = {}
        for action, topic in ((RETRY, retry_topic(group)), (DLQ, dlq_topic(group))):
            chosen = [i for i, plan in enumerate(plans) if plan.action == action]
            if chosen:
                ensure_topic(self.store, topic, self.created)
                positions = self._append(topic, [plans[i] for i in chosen], delayed=action == RETRY)
                for i, position in zip(chosen, positions, strict=True):
                    ids[i] = format_message_id(self.broker_id, position)
        return [
            Outcome(plan.action, plan.deliveries, plan.deliver_at_ms, ids[i])
            for i, plan in enumerate(plans)
        ]

    def _prefetch(self, entries: Sequence[NackEntry]) -> dict[tuple[str, int, int], StoredMessage]:
        """The messages of ``entries`` read a run of consecutive offsets at a
        time (a consumer gives back what one poll returned: runs of a few
        queues), instead of one read each; what is missing here is read (and
        refused) one by one in ``_plan``."""
        wanted: dict[tuple[str, int], set[int]] = {}
        for entry in entries:
            if entry.offset >= 0:
                wanted.setdefault((entry.topic, entry.queue_id), set()).add(entry.offset)
        found: dict[tuple[str, int, int], StoredMessage] = {}
        for (topic, queue_id), offsets in wanted.items():
            for first, count in _runs(sorted(offsets)):
                try:
                    result = self.store.reads.read(topic, queue_id, first, max_messages=count)
                except StorageError:
                    continue  # refused precisely by the read of its own
                if result.status is ReadStatus.OK:
                    for message in result.messages:
                        found[(topic, queue_id, message.queue_offset)] = message
        return found

    def _plan(
        self,
        group: str,
        entry: NackEntry,
        max_retries: int,
        now: int,
        read: dict[tuple[str, int, int], StoredMessage],
    ) -> NackPlan:
        source = entry.topic
        if source.startswith(RESERVED) and source != retry_topic(group):
            raise BadRequest(
                f"cannot Nack a message of {source!r} for group {group!r}: a group gives "
                f"back messages of its topics or of its retry topic {retry_topic(group)!r}"
            )
        if entry.delay_ms < -1 or entry.delay_ms > self.max_delay_ms:
            raise BadRequest(
                f"delay_ms {entry.delay_ms} for {source}/{entry.queue_id}@{entry.offset} is out "
                f"of range: give 0 to {self.max_delay_ms} (--max-delay), or -1 for the "
                "group's next back-off step"
            )
        message = read.get((source, entry.queue_id, entry.offset))
        if message is None:
            message = self._read(source, entry.queue_id, entry.offset)
        own = dict(message.headers)
        if source.startswith(RETRY_PREFIX) and ORIGIN_TOPIC in own:
            deliveries = _count(own.get(DELIVERIES)) + 1
            origin = [(k, own[k]) for k in (ORIGIN_TOPIC, ORIGIN_QUEUE, ORIGIN_OFFSET, ORIGIN_ID)]
        else:
            deliveries = 1
            origin = [
                (ORIGIN_TOPIC, source.encode()),
                (ORIGIN_QUEUE, str(entry.queue_id).encode()),
                (ORIGIN_OFFSET, str(entry.offset).encode()),
                (ORIGIN_ID, format_message_id(self.broker_id, message.position).encode()),
            ]
        error = _truncated(entry.error)
        headers = [(k, v) for k, v in message.headers if k not in OWN_HEADERS]
        headers += origin
        headers.append((DELIVERIES, str(deliveries).encode()))
        if error:
            headers.append((ERROR, error))
        elif ERROR in own:  # the last error a consumer gave stays with the message
            headers.append((ERROR, own[ERROR]))
        if deliveries > max_retries:
            reason = f"delivered {deliveries} times, more than max_reconsume_times {max_retries}"
            headers.append((DLQ_REASON, reason.encode()))
            return NackPlan(DLQ, deliveries, 0, message, tuple(headers))
        delay = entry.delay_ms if entry.delay_ms >= 0 else self.step(group, deliveries)
        return NackPlan(RETRY, deliveries, now + delay, message, tuple(headers))

    def step(self, group: str, deliveries: int) -> int:
        """The group's back-off before retry number ``deliveries`` (1: the
        first step); past the table's end, its last step."""
        steps = self.group_backoff_ms.get(group, self.backoff_ms)
        return steps[min(deliveries, len(steps)) - 1]

    def _read(self, topic: str, queue_id: int, offset: int) -> StoredMessage:
        result = self.store.reads.read(topic, queue_id, offset, max_messages=1)
        messages = result.messages
        if result.status is not ReadStatus.OK or not messages or messages[0].queue_offset != offset:
            raise NotFound(
                f"{topic}/{queue_id} has no message at offset {offset} (retained: "
                f"[{result.earliest}, {result.end})); nothing was given back"
            )
        return messages[0]

    def _append(self, topic: str, plans: Sequence[NackPlan], *, delayed: bool) -> list[int]:
        batch = MessageBatch(
            values=[p.message.value for p in plans],
            keys=[p.message.key for p in plans],
            tags=[p.message.tag for p in plans],
            headers=[p.headers for p in plans],
            timestamps_ms=[p.message.producer_timestamp_ms for p in plans],
        )
        times = [p.deliver_at_ms for p in plans] if delayed else None
        result = self.store.append(topic, 0, batch, deliver_at_ms=times)
        if self.appended is not None:  # a retry counts when written, as a delayed produce
            self.appended(result)
        return result.positions()


def _count(raw: bytes | None) -> int:
    """A copy's ``equeue.deliveries`` (1 if missing or not a number)."""
    try:
        return max(1, int(raw or b"1"))
    except ValueError:
        return 1


def _truncated(error: str) -> bytes:
    """At most ``MAX_ERROR_BYTES`` of the error's UTF-8, cut at a character."""
    raw = error.encode()
    if len(raw) <= MAX_ERROR_BYTES:
        return raw
    return raw[:MAX_ERROR_BYTES].decode(errors="ignore").encode()


def _runs(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """(first, count) of each run of consecutive ``offsets`` (sorted)."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((offset, 1))
    return runs
