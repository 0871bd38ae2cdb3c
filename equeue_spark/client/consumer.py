"""``Consumer``: pull messages with long polling, alone or in a consumer group.

Two ways to say what to read:

- ``assign(topic, queue_ids)``: exactly those queues, no group membership.
- ``Consumer(..., group=..., topics=[...])``: membership in a consumer group.
  A queue starts at the group's committed offset; ``start`` ("earliest",
  "latest"; "group" means earliest) only decides where a queue the group
  never committed on begins, like Kafka's ``auto.offset.reset``.
  A heartbeat thread tells the broker the consumer is alive (every
  ``heartbeat_interval_s``). The broker owns the assignment: it allocates
  queues (``equeue_proto.protocol.allocate_average``) and hands each queue
  to one member at a time as a lock (see "Queue ownership" in broker.proto).
  Each heartbeat reply says which queues this consumer holds (it starts them
  at the group's committed offsets, or ``start``) and which it must give up
  (it stops pulling them, commits their positions, then releases them, so
  their new owner starts where it stopped). Pulls and commits carry the
  membership; the broker refuses them on a queue the consumer no longer
  holds, which the consumer takes as a rebalance: it drops the queue.

One broker is a cluster of one (routing.py): the consumer reads each broker
group of its topics' routes with one ``ConsumerPart`` (consumer_part.py),
each a member of the group on that broker (the same consumer id
everywhere), so each broker allocates its own queues among the group's
members and keeps the group's committed offsets of its queues. ``poll``
pulls from all of them; in a cluster every message names its broker
(``Message.broker_id``: the broker name). One broker has one group, named
``""``, whose queues are named by their id alone, as they always were.

Reads go to each broker group's master, or with ``read_from_replicas`` to
one of its replicas (replica_reads.py). When the member read from stops
answering, the consumer moves to another member of the group at once (the
master's replicas hold the same queues at the same offsets) and carries its
positions over; it comes back to the master once the master answers again.
Which member, and when to move, is the routes' (``Routes.reader_on``,
``Routes.keep_reader``). Commits always go to the master (a replica refuses
them, ``Routes.on_master_now``): while the group has no master they fail
with ``BrokerUnavailable`` and the next ``commit`` sends them again.

``poll`` returns messages and advances the positions (only past records it
decoded and returns); ``commit`` stores the positions on the broker as the
group's next offsets to consume. Messages returned by ``poll`` count as
consumed once committed; a consumer that stops without committing leaves
them to be consumed again (at-least-once).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from equeue_proto.protocol import consumer_id_problem, default_consumer_id
from equeue_proto.retry_topics import retry_topic
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.admin import commit_offsets
from equeue_spark.client.cluster import connect, name_broker, with_replica_reads
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.consumer_part import (
    Committer,
    ConsumerPart,
    Member,
    OnDataLoss,
    QueueKey,
    Start,
)
from equeue_spark.client.errors import (
    AuthenticationError,
    BrokerUnavailable,
    EqueueError,
    InvalidRequest,
    PermissionDeniedError,
)
from equeue_spark.client.filters import check_filter
from equeue_spark.client.records import Message
from equeue_spark.client.retries import (
    as_messages,
    check_reconsume_times,
    is_retry_copy,
    redelivered,
    send_nacks,
)

__all__ = ["Committer", "Consumer", "Member", "OnDataLoss", "QueueKey", "Start"]

log = logging.getLogger(__name__)

MAX_POLL_THREADS = 16
"""Broker groups a consumer polls at once."""
CHECK_S = 1.0
"""How often a consumer reading a group's second choice looks for its first."""


