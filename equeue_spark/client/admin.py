"""``Admin``: every administrative RPC, with deadlines and mapped errors.

Replies are the contract's protobuf messages (``equeue_proto.v1.broker_pb2``),
whose fields are documented in the ``.proto``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from equeue_proto.protocol import parse_message_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.cluster import Cluster, Route, name_broker
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.errors import (
    BrokerUnavailable,
    DeadlineExceeded,
    EqueueError,
    InvalidRequest,
    NotFoundError,
)
from equeue_spark.client.records import Message, decode_records
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
F = TypeVar("F", bound=Callable[..., object])


def _single_broker(method: F) -> F:
    """A call about one broker's queues: in a cluster, ask ``broker_admin(NAME)``."""

    @functools.wraps(method)
    def wrapper(self: Admin, *args: object, **kwargs: object) -> object:
        if self.cluster is not None:
            raise InvalidRequest(
                f"{method.__name__} is about one broker's queues: in a cluster use "
                "admin.broker_admin(NAME)." + method.__name__
            )
        return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


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
    """

    def __init__(
        self,
        broker: str = "",
        *,
        namesrv: str | Sequence[str] = "",
        config: ClientConfig | None = None,
    ) -> None:
        config = config or ClientConfig(broker=broker, namesrv=namesrv)
        self.cluster: Cluster | None = Cluster(config) if config.is_cluster else None
        """The name servers' view (None: one broker)."""
        self._admins: dict[str, Admin] = {}
        if self.cluster is None:
            self._conn = Connection(config)
            self._stub = self._conn.admin

    # -- a cluster: one Admin per broker ---------------------------------------------

    def broker_admin(self, broker: str, topic: str = "") -> Admin:
        """The single-broker ``Admin`` of ``broker`` (cluster only)."""
        cluster = self._need_cluster()
        address = cluster.route(topic).address(broker) if topic else cluster.broker_address(broker)
        admin = self._admins.get(address)
        if admin is None:
            admin = Admin(config=cluster.config.for_broker(address))
            self._admins[address] = admin
        return admin

    def read_on(self, broker: str, topic: str, call: Callable[[Admin], T], seed: str = "") -> T:
        """``call`` on the member of ``broker``'s group that serves ``topic``'s
        reads (the master; a replica with ``read_from_replicas``), moving to
        the next member when one does not answer (cluster only). For reads
        only: a replica refuses writes."""
        cluster = self._need_cluster()
        addresses = cluster.read_addresses(topic, broker, seed)
        errors = []
        for index, address in enumerate(addresses):
            admin = self._admin_at(address, last=index == len(addresses) - 1)
            try:
                return call(admin)
            except (BrokerUnavailable, DeadlineExceeded) as exc:
                cluster.mark_down(address)
                errors.append(f"{address}: {exc}")
        tried = "; ".join(errors)
        raise BrokerUnavailable(f"no member of broker group {broker!r} answers: {tried}")

    def read_addresses(self, broker: str, topic: str, seed: str = "") -> list[str]:
        """The members of ``broker``'s group in the order reads try them."""
        return self._need_cluster().read_addresses(topic, broker, seed)

    def _admin_at(self, address: str, last: bool) -> Admin:
        """The Admin of one member; one that is not the last to try retries
        once (the next member is the better retry)."""
        key = address if last else f"{address} (fail fast)"
        admin = self._admins.get(key)
        if admin is None:
            config = self._need_cluster().config.for_broker(address)
            if not last:
                config = dataclasses.replace(config, retries=min(config.retries, 1))
            admin = Admin(config=config)
            self._admins[key] = admin
        return admin

    def _need_cluster(self) -> Cluster:
        if self.cluster is None:
            raise InvalidRequest("this Admin talks to one broker; give namesrv= for a cluster")
        return self.cluster

    def _each(self, brokers: Sequence[str], call: Callable[[Admin], T], topic: str = "") -> (
        list[tuple[str, T]]
    ):  # fmt: skip
        """``call`` on each broker in turn; an error names the broker (calls
        made before it stand)."""
        out = []
        for broker in brokers:
            admin = self.broker_admin(broker, topic)
            try:
                out.append((broker, call(admin)))
            except EqueueError as exc:
                raise name_broker(exc, broker, admin._conn.config.target) from exc
        return out

    def cluster_brokers(self, cluster: str = "") -> list[pb.BrokerEntry]:
        """The live brokers the name servers know (``equeue cluster list``)."""
        return self._need_cluster().brokers(cluster)

    def route(self, topic: str) -> Route:
        """A topic's route, fetched now (``equeue cluster routes TOPIC``)."""
        return self._need_cluster().route(topic, refresh=True)

    def _route_brokers(self, topic: str) -> list[str]:
        return self._need_cluster().route(topic, refresh=True).broker_names()

    @staticmethod
    def _merged(name: str, parts: list[tuple[str, pb.TopicInfo]]) -> pb.TopicInfo:
        info = pb.TopicInfo(name=name)
        for broker, part in parts:
            info.created_ms = min(info.created_ms or part.created_ms, part.created_ms)
            info.incarnation = info.incarnation or part.incarnation
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
        if self.cluster is None:
            if brokers:
                raise InvalidRequest("brokers= needs a cluster (namesrv=)")
            return self._conn.call(self._stub.CreateTopic, request, retry=False)
        chosen = list(brokers or sorted({b.broker_name for b in self.cluster.brokers()}))
        if not chosen:
            raise NotFoundError("no live broker is registered with the name servers")
        parts = self._each(
            chosen, lambda a: a._conn.call(a._stub.CreateTopic, request, retry=False)
        )
        self.cluster.invalidate(name)
        return self._merged(name, parts)

    def delete_topic(self, name: str) -> None:
        if self.cluster is None:
            self._conn.call(self._stub.DeleteTopic, pb.DeleteTopicRequest(name=name), retry=False)
            return
        self._each(self._route_brokers(name), lambda a: a.delete_topic(name), name)
        self.cluster.invalidate(name)

    def list_topics(self) -> list[pb.TopicInfo]:
        if self.cluster is None:
            return list(self._conn.call(self._stub.ListTopics, pb.ListTopicsRequest()).topics)
        by_name: dict[str, list[tuple[str, pb.TopicInfo]]] = {}
        brokers = sorted({b.broker_name for b in self.cluster.brokers()})
        for broker, topics in self._each(brokers, lambda a: a.list_topics()):
            for topic in topics:
                by_name.setdefault(topic.name, []).append((broker, topic))
        return [self._merged(name, parts) for name, parts in sorted(by_name.items())]

    def describe_topic(self, name: str) -> pb.TopicInfo:
        if self.cluster is None:
            return self._conn.call(self._stub.DescribeTopic, pb.DescribeTopicRequest(name=name))
        parts = []
        for broker in self._route_brokers(name):  # a read: a replica may answer it
            try:
                parts.append((broker, self.read_on(broker, name, lambda a: a.describe_topic(name))))
            except EqueueError as exc:
                raise name_broker(exc, broker, "") from exc
        return self._merged(name, parts)

    def add_queues(
        self, name: str, count: int = 1, brokers: Sequence[str] | None = None
    ) -> pb.TopicInfo:
        """Add ``count`` queues; in a cluster, ``count`` on each of ``brokers``
        (default: every broker of the topic's route; a broker that does not
        host the topic yet gets it, with ``count`` queues)."""
        request = pb.AddQueuesRequest(name=name, count=count)
        if self.cluster is None:
            return self._conn.call(self._stub.AddQueues, request, retry=False)
        hosting = self._route_brokers(name)
        chosen = list(brokers or hosting)
        create = pb.CreateTopicRequest(name=name, queue_count=count)

        def grow(admin: Admin, hosted: bool) -> object:
            if hosted:
                return admin._conn.call(admin._stub.AddQueues, request, retry=False)
            return admin._conn.call(admin._stub.CreateTopic, create, retry=False)

        for broker in chosen:  # a broker without the topic yet gets it with `count` queues
            self._each([broker], functools.partial(grow, hosted=broker in hosting))
        self.cluster.invalidate(name)
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
        if self.cluster is not None:
            return self._one_broker(name, broker).set_queue_visibility(
                name, queue_id, producer=producer, consumer=consumer
            )
        request = pb.SetQueueVisibilityRequest(name=name, queue_id=queue_id)
        if producer is not None:
            request.producer_visible = producer
        if consumer is not None:
            request.consumer_visible = consumer
        return self._conn.call(self._stub.SetQueueVisibility, request)

    def delete_queue(
        self, name: str, queue_id: int, force: bool = False, broker: str = ""
    ) -> pb.TopicInfo:
        """Delete a queue hidden from producers and consumers. Unless ``force``,
        ``PreconditionError`` if some group that committed on the topic has not
        consumed all of it, or no group committed and it is not empty; with
        ``force`` its unconsumed messages are dropped."""
        if self.cluster is not None:
            return self._one_broker(name, broker).delete_queue(name, queue_id, force)
        request = pb.DeleteQueueRequest(name=name, queue_id=queue_id, force=force)
        return self._conn.call(self._stub.DeleteQueue, request, retry=False)

    def _one_broker(self, topic: str, broker: str) -> Admin:
        if not broker:
            raise InvalidRequest(
                f"in a cluster a queue of {topic!r} is (broker, queue id): give its broker"
            )
        return self.broker_admin(broker, topic)

    def _all_brokers(self) -> list[str]:
        return sorted({b.broker_name for b in self._need_cluster().brokers()})

    def list_groups(self) -> list[str]:
        if self.cluster is not None:
            groups = self._each(self._all_brokers(), lambda a: a.list_groups())
            return sorted({g for _, names in groups for g in names})
        return list(self._conn.call(self._stub.ListGroups, pb.ListGroupsRequest()).groups)

    def describe_group(self, group: str) -> pb.GroupInfo:
        """A group's progress; in a cluster, every broker's queues (lag per
        (broker, queue)) and the union of the members each broker sees."""
        if self.cluster is None:
            return self._conn.call(self._stub.DescribeGroup, pb.DescribeGroupRequest(group=group))
        info = pb.GroupInfo(group=group)
        members: set[str] = set()
        found = False
        for broker in self._all_brokers():
            try:
                part = self.broker_admin(broker).describe_group(group)
            except NotFoundError:
                continue
            found = True
            members.update(part.consumer_ids)
            info.total_lag += part.total_lag
            for queue in part.queues:
                info.queues.add().CopyFrom(queue)
                info.queues[-1].broker = broker
        if not found:
            raise NotFoundError(f"group {group!r} is on no live broker")
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
        if self.cluster is not None:
            if offsets is not None:
                admin = self._one_broker(topic, broker)
                return admin.reset_offsets(group, topic, offsets=offsets)
            brokers = [broker] if broker else self._route_brokers(topic)
            self._each(
                brokers,
                lambda a: a.reset_offsets(group, topic, to=to, timestamp_ms=timestamp_ms),
                topic,
            )
            return self.describe_group(group)
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
        return self._conn.call(self._stub.ResetOffsets, request)

    def delete_group(self, group: str) -> None:
        if self.cluster is not None:
            deleted = 0
            for broker in self._all_brokers():
                try:
                    self.broker_admin(broker).delete_group(group)
                    deleted += 1
                except NotFoundError:
                    pass
            if not deleted:
                raise NotFoundError(f"group {group!r} is on no live broker")
            return
        self._conn.call(self._stub.DeleteGroup, pb.DeleteGroupRequest(group=group), retry=False)

    def get_message(self, message_id: str) -> Message:
        """A message by id; in a cluster the id names its broker (``NAME-POSITION``)."""
        if self.cluster is not None:
            try:
                broker, _ = parse_message_id(message_id)
            except ValueError as exc:
                raise InvalidRequest(str(exc)) from None
            return self.broker_admin(broker).get_message(message_id)
        request = pb.GetMessageRequest(message_id=message_id)
        return self._one(self._conn.call(self._stub.GetMessage, request))

    def get_message_at(self, topic: str, queue_id: int, offset: int, broker: str = "") -> Message:
        if self.cluster is not None:
            return self._one_broker(topic, broker).get_message_at(topic, queue_id, offset)
        address = pb.QueueOffset(topic=topic, queue_id=queue_id, offset=offset)
        request = pb.GetMessageRequest(address=address)
        return self._one(self._conn.call(self._stub.GetMessage, request))

    @staticmethod
    def _one(reply: pb.GetMessageReply) -> Message:
        broker_id = reply.message_id.rpartition("-")[0]
        (message,) = decode_records(reply.record, broker_id)
        return message

    @_single_broker
    def list_offsets(self, topic: str, timestamp_ms: int | None = None) -> list[pb.QueueOffsets]:
        """Every queue's earliest and end offsets (and, given ``timestamp_ms``,
        the first offset stored at or after it), by queue id."""
        return list(self.list_topic_offsets(topic, timestamp_ms).queues)

    @_single_broker
    def list_topic_offsets(
        self, topic: str, timestamp_ms: int | None = None
    ) -> pb.ListOffsetsReply:
        """``list_offsets`` with the topic's ``incarnation`` beside the ``queues``
        (both from one call, so the offsets are known to be that incarnation's)."""
        request = pb.ListOffsetsRequest(topic=topic, timestamp_ms=timestamp_ms)
        return self._conn.call(self._conn.broker.ListOffsets, request)

    @_single_broker
    def offset_for_bytes(
        self, topic: str, queue_id: int, start: int, end: int, max_bytes: int
    ) -> tuple[int, int]:
        """``(stop, bytes)``: how far ``max_bytes`` of stored records from
        ``start`` reach, not past ``end`` (at least one record when there is one)."""
        request = pb.OffsetForBytesRequest(
            topic=topic, queue_id=queue_id, start_offset=start, end_offset=end, max_bytes=max_bytes
        )
        reply = self._conn.call(self._conn.broker.OffsetForBytes, request)
        return reply.end_offset, reply.bytes

    @_single_broker
    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Record ``group``'s progress, ``{(topic, queue_id): next offset}``,
        without joining the group (what a Spark query does for its group)."""
        commit_offsets(self._conn, group, offsets)

    @_single_broker
    def fetch_offsets(self, group: str, topic: str = "") -> dict[tuple[str, int], int]:
        """``group``'s committed offsets, ``{(topic, queue_id): next offset}``
        (only ``topic``'s when given)."""
        request = pb.FetchOffsetsRequest(group=group, topic=topic)
        reply = self._conn.call(self._conn.broker.FetchOffsets, request)
        return {(o.topic, o.queue_id): o.offset for o in reply.offsets}

    @_single_broker
    def list_transactions(self, prefix: str = "") -> pb.ListTransactionsReply:
        """Open transactions (ids starting with ``prefix``) and sinks' progress."""
        return self._conn.call(
            self._stub.ListTransactions, pb.ListTransactionsRequest(prefix=prefix)
        )

    @_single_broker
    def abort_transactions(self, ids: Sequence[str] = (), prefix: str = "") -> int:
        """Abort open transactions by id or id prefix; return how many."""
        return abort_transactions(self._conn, ids, prefix)

    @_single_broker
    def stats(self) -> pb.BrokerStats:
        return self._conn.call(self._stub.GetStats, pb.GetStatsRequest())

    @_single_broker
    def set_role(self, role: str, master: str = "", epoch: int = 0) -> pb.BrokerStats:
        """Make the broker ``role`` ("master" or "replica" of ``master``) in group
        epoch ``epoch`` (manual failover, docs/replication.md); its stats after."""
        request = pb.SetRoleRequest(role=role, master=master, epoch=epoch)
        return self._conn.call(self._stub.SetRole, request)

    def close(self) -> None:
        if self.cluster is None:
            self._conn.close()
            return
        for admin in self._admins.values():
            admin.close()
        self._admins.clear()
        self.cluster.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
