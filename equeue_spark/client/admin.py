"""``Admin``: every administrative RPC, with deadlines and mapped errors.

Replies are the contract's protobuf messages (``equeue_proto.v1.broker_pb2``),
whose fields are documented in the ``.proto``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.connection import ClientConfig, Connection
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


class Admin:
    """Administer a broker::

    with Admin("127.0.0.1:5000") as admin:
        admin.create_topic("orders", queues=8)
        for q in admin.describe_topic("orders").queues:
            print(q.queue_id, q.end_offset, q.backlog)
    """

    def __init__(self, broker: str = "", *, config: ClientConfig | None = None) -> None:
        self._conn = Connection(config or ClientConfig(broker=broker))
        self._stub = self._conn.admin

    def create_topic(self, name: str, queues: int = 0) -> pb.TopicInfo:
        """Create a topic (``queues`` 0 = the broker's default)."""
        request = pb.CreateTopicRequest(name=name, queue_count=queues)
        return self._conn.call(self._stub.CreateTopic, request, retry=False)

    def delete_topic(self, name: str) -> None:
        self._conn.call(self._stub.DeleteTopic, pb.DeleteTopicRequest(name=name), retry=False)

    def list_topics(self) -> list[pb.TopicInfo]:
        return list(self._conn.call(self._stub.ListTopics, pb.ListTopicsRequest()).topics)

    def describe_topic(self, name: str) -> pb.TopicInfo:
        return self._conn.call(self._stub.DescribeTopic, pb.DescribeTopicRequest(name=name))

    def add_queues(self, name: str, count: int = 1) -> pb.TopicInfo:
        request = pb.AddQueuesRequest(name=name, count=count)
        return self._conn.call(self._stub.AddQueues, request, retry=False)

    def set_queue_visibility(
        self,
        name: str,
        queue_id: int,
        *,
        producer: bool | None = None,
        consumer: bool | None = None,
    ) -> pb.TopicInfo:
        request = pb.SetQueueVisibilityRequest(name=name, queue_id=queue_id)
        if producer is not None:
            request.producer_visible = producer
        if consumer is not None:
            request.consumer_visible = consumer
        return self._conn.call(self._stub.SetQueueVisibility, request)

    def delete_queue(self, name: str, queue_id: int, force: bool = False) -> pb.TopicInfo:
        """Delete a queue hidden from producers and consumers. Unless ``force``,
        ``PreconditionError`` if some group that committed on the topic has not
        consumed all of it, or no group committed and it is not empty; with
        ``force`` its unconsumed messages are dropped."""
        request = pb.DeleteQueueRequest(name=name, queue_id=queue_id, force=force)
        return self._conn.call(self._stub.DeleteQueue, request, retry=False)

    def list_groups(self) -> list[str]:
        return list(self._conn.call(self._stub.ListGroups, pb.ListGroupsRequest()).groups)

    def describe_group(self, group: str) -> pb.GroupInfo:
        return self._conn.call(self._stub.DescribeGroup, pb.DescribeGroupRequest(group=group))

    def reset_offsets(
        self,
        group: str,
        topic: str,
        *,
        to: str | None = None,
        timestamp_ms: int | None = None,
        offsets: Mapping[int, int] | None = None,
    ) -> pb.GroupInfo:
        """Move a group's offsets: ``to="earliest"|"latest"``, a timestamp, or
        explicit ``{queue_id: next_offset}`` (exactly one of them)."""
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
        self._conn.call(self._stub.DeleteGroup, pb.DeleteGroupRequest(group=group), retry=False)

    def get_message(self, message_id: str) -> Message:
        request = pb.GetMessageRequest(message_id=message_id)
        return self._one(self._conn.call(self._stub.GetMessage, request))

    def get_message_at(self, topic: str, queue_id: int, offset: int) -> Message:
        address = pb.QueueOffset(topic=topic, queue_id=queue_id, offset=offset)
        request = pb.GetMessageRequest(address=address)
        return self._one(self._conn.call(self._stub.GetMessage, request))

    @staticmethod
    def _one(reply: pb.GetMessageReply) -> Message:
        broker_id = reply.message_id.rpartition("-")[0]
        (message,) = decode_records(reply.record, broker_id)
        return message

    def list_offsets(self, topic: str, timestamp_ms: int | None = None) -> list[pb.QueueOffsets]:
        """Every queue's earliest and end offsets (and, given ``timestamp_ms``,
        the first offset stored at or after it), by queue id."""
        return list(self.list_topic_offsets(topic, timestamp_ms).queues)

    def list_topic_offsets(
        self, topic: str, timestamp_ms: int | None = None
    ) -> pb.ListOffsetsReply:
        """``list_offsets`` with the topic's ``incarnation`` beside the ``queues``
        (both from one call, so the offsets are known to be that incarnation's)."""
        request = pb.ListOffsetsRequest(topic=topic, timestamp_ms=timestamp_ms)
        return self._conn.call(self._conn.broker.ListOffsets, request)

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

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Record ``group``'s progress, ``{(topic, queue_id): next offset}``,
        without joining the group (what a Spark query does for its group)."""
        commit_offsets(self._conn, group, offsets)

    def fetch_offsets(self, group: str, topic: str = "") -> dict[tuple[str, int], int]:
        """``group``'s committed offsets, ``{(topic, queue_id): next offset}``
        (only ``topic``'s when given)."""
        request = pb.FetchOffsetsRequest(group=group, topic=topic)
        reply = self._conn.call(self._conn.broker.FetchOffsets, request)
        return {(o.topic, o.queue_id): o.offset for o in reply.offsets}

    def list_transactions(self, prefix: str = "") -> pb.ListTransactionsReply:
        """Open transactions (ids starting with ``prefix``) and sinks' progress."""
        return self._conn.call(
            self._stub.ListTransactions, pb.ListTransactionsRequest(prefix=prefix)
        )

    def abort_transactions(self, ids: Sequence[str] = (), prefix: str = "") -> int:
        """Abort open transactions by id or id prefix; return how many."""
        return abort_transactions(self._conn, ids, prefix)

    def stats(self) -> pb.BrokerStats:
        return self._conn.call(self._stub.GetStats, pb.GetStatsRequest())

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