class Consumer:
    """Read messages::

    with Consumer("127.0.0.1:5000", group="billing", topics=["orders"]) as c:
        while True:
            for message in c.poll(timeout_s=1.0):
                handle(message)
            c.commit()

    One ``ConsumerPart`` per broker group of the topics' routes (one broker:
    one group), all with this consumer's id; each heartbeats its broker, which
    allocates that broker's queues over the group's members and keeps their
    committed offsets. A broker that joins a topic's route later is picked up
    at the next route refresh. ``poll`` polls one group directly; several in
    short slices (0.1 s) until one has messages or ``timeout_s`` passes; a
    group that cannot be reached is skipped (its part logs and retries), so
    the others keep flowing. Queue calls (``assign``, ``seek``, ``position``)
    name the ``broker`` group in a cluster.
    """

    SLICE_S = 0.1

    def __init__(
        self,
        broker: str = "",
        *,
        namesrv: str | Sequence[str] = "",
        group: str | None = None,
        topics: Sequence[str] = (),
        start: Start = "group",
        config: ClientConfig | None = None,
        max_messages: int = 1000,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 1000,
        tags: Sequence[str] = (),
        filter: str = "",
        heartbeat_interval_s: float = 1.0,
        consumer_id: str | None = None,
        on_data_loss: OnDataLoss = "raise",
        read_from_replicas: bool = False,
        max_reconsume_times: int | None = None,
    ) -> None:
        """``on_data_loss`` says what ``poll`` does when the broker reports a
        stored record of a queue as damaged (DATA_LOSS): "raise" (the default)
        raises ``DataLossError`` and stays at that record; "skip" moves past it,
        logs it and counts it in ``damaged_skipped``. Either way no intact
        record is ever skipped.

        ``read_from_replicas`` (cluster only): read every broker group from a
        replica, the master only when no replica is live (commits still go to
        the master).

        ``max_reconsume_times`` (with a group): deliveries after which a
        message given back with ``nack`` goes to the group's dead-letter
        topic instead of its retry topic; None or 0: the broker's default
        (``--max-reconsume-times``, 16).

        ``filter``: a filter expression the brokers apply before sending
        (``region = 'eu' AND amount > 100``; grammar in docs/client.md,
        "Filters"), with ``tags`` too if given: only records that pass are
        returned. A bad one raises ``InvalidRequest`` here, naming the position;
        a broker too old to apply filters raises ``UnsupportedFilter`` at the
        first read from it rather than sending everything."""
        config = config or ClientConfig(broker=broker, namesrv=namesrv)
        if read_from_replicas:
            config = with_replica_reads(config)
        if start not in ("earliest", "latest", "group"):
            raise ValueError(f"start must be earliest, latest or group, got {start!r}")
        if on_data_loss not in ("raise", "skip"):
            raise ValueError(f"on_data_loss must be raise or skip, got {on_data_loss!r}")
        if topics and group is None:
            raise ValueError("subscribing to topics needs a group; use assign() without one")
        self.filter = check_filter(filter)
        self.max_reconsume_times = check_reconsume_times(max_reconsume_times)
        self.consumer_id = consumer_id or default_consumer_id(
            socket.gethostname(), os.getpid(), secrets.token_hex(3)
        )
        problem = consumer_id_problem(self.consumer_id)
        if problem is not None:  # the broker would refuse every heartbeat
            raise ValueError(problem)
        self.routes = connect(config)
        """Where the consumer's calls go (routing.py)."""
        self._seed = group or ""
        """Picks the replica read (replica_reads.py): a group's members agree."""
        self.group = group
        self.topics = list(topics)
        self.retry_topic = retry_topic(group) if group is not None and self.topics else ""
        """The group's retry topic, read beside ``topics`` once it exists (retries.py)."""
        self.start = start
        self.on_data_loss = on_data_loss
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_wait_ms = max_wait_ms
        self.tags = list(tags)
        self.heartbeat_interval_s = heartbeat_interval_s
        self._parts: dict[str, ConsumerPart] = {}
        self._part_topic: dict[str, str] = {}
        """A topic each broker group is read for (its route names the members)."""
        self._checked = 0.0
        self._parts_lock = threading.Lock()
        self._deferred: EqueueError | None = None
        self._closed = threading.Event()
        self._refreshed = 0.0
        self._pool = ThreadPoolExecutor(MAX_POLL_THREADS, thread_name_prefix="equeue-poll")
        if self.topics:
            try:
                self._refresh_parts(first=True)
            except BaseException:
                self.close()
                raise

    # -- the per-group parts ---------------------------------------------------------------

    def _part(self, broker: str, topic: str, topics: Sequence[str] = ()) -> ConsumerPart:
        """The part reading ``broker``'s group: on the member the routes choose
        (``Routes.reader_on``); made again there, carrying the positions over,
        when that is not the member read now."""
        with self._parts_lock:
            part = self._parts.get(broker)
        current = part.address if part is not None else ""
        joined = tuple(topics) or (tuple(part.topics) if part is not None else ())

        def start(conn: Connection) -> ConsumerPart:
            return self._new_part(conn, broker, topic, joined)

        new = self.routes.reader_on(topic, broker, current, start, self._seed)
        if new is None:
            assert part is not None
            return part
        self._install(broker, topic, part, new)
        return new

    def _new_part(
        self, conn: Connection, broker: str, topic: str, topics: Sequence[str]
    ) -> ConsumerPart:
        read_from = conn.config.target

        def commit(group: str, offsets: dict[QueueKey, int], member: Member) -> None:
            self._commit_on_master(broker, topic, read_from, group, offsets=offsets, member=member)

        committer: Committer = commit
        return ConsumerPart(
            conn, committer=committer, group=self.group, topics=topics, start=self.start,
            max_messages=self.max_messages, max_bytes=self.max_bytes,
            max_wait_ms=self.max_wait_ms, tags=self.tags, filter=self.filter,
            heartbeat_interval_s=self.heartbeat_interval_s, consumer_id=self.consumer_id,
            on_data_loss=self.on_data_loss,
        )  # fmt: skip

    def _install(
        self, broker: str, topic: str, old: ConsumerPart | None, new: ConsumerPart
    ) -> None:
        """``new`` reads ``broker``'s group, where ``old`` got to."""
        if old is not None:
            new.adopt(old.positions())
            # Off this thread: leaving a dead broker's group waits for its calls to fail.
            self._pool.submit(old.close)
            log.warning("consumer %s: reading broker group %s from %s now (was %s)",
                        self.consumer_id, broker, new.address, old.address)  # fmt: skip
        with self._parts_lock:
            self._parts[broker] = new
            self._part_topic[broker] = topic

    def _commit_on_master(
        self, broker: str, topic: str, read_from: str, group: str, *,
        offsets: dict[QueueKey, int], member: Member,
    ) -> None:  # fmt: skip
        """Commit on the group's master (no waiting for a new master: the
        next commit sends the offsets again). The member identity counts
        only on the broker holding the membership (the one read from)."""

        def call(conn: Connection, _retry: bool) -> None:
            held = member if conn.config.target == read_from else None
            commit_offsets(conn, group, offsets, held)

        def unreachable(why: str) -> EqueueError:
            return BrokerUnavailable(
                f"group {group!r}: offsets not committed, broker group {broker!r} has no "
                f"reachable master ({why}); a replica cannot take them, the next commit sends "
                "them again"
            )

        self.routes.on_master_now(topic, broker, call, unreachable)

    def _check_members(self) -> None:
        """Move off members that stopped answering; every ``CHECK_S`` while a
        group is not read from its first choice (the master, or a replica
        with read_from_replicas), fetch its route and move back if it answers."""
        due = time.monotonic() - self._checked >= CHECK_S
        routes = self.routes
        for broker, part in sorted(self.parts().items()):
            with self._parts_lock:
                topic = self._part_topic[broker]
            failed = part.failed_polls > 0 or part.failed_heartbeats > 0
            if not due and not (failed and not routes.is_down(part.address)):
                continue  # nothing new, or a failure acted on already: once a CHECK_S
            try:
                if not routes.keep_reader(topic, broker, part.address, failed, self._seed):
                    self._part(broker, topic)
            except EqueueError as exc:
                log.warning("broker group %s: %s", broker, exc)
        if due:
            self._checked = time.monotonic()

    def _refresh_parts(self, first: bool = False) -> None:
        """Join the group on every broker group of the topics' routes not
        joined yet. On the ``first`` refresh, an error that left no group
        joined is raised (a consumer that can read nothing says so); a
        token the name servers refuse (``AuthenticationError``,
        ``PermissionDeniedError``) is raised on any refresh."""
        self._refreshed = time.monotonic()
        hosted: dict[str, list[str]] = {}
        for topic in self.topics:
            try:
                names = self.routes.groups_of(topic)
            except (AuthenticationError, PermissionDeniedError):
                raise  # the token: no later refresh would do better
            except EqueueError as exc:
                log.warning("no route for %s yet: %s", topic, exc)
                continue
            for name in names:
                hosted.setdefault(name, []).append(topic)
        for name in self._retry_groups():
            if name in hosted:  # read where the group reads its topics
                hosted[name].append(self.retry_topic)
        errors: list[EqueueError] = []
        for broker, topics in sorted(hosted.items()):
            with self._parts_lock:
                part = self._parts.get(broker)
            if part is not None and sorted(part.topics) == sorted(topics):
                continue
            if part is not None and self._only_retry_differs(part.topics, topics):
                part.topics = list(topics)  # its next heartbeat asks for the retry queues
                continue
            if part is not None:
                part.close()
                with self._parts_lock:
                    del self._parts[broker]
            try:
                self._part(broker, topics[0], topics)
            except EqueueError as exc:  # down now: the next refresh tries again
                log.warning("cannot join on broker %s: %s", broker, exc)
                errors.append(exc)
        if first and errors and not self.parts():
            raise errors[0]

    def _retry_groups(self) -> list[str]:
        """The broker groups where the group's retry topic exists now (it is
        made on the first ``nack``): none before, and none without a group."""
        if not self.retry_topic:
            return []
        try:
            route = self.routes.route(self.retry_topic, refresh=True)
        except EqueueError as exc:  # not there yet (the usual case), or not reachable now
            log.debug("retry topic %s: %s", self.retry_topic, exc)
            return []
        return sorted({broker for broker, _ in route.queues()})

    def _only_retry_differs(self, old: Sequence[str], new: Sequence[str]) -> bool:
        """Whether a part's topics change by the retry topic alone: the part
        keeps its membership and positions (no leaving and joining again)."""
        return set(old) ^ set(new) == {self.retry_topic}

    def parts(self) -> dict[str, ConsumerPart]:
        """The per-group readers, by broker group name (``""``: one broker)."""
        with self._parts_lock:
            return dict(self._parts)

    # -- what to read --------------------------------------------------------------------

    def assign(self, topic: str, queue_ids: Iterable[int], broker: str = "") -> None:
        """Read exactly these queues (adds to the current assignment); in a
        cluster, of ``broker`` (required there)."""
        missing = f"in a cluster a queue of {topic!r} is (broker, queue id): give broker="
        group = self.routes.group(broker, missing)
        self._part(group, topic).assign(topic, queue_ids)

    def assignments(self) -> list[tuple[str, str, int]]:
        """(broker, topic, queue id) of every queue read."""
        return sorted((b, t, q) for b, part in self.parts().items() for t, q in part.assignment())

    def assignment(self) -> list[QueueKey]:
        """(topic, queue id) of every queue read; ``assignments`` names the brokers."""
        return [(t, q) for _, t, q in self.assignments()]

    def members(self) -> list[str]:
        """The group's live consumers, as of the last heartbeat."""
        return sorted({m for part in self.parts().values() for m in part.members()})

    def seek(self, topic: str, queue_id: int, offset: int, broker: str = "") -> None:
        """Continue the queue at ``offset``."""
        self._named(topic, queue_id, broker).seek(topic, queue_id, offset)

    def position(self, topic: str, queue_id: int, broker: str = "") -> int:
        """The next offset ``poll`` reads of the queue."""
        return self._named(topic, queue_id, broker).position(topic, queue_id)

    def positions(self) -> dict[QueueKey, int]:
        """Where each assigned queue is read next (a cluster's groups merged)."""
        return {k: v for part in self.parts().values() for k, v in part.positions().items()}

    @property
    def damaged_skipped(self) -> dict[QueueKey, list[int]]:
        """Offsets of damaged records skipped (``on_data_loss="skip"``), per queue."""
        out: dict[QueueKey, list[int]] = {}
        for part in self.parts().values():
            for key, offsets in part.damaged_skipped.items():
                out.setdefault(key, []).extend(offsets)
        return out

    def _named(self, topic: str, queue_id: int, broker: str) -> ConsumerPart:
        part = self.parts().get(broker)
        if part is None:
            raise InvalidRequest(f"{topic}/{queue_id} is not assigned to this consumer")
        return part

    def _heartbeat(self) -> None:
        """Heartbeat every group now (each part beats on its own thread too)."""
        for part in self.parts().values():
            part._heartbeat()

    # -- reading -------------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0) -> list[Message]:
        """Messages from the assigned queues, waiting up to ``timeout_s`` for some.

        One long-polling pull per queue runs concurrently; the call returns as
        soon as any queue has messages (or the timeout passes). A queue's error
        is raised when the call would return empty; if other queues brought
        messages, they are returned and the next call raises it.
        """
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        if self.topics and time.monotonic() - self._refreshed >= self.routes.config.route_refresh_s:
            self._refresh_parts()
        parts = list(self.parts().values())
        deadline = time.monotonic() + timeout_s
        while True:
            if not parts:
                self._closed.wait(min(timeout_s, self.SLICE_S))
                return []
            left = max(0.0, deadline - time.monotonic())
            messages: list[Message] = []
            errors: list[EqueueError] = []
            if len(parts) == 1 and not (parts[0].failed_polls or parts[0].failed_heartbeats):
                # One group, answering: its long poll alone, for all the time left.
                try:
                    messages = parts[0].poll(left)
                except EqueueError as exc:
                    errors.append(exc)
            else:
                slice_s = min(self.SLICE_S, left)
                futures = [self._pool.submit(part.poll, slice_s) for part in parts]
                for future in futures:
                    try:
                        messages += future.result()
                    except EqueueError as exc:
                        errors.append(exc)
            self._check_members()
            parts = list(self.parts().values())
            if errors:
                if not messages:
                    raise errors[0]
                self._deferred = errors[0]
            if messages or time.monotonic() >= deadline or self._closed.is_set():
                return self._as_origin(messages)

    def _as_origin(self, messages: list[Message]) -> list[Message]:
        """Messages of the retry topic dressed as their origin (retries.py)."""
        retry = self.retry_topic
        if not retry or not any(m.topic == retry for m in messages):
            return messages
        return [redelivered(m) if is_retry_copy(m, retry) else m for m in messages]

    # -- giving back ---------------------------------------------------------------------

    def nack(
        self,
        messages: Message | Iterable[Message],
        delay_s: float | None = None,
        error: object = None,
    ) -> list[pb.NackOutcome]:
        """Give back messages this consumer could not process (one, or many at
        one round trip per broker group): each is delivered to the group again
        after ``delay_s`` seconds (None: the group's next back-off step, 10 s,
        30 s, 1 m, ... 2 h), through its retry topic, which this consumer
        reads, or, once delivered more than ``max_reconsume_times`` times,
        goes to the dead-letter topic ``%DLQ%<group>``. ``error`` (text, or an
        exception) is kept with it (1 KiB). Then carry on and ``commit`` as
        usual: the position moves past it. Retried messages come back later,
        out of their queue's order. One ``NackOutcome`` per message ("retry"
        or "dlq", deliveries so far, when it is due, the copy's id)."""
        if self.group is None:
            raise InvalidRequest("nack needs a consumer group (Consumer(group=...))")
        given = as_messages(messages)
        if not given:
            return []
        outcomes = send_nacks(
            self.routes, self.group, given, delay_s=delay_s, error=error,
            max_reconsume_times=self.max_reconsume_times,
        )  # fmt: skip
        if self.retry_topic and any(o.action == "retry" for o in outcomes):
            self._read_retries({self.routes.message_group(m.broker_id) for m in given})
        return outcomes

    reconsume_later = nack
    """RocketMQ's name for ``nack``."""

    def _read_retries(self, groups: set[str]) -> None:
        """Join the retry topic at the next poll where it is not read yet on
        ``groups`` (it may have just been made there): a refresh then, not at
        the next periodic one."""
        parts = self.parts()
        if any(g in parts and self.retry_topic not in parts[g].topics for g in groups):
            self._refreshed = 0.0

    # -- progress ------------------------------------------------------------------------

    def commit(self) -> None:
        """Store the positions as the group's next offsets to consume, on every
        broker group (each keeps the offsets of its own queues).

        A member commits only the queues it still holds: a queue the broker
        handed to another member meanwhile is dropped, without an error."""
        errors = []
        parts = sorted(self.parts().items())
        if not parts and self.group is None:
            raise InvalidRequest("commit needs a group")
        for broker, part in parts:
            try:
                part.commit()
            except EqueueError as exc:
                errors.append(name_broker(exc, broker, part.address))
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Leave the group (its other members take over the queues) and disconnect.

        Positions are not committed here: call ``commit`` first if they should be.
        """
        if self._closed.is_set():
            return
        self._closed.set()
        for part in self.parts().values():
            part.close()
        self._pool.shutdown(wait=True)
        self.routes.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
