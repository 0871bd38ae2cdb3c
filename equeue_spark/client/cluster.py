"""A cluster seen from a client: name servers, cached topic routes, one connection per broker.

``Cluster`` asks any live name server for a topic's route (a random one at
first, then the one that answered last, then the others), caches it, and fetches it again once
it is older than ``ClientConfig.route_refresh_s`` or after an error
(``invalidate``). If no name server answers, a cached route keeps serving,
however old: routes are soft state, and the brokers are what matters.

A topic's queues are the ordered list of (broker name, queue id)
(``equeue_proto.protocol.route_queues``). ``split_request`` cuts a
``ProduceRequest`` into one request per broker with explicit queue ids: a key
routes over the whole list of writable queues with the single-broker
partitioner (``key_queue``), so a key keeps its (broker, queue) while the
list does not change.

A route names each broker group's master and replicas. Writes and offset
commits go to the master (``Route.address``); reads go where
``read_addresses`` says (replica_reads.py): the master, else a replica while
the master cannot be reached (``mark_down``), or a replica always with
``ClientConfig.read_from_replicas``. A route with a member marked down is
fetched again at its next use, so a new master is learnt as soon as the name
servers know it (a broker registers at once when its role changes).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from equeue_proto.protocol import key_queue, route_queues
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.errors import (
    BrokerUnavailable,
    DeadlineExceeded,
    EqueueError,
    InvalidRequest,
    NotFoundError,
    NotMasterError,
    from_rpc_error,
)
from equeue_spark.client.replica_reads import DOWN_S, DownMarks, read_order

log = logging.getLogger(__name__)

T = TypeVar("T")

QueueRef = tuple[str, int]
"""(broker name, queue id)."""


@dataclass(frozen=True)
class Route:
    """One topic's route as a name server gave it, and when it was fetched."""

    topic: str
    brokers: tuple[pb.BrokerRoute, ...]
    fetched: float

    def queues(self, which: str = "all") -> list[QueueRef]:
        """The ordered (broker name, queue id) list: every queue, or only the
        ``writable`` or ``readable`` ones."""
        return route_queues(
            [
                (b.broker_name, [q.queue_id for q in b.queues if _has(q, which)])
                for b in self.brokers
            ]
        )

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


