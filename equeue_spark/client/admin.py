"""``Admin``: every administrative RPC, with deadlines and mapped errors.

Replies are the contract's protobuf messages (``equeue_proto.v1.broker_pb2``),
whose fields are documented in the ``.proto``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from equeue_proto.protocol import parse_message_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import schema_admin
from equeue_spark.client.cancel import cancel_delayed
from equeue_spark.client.cluster import connect
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.dead_letters import (
    list_dead_letters,
    purge_dead_letters,
    resend_dead_letters,
)
from equeue_spark.client.errors import (
    BrokerUnavailable,
    DataLossError,
    DeadlineExceeded,
    EqueueError,
    NotFoundError,
)
from equeue_spark.client.queries import DEFAULT_QUERY_LIMIT, QueryResult, query_request
from equeue_spark.client.records import Message, decode_records
from equeue_spark.client.route import Route, name_broker
from equeue_spark.client.routing import Routes
from equeue_spark.client.schemas import SchemaCache
from equeue_spark.client.transactions import abort_transactions


def commit_offsets(
    conn: Connection,
    group: str,
    offsets: Mapping[tuple[str, int], int],
    member: tuple[str, int] | None = None,
) -> None:
    """The one place a CommitOffsets request is built (Admin and Consumer use it).

    ``member`` is a group member's (consumer_id, session): the broker then
    requires it to hold every queue. Without it the commit comes from outside
    the group and is refused for queues a live member holds."""
    request = pb.CommitOffsetsRequest(group=group)
    if member is not None:
        request.consumer_id, request.session = member
    for (topic, queue_id), offset in sorted(offsets.items()):
        request.offsets.add(topic=topic, queue_id=queue_id, offset=offset)
    conn.call(conn.broker.CommitOffsets, request)


T = TypeVar("T")

PROBE_TIMEOUT_S = 2.0
"""Deadline of each member's GetStats in ``cluster_stats`` (no retry): a member
that does not answer within it is shown as unreachable."""


@dataclass(frozen=True)
class MemberStats:
    """One member of a cluster as ``Admin.cluster_stats`` found it."""

    entry: pb.BrokerEntry
    """What the name servers know of it (group name, role, epoch, address, state)."""
    state: str
    """"live", "suspect" (its registration is late, but it answers), "unreachable"
    (registered, but it did not answer) or "down" (its registration expired:
    the name servers remember it, nobody asked it)."""
    stats: pb.BrokerStats | None
    """Its GetStats reply; None when it was not asked or refused (``error``)."""
    error: str = ""
    """Why there are no stats: its error, or "" """


def member_state(entry: pb.BrokerEntry) -> str:
    """The name servers' state of a member ("live" from one before states)."""
    return entry.state or "live"


QUEUE_NEEDS_BROKER = "in a cluster a queue of {topic!r} is (broker, queue id): give its broker"


