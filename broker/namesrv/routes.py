"""The name server's soft state: live brokers and the topic routes they registered.

Nothing here is persisted: a restarted name server knows nothing until the
brokers' next registrations (every few seconds) fill it again. A registration
is a full snapshot of one broker (name, replica id): it replaces whatever the
table held for it, so a topic the broker deleted disappears with its next
registration. A broker silent for ``expiry_s`` is dropped (``expire``).

Every resource a broker can make the name server hold is bounded: brokers
(``max_brokers``), topics per registration (``max_topics_per_broker``) and
queues per topic (``max_queues_per_topic``). A registration over a limit is
refused whole (RESOURCE_EXHAUSTED), and what was known before stays.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from equeue_proto.protocol import broker_name_problem
from equeue_proto.v1 import broker_pb2 as pb

BrokerKey = tuple[str, int]
"""(broker name, replica id)."""

MAX_TOPIC_NAME = 255
MAX_ADDRESS = 300


class NameServerError(Exception):
    """A refused request: the gRPC status and a short message naming the value."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def invalid(message: str) -> NameServerError:
    return NameServerError(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass
class Registration:
    cluster: str
    broker_name: str
    replica_id: int
    address: str
    instance_id: str
    topics: dict[str, pb.RegisteredTopic]
    last_ms: int
    """Wall-clock time of the last registration (shown to operators)."""
    seen: float
    """Monotonic time of the last registration (what expiry uses)."""


@dataclass
class Limits:
    max_brokers: int = 1024
    max_topics_per_broker: int = 100_000
    max_queues_per_topic: int = 4096


@dataclass
class RouteTable:
    expiry_s: float
    limits: Limits = field(default_factory=Limits)
    clock: Callable[[], float] = time.monotonic
    _brokers: dict[BrokerKey, Registration] = field(default_factory=dict)

    # -- writes ----------------------------------------------------------------

    def register(self, request: pb.RegisterBrokerRequest) -> bool:
        """Record a registration; True if the broker was not known before."""
        problem = broker_name_problem(request.broker_name)
        if problem is not None:
            raise invalid(problem)
        problem = broker_name_problem(request.cluster, "cluster name")
        if problem is not None:
            raise invalid(problem)
        _check_address(request.address)
        key = (request.broker_name, request.replica_id)
        if key not in self._brokers and len(self._brokers) >= self.limits.max_brokers:
            self.expire()
            if len(self._brokers) >= self.limits.max_brokers:
                raise NameServerError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"broker {request.broker_name!r} refused: the name server keeps at most "
                    f"{self.limits.max_brokers} brokers (max_brokers)",
                )
        if len(request.topics) > self.limits.max_topics_per_broker:
            raise NameServerError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"broker {request.broker_name!r} registers {len(request.topics)} topics; the "
                f"name server keeps at most {self.limits.max_topics_per_broker} per broker "
                "(max_topics_per_broker)",
            )
        topics: dict[str, pb.RegisteredTopic] = {}
        for topic in request.topics:
            if not topic.name or len(topic.name) > MAX_TOPIC_NAME:
                raise invalid(f"topic name {topic.name[:80]!r} is empty or too long")
            if len(topic.queues) > self.limits.max_queues_per_topic:
                raise NameServerError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"topic {topic.name!r} on broker {request.broker_name!r} has "
                    f"{len(topic.queues)} queues; the name server keeps at most "
                    f"{self.limits.max_queues_per_topic} (max_queues_per_topic)",
                )
            topics[topic.name] = topic
        known = key in self._brokers
        self._brokers[key] = Registration(
            cluster=request.cluster,
            broker_name=request.broker_name,
            replica_id=request.replica_id,
            address=request.address,
            instance_id=request.instance_id[:64],
            topics=topics,
            last_ms=int(time.time() * 1000),
            seen=self.clock(),
        )
        return not known

    def unregister(self, broker_name: str, replica_id: int, address: str) -> bool:
        key = (broker_name, replica_id)
        found = self._brokers.get(key)
        if found is None or (address and found.address != address):
            return False
        del self._brokers[key]
        return True

    def expire(self) -> list[Registration]:
        """Drop the brokers silent for ``expiry_s``; return them."""
        cutoff = self.clock() - self.expiry_s
        gone = [r for r in self._brokers.values() if r.seen < cutoff]
        for registration in gone:
            del self._brokers[(registration.broker_name, registration.replica_id)]
        return gone

    # -- reads -----------------------------------------------------------------

    def route(self, topic: str) -> pb.TopicRoute:
        self.expire()
        by_name: dict[str, list[Registration]] = {}
        for registration in self._brokers.values():
            if topic in registration.topics:
                by_name.setdefault(registration.broker_name, []).append(registration)
        if not by_name:
            raise NameServerError(
                grpc.StatusCode.NOT_FOUND, f"topic {topic[:80]!r} is on no live broker"
            )
        route = pb.TopicRoute(topic=topic)
        for name in sorted(by_name):
            replicas = sorted(by_name[name], key=lambda r: r.replica_id)
            # Replica 0 takes writes; without it (a later step's failover) the
            # lowest live replica describes the queues and there is no address.
            lead = replicas[0]
            entry = route.brokers.add(
                broker_name=name,
                cluster=lead.cluster,
                address=lead.address if lead.replica_id == 0 else "",
                incarnation=lead.topics[topic].incarnation,
            )
            entry.queues.extend(lead.topics[topic].queues)
            for replica in replicas:
                entry.replicas[replica.replica_id] = replica.address
        return route

    def brokers(self, cluster: str = "") -> list[pb.BrokerEntry]:
        self.expire()
        return [
            pb.BrokerEntry(
                broker_name=r.broker_name,
                cluster=r.cluster,
                replica_id=r.replica_id,
                address=r.address,
                last_registration_ms=r.last_ms,
                topics=len(r.topics),
                instance_id=r.instance_id,
            )
            for _, r in sorted(self._brokers.items())
            if not cluster or r.cluster == cluster
        ]

    def __len__(self) -> int:
        return len(self._brokers)


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if (
        not sep
        or not host
        or len(address) > MAX_ADDRESS
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
        or any(c.isspace() for c in address)
    ):
        raise invalid(f"broker address {address[:80]!r} is not one HOST:PORT")
