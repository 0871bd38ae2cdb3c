"""A topic's route (its broker groups, their members and queues) and cutting a
produce request by broker group.

A topic's queues are the ordered list of (broker name, queue id)
(``equeue_proto.protocol.route_queues``). ``split_request`` cuts a
``ProduceRequest`` into one request per broker group with explicit queue ids:
a key routes over the whole list of writable queues with the partitioner
(``key_queue``), so a key keeps its (broker, queue) while the list does not
change. It is the one place the client chooses a keyed message's queue, for
one broker (a route of one group) as for a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from equeue_proto.protocol import key_queue, route_queues
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import (
    BrokerUnavailable,
    EqueueError,
    InvalidRequest,
    NotFoundError,
)

QueueRef = tuple[str, int]
"""(broker name, queue id)."""


@dataclass(frozen=True)
class Route:
    """One topic's route as a name server gave it, and when it was fetched."""

    topic: str
    brokers: tuple[pb.BrokerRoute, ...]
    fetched: float
    down: tuple[str, ...] = ()
    """Broker groups that hosted the topic and are down (the name servers
    remember their expired registrations: ``TopicRoute.down_brokers``)."""

    def queues(self, which: str = "all") -> list[QueueRef]:
        """The ordered (broker name, queue id) list: every queue, or only the
        ``writable`` or ``readable`` ones."""
        return route_queues(
            [
                (b.broker_name, [q.queue_id for q in b.queues if _has(q, which)])
                for b in self.brokers
            ]
        )

    def only_group(self) -> str | None:
        """The group's name when the route is one broker's (one group named
        ``""``): a queue id alone names a queue there. None otherwise."""
        return "" if self.broker_names() == [""] else None

    def broker_names(self) -> list[str]:
        return [b.broker_name for b in self.brokers]

    def entry(self, broker: str) -> pb.BrokerRoute:
        for b in self.brokers:
            if b.broker_name == broker:
                return b
        raise NotFoundError(f"topic {self.topic!r} has no queues on broker {broker!r}")

    def address(self, broker: str) -> str:
        """The group's master (writes, commits); BrokerUnavailable if it has none."""
        entry = self.entry(broker)
        if not entry.address:
            raise BrokerUnavailable(
                f"broker group {broker!r} has no master now (replicas: "
                f"{', '.join(entry.replica_addresses) or 'none'}); writes wait for a new master"
            )
        return entry.address

    def incarnation(self, broker: str) -> int:
        for b in self.brokers:
            if b.broker_name == broker:
                return b.incarnation
        return 0


def _has(queue: pb.RouteQueue, which: str) -> bool:
    return which == "all" or (queue.writable if which == "writable" else queue.readable)


# -- splitting a produce request by broker ---------------------------------------------


def _slices(lengths: Sequence[int]) -> list[tuple[int, int]]:
    out = []
    start = 0
    for length in lengths:
        size = max(length, 0)
        out.append((start, start + size))
        start += size
    return out


def take_rows(request: pb.ProduceRequest, rows: Sequence[int]) -> pb.ProduceRequest:
    """A request with only ``rows`` of ``request``'s messages (in that order)."""
    columns = request.messages
    part = pb.MessageColumns(count=len(rows))
    values = _slices(columns.value_lengths)
    blob = columns.values
    part.values = b"".join(blob[values[i][0] : values[i][1]] for i in rows)
    part.value_lengths.extend(columns.value_lengths[i] for i in rows)
    if len(columns.key_lengths):
        keys = _slices(columns.key_lengths)
        part.keys = b"".join(columns.keys[keys[i][0] : keys[i][1]] for i in rows)
        part.key_lengths.extend(columns.key_lengths[i] for i in rows)
    if len(columns.tags):
        part.tags.extend(columns.tags[i] for i in rows)
    if len(columns.header_lengths):
        headers = _slices(columns.header_lengths)
        part.headers = b"".join(columns.headers[headers[i][0] : headers[i][1]] for i in rows)
        part.header_lengths.extend(columns.header_lengths[i] for i in rows)
    if len(columns.timestamps_ms):
        part.timestamps_ms.extend(columns.timestamps_ms[i] for i in rows)
    out = pb.ProduceRequest(
        topic=request.topic,
        messages=part,
        transaction_id=request.transaction_id,
        producer_group=request.producer_group,
    )
    if len(request.queue_ids):
        out.queue_ids.extend(request.queue_ids[i] for i in rows)
    due = request.deliver_at_ms
    if len(due) > 1:  # one per message: the rows' own; one for all: kept
        out.deliver_at_ms.extend(due[i] for i in rows)
    else:
        out.deliver_at_ms.extend(due)
    return out


def request_keys(request: pb.ProduceRequest) -> list[bytes | None]:
    columns = request.messages
    if not len(columns.key_lengths):
        return [None] * columns.count
    return [
        None if length < 0 else columns.keys[start:end]
        for length, (start, end) in zip(
            columns.key_lengths, _slices(columns.key_lengths), strict=True
        )
    ]


def split_request(
    request: pb.ProduceRequest,
    writable: Sequence[QueueRef],
    sticky: QueueRef,
    brokers: Sequence[str | None] | None = None,
    only: str | None = None,
) -> dict[str, tuple[list[int], pb.ProduceRequest]]:
    """{broker name: (row indexes, request with explicit queue ids)}.

    A keyed message goes to ``writable[key_queue(key, len(writable))]``, a
    keyless one to ``sticky``, a message with an explicit queue id to that
    queue on ``only``, the route's one group (``Route.only_group``: a queue
    id names its queue there), else on ``brokers[i]`` (required beside it: a
    queue id alone names no queue in a cluster). A route of one group that knows no queue (a topic
    a single broker creates on its first message) leaves the queues to it.
    """
    if not writable and only is not None:
        return {only: (list(range(request.messages.count)), request)}
    if not writable:
        raise NotFoundError(f"topic {request.topic!r} has no writable queue on any broker")
    keys = request_keys(request)
    explicit = list(request.queue_ids)
    rows: dict[str, list[int]] = {}
    targets: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        queue_id = explicit[i] if explicit else -1
        if queue_id >= 0:
            # One group: a queue id alone names its queue (a broker given is not needed).
            broker = only if only is not None else brokers[i] if brokers is not None else None
            if broker is None:
                raise InvalidRequest(
                    f"message {i} names queue {queue_id} but no broker: in a cluster a "
                    "queue is (broker, queue id); give the broker beside the queue"
                )
            target: QueueRef = (broker, queue_id)
        elif key is not None:
            target = writable[key_queue(key, len(writable))]
        else:
            target = sticky
        rows.setdefault(target[0], []).append(i)
        targets.setdefault(target[0], []).append(target[1])
    out = {}
    for broker, indexes in rows.items():
        if len(indexes) == len(keys):  # every row, in order: a copy of the blobs, no slicing
            part = pb.ProduceRequest()
            part.CopyFrom(request)
        else:
            part = take_rows(request, indexes)
        del part.queue_ids[:]
        part.queue_ids.extend(targets[broker])
        out[broker] = (indexes, part)
    return out


def name_broker(error: EqueueError, broker: str, address: str) -> EqueueError:
    """``error`` again, its message naming the broker it came from (as it
    is for a one-broker route's group, which has no name)."""
    if not broker:
        return error
    renamed = type(error)(f"broker {broker!r} ({address}): {error}", error.code)
    renamed.__cause__ = error
    return renamed