class Admin:
    """Administer a broker::

    with Admin("127.0.0.1:5000") as admin:
        admin.create_topic("orders", queues=8)
        for q in admin.describe_topic("orders").queues:
            print(q.queue_id, q.end_offset, q.backlog)

    or a cluster (``Admin(namesrv="ns1:9876,ns2:9876")``): topic calls span
    the brokers (``create_topic`` makes ``queues`` queues on each chosen
    broker, all live ones by default; ``describe_topic``, ``add_queues`` and
    ``delete_topic`` act on every broker of the topic's route), and the merged
    replies name each queue's broker (``QueueInfo.broker``,
    ``GroupQueue.broker``). A call about one queue names its ``broker``.

    Every call goes through ``Routes`` (routing.py): one broker is a cluster
    of one broker group, named ``""``.
    """

    def __init__(
        self,
        broker: str = "",
        *,
        namesrv: str | Sequence[str] = "",
        config: ClientConfig | None = None,
    ) -> None:
        config = config or ClientConfig(broker=broker, namesrv=namesrv)
        self.routes: Routes = connect(config)
        """The brokers' routes and connections."""
        self.cluster = self.routes
        """The name it had before routing.py (kept for callers)."""
        self._admins: dict[str, Admin] = {}

    # -- one Admin per broker ----------------------------------------------------------

    def broker_admin(self, broker: str, topic: str = "") -> Admin:
        """The ``Admin`` of ``broker``'s master alone."""
        routes = self.routes
        address = routes.route(topic).address(broker) if topic else routes.broker_address(broker)
        return self._admin_at(address, last=True)

    def read_on(self, broker: str, topic: str, call: Callable[[Admin], T], seed: str = "") -> T:
        """``call`` on the member of ``broker``'s group that serves ``topic``'s
        reads (the master; a replica with ``read_from_replicas``), moving to
        the next member when one does not answer (``Routes.read_on``). For
        reads only: a replica refuses writes."""
        return self.routes.read_on(
            topic, broker, lambda conn, last: call(self._admin_at(conn.config.target, last)), seed
        )

    def read_addresses(self, broker: str, topic: str, seed: str = "") -> list[str]:
        """The members of ``broker``'s group in the order reads try them."""
        return self.routes.read_addresses(topic, broker, seed)

    def _admin_at(self, address: str, last: bool) -> Admin:
        """The Admin of one member; one that is not the last to try retries
        once (the next member is the better retry)."""
        key = address if last else f"{address} (fail fast)"
        admin = self._admins.get(key)
        if admin is None:
            config = self.routes.config.for_broker(address)
            if not last:
                config = dataclasses.replace(config, retries=min(config.retries, 1))
            admin = Admin(config=config)
            self._admins[key] = admin
        return admin

    def _each(
        self, brokers: Sequence[str], call: Callable[[Connection], T], topic: str = ""
    ) -> list[tuple[str, T]]:
        """``call`` on each broker's master in turn; an error names the broker
        (calls made before it stand)."""
        routes = self.routes
        out = []
        for broker in brokers:
            address = (
                routes.route(topic).address(broker) if topic else routes.broker_address(broker)
            )
            try:
                out.append((broker, call(routes.connection(address))))
            except EqueueError as exc:
                raise name_broker(exc, broker, address) from exc
        return out

    def _queue_broker(self, topic: str, broker: str) -> Connection:
        """The master of the group holding a queue of ``topic`` (``broker``)."""
        group = self.routes.group(broker, QUEUE_NEEDS_BROKER.format(topic=topic))
        return self.routes.broker_connection(topic, group)

    def _only(self, what: str) -> Connection:
        """The broker a call about one broker's queues goes to."""
        return self.routes.connection(self.routes.only_address(what))

    def cluster_brokers(self, cluster: str = "") -> list[pb.BrokerEntry]:
        """The live brokers the name servers know (``equeue cluster list``)."""
        return self.routes.brokers(cluster)

    def route(self, topic: str) -> Route:
        """A topic's route, fetched now (``equeue cluster routes TOPIC``)."""
        return self.routes.route(topic, refresh=True)

    def _route_brokers(self, topic: str) -> list[str]:
        return self.routes.route(topic, refresh=True).broker_names()

    def _all_brokers(self) -> list[str]:
        return sorted({b.broker_name for b in self.routes.brokers()})

    def down_brokers(self) -> dict[str, str]:
        """{broker group: why} for the groups the name servers remember as
        down (every member's registration expired): a view spanning the
        cluster misses their queues. Empty for one broker (its routes list
        it live: a broker that does not answer says so itself)."""
        entries = self.routes.brokers(include_down=True)
        live = {e.broker_name for e in entries if member_state(e) != "down"}
        out: dict[str, str] = {}
        for e in entries:
            if e.broker_name not in live:
                out.setdefault(
                    e.broker_name, f"down: not heard from for {e.silent_ms / 1000:.0f} s"
                )
        return out

    def _each_reachable(
        self, brokers: Sequence[str], call: Callable[[Connection], T]
    ) -> tuple[list[tuple[str, T]], dict[str, str]]:
        """``call`` on each broker's master, as ``_each``; a broker that cannot
        be reached (unavailable, deadline) is left out and returned with why,
        ``{broker: why}`` (``Routes.leave_out``: one broker's error is
        raised); BrokerUnavailable when none answers."""
        out: list[tuple[str, T]] = []
        missing: dict[str, str] = {}
        for broker in brokers:
            try:
                out.extend(self._each([broker], call))
            except (BrokerUnavailable, DeadlineExceeded) as exc:
                missing[broker] = self.routes.leave_out(broker, exc)
        if brokers and not out:
            raise BrokerUnavailable(
                "no broker answers: " + "; ".join(f"{b}: {why}" for b, why in missing.items())
            )
        return out, missing

    @staticmethod
    def _merged(name: str, parts: list[tuple[str, pb.TopicInfo]]) -> pb.TopicInfo:
        info = pb.TopicInfo(name=name)
        for broker, part in parts:
            info.created_ms = min(info.created_ms or part.created_ms, part.created_ms)
            info.incarnation = info.incarnation or part.incarnation
            info.delayed_pending += part.delayed_pending
            if part.delayed_next_due_ms and (
                not info.delayed_next_due_ms or part.delayed_next_due_ms < info.delayed_next_due_ms
            ):
                info.delayed_next_due_ms = part.delayed_next_due_ms
            for queue in part.queues:
                info.queues.add().CopyFrom(queue)
                info.queues[-1].broker = broker
        return info

    # -- topics ------------------------------------------------------------------------

    def create_topic(
        self, name: str, queues: int = 0, brokers: Sequence[str] | None = None
    ) -> pb.TopicInfo:
        """Create a topic (``queues`` 0 = the broker's default); in a cluster,
        ``queues`` on each of ``brokers`` (default: every live broker)."""
        request = pb.CreateTopicRequest(name=name, queue_count=queues)
        chosen = list(brokers or self._all_brokers())
        if not chosen:
            raise NotFoundError("no live broker is registered with the name servers")
        parts = self._each(chosen, lambda c: c.call(c.admin.CreateTopic, request, retry=False))
        self.routes.invalidate(name)
        return self._merged(name, parts)

    def delete_topic(self, name: str) -> None:
        request = pb.DeleteTopicRequest(name=name)
        self._each(
            self._route_brokers(name), lambda c: c.call(c.admin.DeleteTopic, request, retry=False)
        )
        self.routes.invalidate(name)

    def list_topics(self) -> list[pb.TopicInfo]:
        """Every topic, merged over the brokers. In a cluster, a broker group
        that is down (name servers remember it) or does not answer is named
        in ``TopicInfo.unreachable_brokers`` of each topic it registered
        (a topic only there is listed without queues): a partial view says so."""
        by_name: dict[str, list[tuple[str, pb.TopicInfo]]] = {}
        listed, missing = self._each_reachable(
            self._all_brokers(), lambda c: c.call(c.admin.ListTopics, pb.ListTopicsRequest())
        )
        for broker, reply in listed:
            for topic in reply.topics:
                by_name.setdefault(topic.name, []).append((broker, topic))
        missing.update(self.down_brokers())
        lost: dict[str, set[str]] = {}
        if missing:  # which topics they hold, as they last registered
            for entry in self.routes.brokers(include_down=True, with_topic_names=True):
                if entry.broker_name in missing:
                    for name in entry.topic_names:
                        lost.setdefault(name, set()).add(entry.broker_name)
                        by_name.setdefault(name, [])
        out = []
        for name, parts in sorted(by_name.items()):
            info = self._merged(name, parts)
            info.unreachable_brokers.extend(sorted(lost.get(name, ())))
            out.append(info)
        return out

    def describe_topic(self, name: str) -> pb.TopicInfo:
        """The topic's queues on every broker group of its route (a replica
        answers for a group whose master does not); a group that does not
        answer raises, naming it. Groups the name servers remember as down
        are named in ``unreachable_brokers`` (their queues are missing)."""
        request = pb.DescribeTopicRequest(name=name)
        parts = []
        route = self.routes.route(name, refresh=True)
        for broker in route.broker_names():  # a read: a replica may answer it
            try:
                parts.append((broker, self.read_on(broker, name, lambda a: a._describe(request))))
            except EqueueError as exc:
                raise name_broker(exc, broker, "") from exc
        info = self._merged(name, parts)
        info.unreachable_brokers.extend(route.down)
        return info

    def _describe(self, request: pb.DescribeTopicRequest) -> pb.TopicInfo:
        conn = self._only("describe_topic")
        return conn.call(conn.admin.DescribeTopic, request)

    def add_queues(
        self, name: str, count: int = 1, brokers: Sequence[str] | None = None
    ) -> pb.TopicInfo:
        """Add ``count`` queues; in a cluster, ``count`` on each of ``brokers``
        (default: every broker of the topic's route; a broker that does not
        host the topic yet gets it, with ``count`` queues)."""
        request = pb.AddQueuesRequest(name=name, count=count)
        hosting = self._route_brokers(name)
        create = pb.CreateTopicRequest(name=name, queue_count=count)

        def grow(conn: Connection, hosted: bool) -> object:
            if hosted:
                return conn.call(conn.admin.AddQueues, request, retry=False)
            return conn.call(conn.admin.CreateTopic, create, retry=False)

        for broker in list(brokers or hosting):  # one without the topic gets it, `count` queues
            hosted = broker in hosting
            self._each([broker], lambda c, hosted=hosted: grow(c, hosted))  # type: ignore[misc]
        self.routes.invalidate(name)
        return self.describe_topic(name)

    def set_queue_visibility(
        self,
        name: str,
        queue_id: int,
        *,
        producer: bool | None = None,
        consumer: bool | None = None,
        broker: str = "",
    ) -> pb.TopicInfo:
        conn = self._queue_broker(name, broker)
        request = pb.SetQueueVisibilityRequest(name=name, queue_id=queue_id)
        if producer is not None:
            request.producer_visible = producer
        if consumer is not None:
            request.consumer_visible = consumer
        return conn.call(conn.admin.SetQueueVisibility, request)

    def delete_queue(
        self, name: str, queue_id: int, force: bool = False, broker: str = ""
    ) -> pb.TopicInfo:
        """Delete a queue hidden from producers and consumers. Unless ``force``,
        ``PreconditionError`` if some group that committed on the topic has not
        consumed all of it, or no group committed and it is not empty; with
        ``force`` its unconsumed messages are dropped."""
        conn = self._queue_broker(name, broker)
        request = pb.DeleteQueueRequest(name=name, queue_id=queue_id, force=force)
        return conn.call(conn.admin.DeleteQueue, request, retry=False)

    # -- groups ------------------------------------------------------------------------

    def list_groups(self) -> list[str]:
        """Every consumer group of the brokers that answer (in a cluster, the
        ones on groups that are down or do not answer are missing: see
        ``describe_group``'s ``unreachable_brokers``)."""
        groups, _ = self._each_reachable(
            self._all_brokers(), lambda c: c.call(c.admin.ListGroups, pb.ListGroupsRequest())
        )
        return sorted({g for _, reply in groups for g in reply.groups})

    def _on_each_having(
        self, group: str, call: Callable[[Connection], T], unreachable: list[str] | None = None
    ) -> list[tuple[str, T]]:
        """``call`` on every live broker; those that do not know ``group``
        (NotFoundError) are left out. NotFoundError if none knows it (the
        broker's own when there is one broker). With ``unreachable`` (a
        read), brokers that do not answer (``Routes.leave_out``: one
        broker's error is raised), and groups remembered as down, are
        appended to it instead of failing the call."""
        out = []
        missing: list[NotFoundError] = []
        brokers = self._all_brokers()
        for broker in brokers:
            try:
                out.extend(self._each([broker], call))
            except NotFoundError as exc:
                missing.append(exc)
            except (BrokerUnavailable, DeadlineExceeded) as exc:
                if unreachable is None:
                    raise
                self.routes.leave_out(broker, exc)
                unreachable.append(broker)
        if unreachable is not None:
            unreachable.extend(self.down_brokers())
            unreachable.sort()
        if not out:
            down = f" ({', '.join(unreachable)} could not be asked)" if unreachable else ""
            if len(missing) == 1 and not unreachable:
                raise missing[0]
            raise NotFoundError(f"group {group!r} is on no live broker{down}")
        return out

    def describe_group(self, group: str) -> pb.GroupInfo:
        """A group's progress; in a cluster, every broker's queues (lag per
        (broker, queue)) and the union of the members each broker sees. Broker
        groups that are down or do not answer are named in
        ``unreachable_brokers``: their queues are missing from ``queues``,
        ``total_lag`` and ``max_lag_ms`` (a partial view)."""
        request = pb.DescribeGroupRequest(group=group)
        unreachable: list[str] = []
        parts = self._on_each_having(
            group, lambda c: c.call(c.admin.DescribeGroup, request), unreachable
        )
        info = pb.GroupInfo(group=group, unreachable_brokers=unreachable)
        members: set[str] = set()
        for broker, part in parts:
            members.update(part.consumer_ids)
            info.total_lag += part.total_lag
            info.max_lag_ms = max(info.max_lag_ms, part.max_lag_ms)
            for queue in part.queues:
                info.queues.add().CopyFrom(queue)
                info.queues[-1].broker = broker
        info.consumer_ids.extend(sorted(members))
        return info

    def reset_offsets(
        self,
        group: str,
        topic: str,
        *,
        to: str | None = None,
        timestamp_ms: int | None = None,
        offsets: Mapping[int, int] | None = None,
        broker: str = "",
    ) -> pb.GroupInfo:
        """Move a group's offsets: ``to="earliest"|"latest"``, a timestamp, or
        explicit ``{queue_id: next_offset}`` (exactly one of them). In a
        cluster every broker of the topic moves (explicit offsets: only ``broker``)."""
        request = pb.ResetOffsetsRequest(group=group, topic=topic)
        given = [to is not None, timestamp_ms is not None, offsets is not None]
        if sum(given) != 1:
            raise ValueError("give exactly one of to=, timestamp_ms=, offsets=")
        if to == "earliest":
            request.earliest = True
        elif to == "latest":
            request.latest = True
        elif to is not None:
            raise ValueError(f"to must be 'earliest' or 'latest', got {to!r}")
        elif timestamp_ms is not None:
            request.timestamp_ms = timestamp_ms
        else:
            assert offsets is not None
            request.explicit.offsets.update(offsets)
        if offsets is not None:
            brokers = [self.routes.group(broker, QUEUE_NEEDS_BROKER.format(topic=topic))]
        else:
            brokers = [broker] if broker else self._route_brokers(topic)
        self._each(brokers, lambda c: c.call(c.admin.ResetOffsets, request), topic)
        return self.describe_group(group)

    def delete_group(self, group: str) -> None:
        request = pb.DeleteGroupRequest(group=group)
        self._on_each_having(group, lambda c: c.call(c.admin.DeleteGroup, request, retry=False))

    # -- messages ----------------------------------------------------------------------

    def get_message(self, message_id: str) -> Message:
        """A message by id; in a cluster the id names its broker (``NAME-POSITION``)."""
        conn = self.routes.connection(self.routes.message_address(message_id))
        request = pb.GetMessageRequest(message_id=message_id)
        return self._one(conn.call(conn.admin.GetMessage, request), f"message {message_id}")

    def get_message_at(self, topic: str, queue_id: int, offset: int, broker: str = "") -> Message:
        conn = self._queue_broker(topic, broker)
        address = pb.QueueOffset(topic=topic, queue_id=queue_id, offset=offset)
        request = pb.GetMessageRequest(address=address)
        reply = conn.call(conn.admin.GetMessage, request)
        where = {"topic": topic, "queue_id": queue_id, "offset": offset}
        return self._one(reply, f"{topic}/{queue_id} offset {offset}", **where)

    def query_messages(
        self,
        topic: str,
        key: bytes | str | None = None,
        start: datetime | int | None = None,
        end: datetime | int | None = None,
        limit: int = DEFAULT_QUERY_LIMIT,
    ) -> QueryResult:
        """Messages of ``topic`` whose key, or one of whose extra keys (the
        ``keys`` header), equals ``key`` byte for byte, stored in [start, end)
        (datetime, or ms since the epoch; None: unbounded); with ``key`` None,
        every message in the range. Newest store time first, at most ``limit``
        (1 to 10,000). Staged, aborted and pending delayed messages never
        show. In a cluster every broker group of the topic's route is asked (a
        replica answers for a group whose master does not) and the answers
        merged. A ``QueryResult`` (a list) whose ``truncated`` is True when
        more may match (a limit reached by a broker group, or the merge). The
        broker ends a query at its reply's byte limit, its scan limit or its
        time budget. FailedPreconditionError by key when the broker's key
        index is off (``--no-key-index``)."""
        request = query_request(topic, key, start, end, limit)
        found: list[Message] = []
        truncated = False
        for broker in self.routes.route(topic, refresh=True).broker_names():
            try:
                reply = self.read_on(broker, topic, lambda a: a._query(request))
            except EqueueError as exc:
                raise name_broker(exc, broker, "") from exc
            found += (self._one(m, f"{topic} query") for m in reply.messages)
            truncated |= reply.truncated
        found.sort(key=lambda m: (m.store_timestamp_ms, m.position), reverse=True)
        return QueryResult(found[:limit], truncated or len(found) > limit)

    def _query(self, request: pb.QueryMessagesRequest) -> pb.QueryMessagesReply:
        conn = self._only("query_messages")
        return conn.call(conn.admin.QueryMessages, request)

    @staticmethod
    def _one(reply: pb.GetMessageReply, asked: str, **where: Any) -> Message:
        """The reply's message; a record damaged on the way (the broker checks
        what it sends) raises DataLossError naming what was asked for."""
        broker_id = reply.message_id.rpartition("-")[0]
        try:
            (message,) = decode_records(reply.record, broker_id)
        except DataLossError as exc:
            try:
                position: int | None = parse_message_id(reply.message_id)[1]
            except ValueError:
                position = None
            raise DataLossError(f"{asked}: {exc}", position=position, **where) from None
        return message

    def cancel_delayed(self, message_id: str) -> pb.CancelDelayedReply:
        """Withdraw a pending delayed message by the id its send returned
        (``Producer.cancel_delayed``); NotFoundError if none is pending there."""
        return cancel_delayed(self.routes, message_id)

    # -- schemas (schema_admin.py) -----------------------------------------------------

    def get_schema(
        self, topic: str, version: int = 0, *, key: bool = False, history: bool = False
    ) -> pb.SchemaInfo:
        """The topic's value (``key=True``: key) schema: ``version`` (0: the
        latest), or every version (``history``), ascending in ``versions``.
        In a cluster from the group whose route shows the highest version
        (replicas may answer). NotFoundError when the topic has no such schema."""
        return schema_admin.get_schema(self.routes, topic, version, key=key, history=history)

    def set_schema(
        self,
        topic: str,
        schema: str | bytes | Mapping[str, Any],
        *,
        type: str = "",
        key: bool = False,
        compatibility: str | None = None,
        dry_run: bool = False,
    ) -> pb.SchemaInfo:
        """Register a version of the topic's value (``key=True``: key) schema:
        Avro or JSON Schema text (or the parsed document), ``type`` "avro" or
        "json" ("": guessed from the document). The broker checks it against
        the subject's rule (``compatibility`` sets the rule along with it):
        SchemaIncompatibleError listing the problems. A schema equal to an
        existing version returns that version (``created`` False). With
        ``dry_run`` only the check: ``problems`` lists what is incompatible.
        In a cluster every broker group gets the same version number
        (SchemaConflictError when their histories differ; groups that do not
        answer are named in ``unreachable_brokers``: ``sync_schemas`` later)."""
        try:
            return schema_admin.set_schema(
                self.routes, topic, schema, type=type, key=key, compatibility=compatibility,
                dry_run=dry_run,
            )  # fmt: skip
        finally:  # a Serializer on these routes sees the new version at once
            SchemaCache.of(self.routes).forget(topic)

    def set_compatibility(self, topic: str, rule: str, *, key: bool = False) -> pb.SchemaInfo:
        """Change the subject's compatibility rule (``NONE``, ``BACKWARD``, ...)."""
        return schema_admin.set_compatibility(self.routes, topic, rule, key=key)

    def delete_schemas(self, topic: str, *, key: bool | None = False) -> list[str]:
        """Forget the topic's value schema (``key=True``: key; None: both).
        Records keep their version headers. The broker groups that did not
        answer (empty for one broker)."""
        try:
            return schema_admin.delete_schemas(self.routes, topic, key=key)
        finally:
            SchemaCache.of(self.routes).forget(topic)

    def sync_schemas(self, topic: str) -> dict[str, dict[str, list[int]]]:
        """Give the broker groups that lag the schema versions they lack:
        ``{"value": {group: versions copied}, "key": {...}}``; nothing to do
        for one broker."""
        return schema_admin.sync_schemas(self.routes, topic)

    # -- dead letters (dead_letters.py) ------------------------------------------------

    def dead_letters(self, group: str, max_messages: int = 1000) -> list[Message]:
        """The group's dead letters (``%DLQ%<group>``), oldest first, at most
        ``max_messages``; each says where it came from (``Message.origin``),
        how often it was delivered and the last error it was given back with."""
        return list_dead_letters(self.routes, group, max_messages)

    def resend_dead_letters(
        self, group: str, message_ids: Sequence[str] = (), *, all: bool = False
    ) -> pb.ResendDeadLettersReply:
        """Append dead letters back to the topic and queue they came from, each
        at most once: by id, or ``all=True`` every one not resent yet."""
        return resend_dead_letters(self.routes, group, message_ids, all)

    def purge_dead_letters(self, group: str) -> int:
        """Delete the group's dead-letter topic; the messages it held."""
        return purge_dead_letters(self.routes, group)

    def list_offsets(self, topic: str, timestamp_ms: int | None = None) -> list[pb.QueueOffsets]:
        """Every queue's earliest and end offsets (and, given ``timestamp_ms``,
        the first offset stored at or after it), by queue id."""
        self._only("list_offsets")
        return list(self.list_topic_offsets(topic, timestamp_ms).queues)

    def list_topic_offsets(
        self, topic: str, timestamp_ms: int | None = None
    ) -> pb.ListOffsetsReply:
        """``list_offsets`` with the topic's ``incarnation`` beside the ``queues``
        (both from one call, so the offsets are known to be that incarnation's)."""
        request = pb.ListOffsetsRequest(topic=topic, timestamp_ms=timestamp_ms)
        conn = self._only("list_topic_offsets")
        return conn.call(conn.broker.ListOffsets, request)

    def offset_for_bytes(
        self, topic: str, queue_id: int, start: int, end: int, max_bytes: int
    ) -> tuple[int, int]:
        """``(stop, bytes)``: how far ``max_bytes`` of stored records from
        ``start`` reach, not past ``end`` (at least one record when there is one)."""
        request = pb.OffsetForBytesRequest(
            topic=topic, queue_id=queue_id, start_offset=start, end_offset=end, max_bytes=max_bytes
        )
        conn = self._only("offset_for_bytes")
        reply = conn.call(conn.broker.OffsetForBytes, request)
        return reply.end_offset, reply.bytes

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Record ``group``'s progress, ``{(topic, queue_id): next offset}``,
        without joining the group (what a Spark query does for its group)."""
        commit_offsets(self._only("commit_offsets"), group, offsets)

    def fetch_offsets(self, group: str, topic: str = "") -> dict[tuple[str, int], int]:
        """``group``'s committed offsets, ``{(topic, queue_id): next offset}``
        (only ``topic``'s when given)."""
        request = pb.FetchOffsetsRequest(group=group, topic=topic)
        conn = self._only("fetch_offsets")
        reply = conn.call(conn.broker.FetchOffsets, request)
        return {(o.topic, o.queue_id): o.offset for o in reply.offsets}

    def list_transactions(self, prefix: str = "") -> pb.ListTransactionsReply:
        """Open transactions (ids starting with ``prefix``) and sinks' progress."""
        conn = self._only("list_transactions")
        return conn.call(conn.admin.ListTransactions, pb.ListTransactionsRequest(prefix=prefix))

    def abort_transactions(self, ids: Sequence[str] = (), prefix: str = "") -> int:
        """Abort open transactions by id or id prefix; return how many."""
        return abort_transactions(self._only("abort_transactions"), ids, prefix)

    def cluster_stats(self, cluster: str = "", timeout_s: float = PROBE_TIMEOUT_S) -> (
        list[MemberStats]
    ):  # fmt: skip
        """Every member's ``GetStats``, asked at once (``timeout_s`` each, no
        retry): masters and replicas the name servers list, and those they
        remember as down (not asked). A member that does not answer is
        ``unreachable``; one that refuses (a token without the admin role)
        answers, without stats. One broker: its own, as a member named ""."""
        entries = self.routes.brokers(cluster, include_down=True)

        def ask(entry: pb.BrokerEntry) -> MemberStats:
            state = member_state(entry)
            if state == "down":
                why = f"registration expired: not heard from for {entry.silent_ms / 1000:.0f} s"
                return MemberStats(entry, "down", None, why)
            conn = self.routes.connection(entry.address)
            try:
                reply = conn.call(
                    conn.admin.GetStats, pb.GetStatsRequest(), timeout_s=timeout_s, retry=False
                )
            except (BrokerUnavailable, DeadlineExceeded) as exc:
                self.routes.mark_down(entry.address)
                return MemberStats(entry, "unreachable", None, str(exc))
            except EqueueError as exc:
                return MemberStats(entry, state, None, str(exc))
            return MemberStats(entry, state, reply)

        if len(entries) <= 1:
            return [ask(e) for e in entries]
        with ThreadPoolExecutor(min(len(entries), 16), thread_name_prefix="equeue-stats") as pool:
            return list(pool.map(ask, entries))

    def stats(self) -> pb.BrokerStats:
        conn = self._only("stats")
        return conn.call(conn.admin.GetStats, pb.GetStatsRequest())

    def set_role(self, role: str, master: str = "", epoch: int = 0) -> pb.BrokerStats:
        """Make the broker ``role`` ("master" or "replica" of ``master``) in group
        epoch ``epoch`` (manual failover, docs/replication.md); its stats after."""
        request = pb.SetRoleRequest(role=role, master=master, epoch=epoch)
        conn = self._only("set_role")
        return conn.call(conn.admin.SetRole, request)

    def close(self) -> None:
        for admin in self._admins.values():
            admin.close()
        self._admins.clear()
        self.routes.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