class Cluster:
    """Routes and broker connections of one client (thread-safe)."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.namesrvs = config.namesrvs()
        assert self.namesrvs, "a Cluster needs name servers"
        self._lock = threading.Lock()
        self._routes: dict[str, Route] = {}
        self._stale: set[str] = set()
        self._brokers: list[pb.BrokerEntry] = []
        self._connections: dict[str, Connection] = {}
        self._down = DownMarks()
        self._channels = [grpc.insecure_channel(a) for a in self.namesrvs]
        self._stubs = [pb_grpc.NameServerStub(c) for c in self._channels]
        self._preferred = random.randrange(len(self._stubs))
        """The name server asked first: a random one at the start (clients spread
        their load over the name servers), then the last one that answered."""

    # -- name servers --------------------------------------------------------------

    def _ask(self, method: str, request: object) -> object:
        """Call ``method`` on the name servers, the last good one first;
        ``NotFoundError`` at once (every name server knows the same), and
        ``BrokerUnavailable`` naming them all if none answers."""
        errors: list[str] = []
        count = len(self._stubs)
        for step in range(count):
            index = (self._preferred + step) % count
            try:
                reply = getattr(self._stubs[index], method)(
                    request, timeout=min(self.config.timeout_s, 5.0)
                )
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                if isinstance(error, NotFoundError | InvalidRequest):
                    raise error from exc
                errors.append(f"{self.namesrvs[index]}: {error}")
                continue
            self._preferred = index
            return reply
        raise BrokerUnavailable("no name server answers: " + "; ".join(errors))

    def route(self, topic: str, refresh: bool = False) -> Route:
        """The topic's route, from the cache while it is fresh."""
        with self._lock:
            cached = self._routes.get(topic)
            fresh = (
                cached is not None
                and topic not in self._stale
                and time.monotonic() - cached.fetched < self.config.route_refresh_s
            )
        if cached is not None and fresh and not refresh:
            return cached
        try:
            reply = self._ask("GetRoute", pb.GetRouteRequest(topic=topic))
        except BrokerUnavailable as exc:
            if cached is None:
                raise
            log.warning("using the cached route of %s: %s", topic, exc)
            return cached
        assert isinstance(reply, pb.TopicRoute)
        route = Route(topic, tuple(reply.brokers), time.monotonic())
        with self._lock:
            self._routes[topic] = route
            self._stale.discard(topic)
        return route

    def invalidate(self, topic: str) -> None:
        """Fetch the route again at its next use (after an error on it)."""
        with self._lock:
            self._stale.add(topic)

    # -- which member of a broker group ------------------------------------------------

    def read_addresses(self, topic: str, broker: str, seed: str = "") -> list[str]:
        """The members of ``broker``'s group that serve ``topic``'s reads, in
        the order to try them (members marked down last)."""
        entry = self.route(topic).entry(broker)
        order = read_order(entry, self.config.read_from_replicas, seed)
        if not order:
            raise BrokerUnavailable(f"broker group {broker!r} has no live member")
        return self._down.order(order)

    def mark_down(self, address: str, for_s: float = DOWN_S) -> None:
        """``address`` failed a call: try it last for ``for_s``, and fetch
        every route again at its next use (the group may have a new master)."""
        self._down.mark(address, for_s)
        with self._lock:
            self._stale.update(self._routes)

    def is_down(self, address: str) -> bool:
        return self._down.is_down(address)

    def on_master(self, topic: str, broker: str, call: Callable[[Connection], T]) -> T:
        """``call`` on the connection to ``broker``'s master. When the master
        cannot be reached, or the broker called is a replica now, the route is
        fetched again and the call retried on the group's master, with
        backoff, for up to ``failover_timeout_s``; then BrokerUnavailable
        naming the group. ``call`` must not retry on its own (retry=False):
        one failed attempt is enough to look for another master."""
        config = self.config
        deadline = time.monotonic() + config.failover_timeout_s
        delay = config.backoff_s
        last: EqueueError | None = None
        for _ in range(100_000):  # bounded by the deadline long before
            address = self.route(topic).entry(broker).address
            if address:
                try:
                    return call(self.connection(address))
                except (BrokerUnavailable, DeadlineExceeded, NotMasterError) as exc:
                    self.mark_down(address)
                    last = exc
            else:
                self.invalidate(topic)
            if time.monotonic() + delay > deadline:
                break
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, config.max_backoff_s)
        why = f"last error: {last}" if last else "the name servers list no master"
        raise BrokerUnavailable(
            f"broker group {broker!r} has no reachable master (waited "
            f"failover_timeout_s={config.failover_timeout_s:g}; {why}); retry later"
        )

    def brokers(self, cluster: str = "") -> list[pb.BrokerEntry]:
        """The live brokers (the last list known if no name server answers)."""
        try:
            reply = self._ask("ListBrokers", pb.ListBrokersRequest(cluster=cluster))
        except BrokerUnavailable:
            if not self._brokers:
                raise
            return list(self._brokers)
        assert isinstance(reply, pb.ListBrokersReply)
        with self._lock:
            self._brokers = list(reply.brokers)
        return list(reply.brokers)

    # -- brokers -------------------------------------------------------------------

    def connection(self, address: str) -> Connection:
        """The one connection to the broker at ``address``."""
        with self._lock:
            conn = self._connections.get(address)
            if conn is None:
                conn = Connection(self.config.for_broker(address))
                self._connections[address] = conn
            return conn

    def broker_connection(self, topic: str, broker: str) -> Connection:
        """The connection to ``broker``, where ``topic``'s route says it is."""
        return self.connection(self.route(topic).address(broker))

    def broker_address(self, broker: str) -> str:
        """A broker's address from the live-broker list (topic-independent)."""
        members = [e for e in self.brokers() if e.broker_name == broker]
        for entry in members:
            if entry.routed_master:
                return entry.address
        if members:
            raise BrokerUnavailable(f"broker group {broker!r} has no master now")
        raise NotFoundError(f"broker {broker!r} is not registered with the name servers")

    def close(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
            self._connections.clear()
        for conn in connections:
            conn.close()
        for channel in self._channels:
            channel.close()


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
        topic=request.topic, messages=part, transaction_id=request.transaction_id
    )
    if len(request.queue_ids):
        out.queue_ids.extend(request.queue_ids[i] for i in rows)
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
) -> dict[str, tuple[list[int], pb.ProduceRequest]]:
    """{broker name: (row indexes, request with explicit queue ids)}.

    A keyed message goes to ``writable[key_queue(key, len(writable))]``, a
    keyless one to ``sticky``, a message with an explicit queue id to that
    queue on ``brokers[i]`` (required beside it: a queue id alone names no
    queue in a cluster).
    """
    if not writable:
        raise NotFoundError(f"topic {request.topic!r} has no writable queue on any broker")
    keys = request_keys(request)
    explicit = list(request.queue_ids)
    rows: dict[str, list[int]] = {}
    targets: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        queue_id = explicit[i] if explicit else -1
        if queue_id >= 0:
            broker = brokers[i] if brokers is not None else None
            if not broker:
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
        part = take_rows(request, indexes)
        del part.queue_ids[:]
        part.queue_ids.extend(targets[broker])
        out[broker] = (indexes, part)
    return out


def name_broker(error: EqueueError, broker: str, address: str) -> EqueueError:
    """``error`` again, its message naming the broker it came from."""
    renamed = type(error)(f"broker {broker!r} ({address}): {error}", error.code)
    renamed.__cause__ = error
    return renamed
