"""The name server's soft state: live brokers and the topic routes they registered.

Nothing here is persisted: a restarted name server knows nothing until the
brokers' next registrations (every few seconds) fill it again. A registration
is a full snapshot of one member of a broker group (broker name, identity:
its instance id, else its address): it replaces whatever the table held for
it, so a topic the broker deleted disappears with its next registration. A
broker silent for ``expiry_s`` is dropped (``expire``) from routes, but
remembered as *down* for ``down_retention_s`` (what it registered, and when
it was last heard from), so clients can say which broker groups a view
misses (``TopicRoute.down_brokers``, ``ListBrokers(include_down=True)``). A
member that registers again, or unregisters (a clean stop), is forgotten as
down at once. A member whose registration is late, by more than 1.5 times
its usual interval (the longest of its last gaps between registrations) plus
half a second, is *suspect* (``BrokerEntry.state``): still routed, but
probably dead.

Roles: every member of a group registers, with its role and epoch. The
group's master in a route is the registered master with the newest epoch
(``master_of``); a same-epoch tie goes to the member that became master last
(a manual failover without epochs: the old master, if it still runs, became
master earlier), with a warning.

Every resource a broker can make the name server hold is bounded: brokers
(``max_brokers``), topics per registration (``max_topics_per_broker``) and
queues per topic (``max_queues_per_topic``). A registration over a limit is
refused whole (RESOURCE_EXHAUSTED), and what was known before stays.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from equeue_proto.protocol import broker_name_problem
from equeue_proto.v1 import broker_pb2 as pb

BrokerKey = tuple[str, str]
"""(broker name, member identity: instance id, else address)."""

MASTER = "master"
REPLICA = "replica"

log = logging.getLogger("equeue.namesrv")

MAX_TOPIC_NAME = 255
MAX_ADDRESS = 300
MAX_FINGERPRINT = 64


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
    role: str
    """MASTER or REPLICA."""
    epoch: int
    master: str
    """A replica's master, as it registered."""
    master_since: int
    """When this member last became master (a registration counter: larger is
    later); 0 for a replica. Breaks a same-epoch tie between two masters."""
    last_ms: int
    """Wall-clock time of the last registration (shown to operators)."""
    seen: float
    """Monotonic time of the last registration (what expiry uses)."""
    gaps: tuple[float, ...] = ()
    """The last gaps between its registrations, seconds (its usual interval)."""
    fetch_address: str = ""
    """Its fetch port (HOST:PORT; empty: none)."""


GAPS = 4
"""Gaps between registrations kept per member (its usual interval is their maximum)."""
LIVE, SUSPECT, DOWN = "live", "suspect", "down"


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
    _registrations: int = 0
    """Registrations so far: orders when members became master."""
    _warned: set[tuple[str, str, tuple[str, ...]]] = field(default_factory=set)
    """Same-epoch master conflicts warned about (once each)."""
    down_retention_s: float = 3600.0
    _down: dict[BrokerKey, Registration] = field(default_factory=dict)
    """Members whose registration expired, remembered for ``down_retention_s``
    (at most ``max_brokers``, the oldest forgotten first)."""

    # -- writes ----------------------------------------------------------------

    def validate(self, request: pb.RegisterBrokerRequest) -> str:
        """Check a registration's values and limits (``NameServerError``);
        its role (MASTER or REPLICA)."""
        problem = broker_name_problem(request.broker_name)
        if problem is not None:
            raise invalid(problem)
        problem = broker_name_problem(request.cluster, "cluster name")
        if problem is not None:
            raise invalid(problem)
        _check_address(request.address)
        if request.fetch_address:
            _check_address(request.fetch_address, "fetch address")
        role = _role(request)
        key = (request.broker_name, request.instance_id[:64] or request.address)
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
        for topic in request.topics:
            if not topic.name or len(topic.name) > MAX_TOPIC_NAME:
                raise invalid(f"topic name {topic.name[:80]!r} is empty or too long")
            if len(topic.value_schema_fingerprint) > MAX_FINGERPRINT:
                raise invalid(f"topic {topic.name!r}: schema fingerprint too long")
            if len(topic.queues) > self.limits.max_queues_per_topic:
                raise NameServerError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"topic {topic.name!r} on broker {request.broker_name!r} has "
                    f"{len(topic.queues)} queues; the name server keeps at most "
                    f"{self.limits.max_queues_per_topic} (max_queues_per_topic)",
                )
        return role

    def register(self, request: pb.RegisterBrokerRequest) -> bool:
        """Record a registration; True if the broker was not known before."""
        role = self.validate(request)
        key = (request.broker_name, request.instance_id[:64] or request.address)
        topics = {topic.name: topic for topic in request.topics}
        before = self._brokers.get(key)
        self._registrations += 1
        since = 0
        self._down.pop(key, None)
        now = self.clock()
        gaps = (*before.gaps, now - before.seen)[-GAPS:] if before is not None else ()
        if role == MASTER:  # still master: keeps when it became one
            kept = before is not None and before.role == MASTER
            since = before.master_since if kept and before else self._registrations
        self._brokers[key] = Registration(
            cluster=request.cluster,
            broker_name=request.broker_name,
            replica_id=request.replica_id,
            address=request.address,
            instance_id=request.instance_id[:64],
            topics=topics,
            role=role,
            epoch=request.epoch,
            master=request.master[:MAX_ADDRESS],
            master_since=since,
            last_ms=int(time.time() * 1000),
            seen=now,
            gaps=gaps,
            fetch_address=request.fetch_address,
        )
        if before is not None and (before.role, before.epoch) != (role, request.epoch):
            log.info(
                "broker %s at %s is now %s (epoch %d)", request.broker_name, request.address,
                role, request.epoch,
                extra={"broker": request.broker_name, "role": role, "epoch": request.epoch},
            )  # fmt: skip
        return before is None

    def unregister(self, broker_name: str, replica_id: int, address: str) -> bool:
        """Forget the member of ``broker_name`` at ``address`` (without an
        address: the one registered with ``replica_id``)."""
        for table in (self._down, self._brokers):  # a clean stop: not "down"
            for key, found in list(table.items()):
                if found.broker_name != broker_name:
                    continue
                if found.address == address if address else found.replica_id == replica_id:
                    del table[key]
                    if table is self._brokers:
                        return True
        return False

    def expire(self) -> list[Registration]:
        """Drop the brokers silent for ``expiry_s``; return them."""
        now = self.clock()
        cutoff = now - self.expiry_s
        gone = [r for r in self._brokers.values() if r.seen < cutoff]
        for registration in gone:
            key = _key(registration)
            del self._brokers[key]
            self._down[key] = registration
        forget = now - self.down_retention_s
        for key, registration in list(self._down.items()):
            if registration.seen < forget:
                del self._down[key]
        while len(self._down) > self.limits.max_brokers:
            oldest = min(self._down, key=lambda k: self._down[k].seen)
            del self._down[oldest]
        return gone

    def state(self, registration: Registration) -> str:
        """LIVE, or SUSPECT when its registration is late (module doc)."""
        silent = self.clock() - registration.seen
        usual = max(registration.gaps) if registration.gaps else self.expiry_s / 3
        return SUSPECT if silent > usual * 1.5 + 0.5 else LIVE

    def down_groups(self, topic: str = "") -> list[str]:
        """The broker groups remembered as down (every member's registration
        expired, none live), only those that hosted ``topic`` when given."""
        live = {r.broker_name for r in self._brokers.values()}
        return sorted(
            {
                r.broker_name
                for r in self._down.values()
                if r.broker_name not in live and (not topic or topic in r.topics)
            }
        )

    def silent_s(self, broker_name: str) -> float:
        """Seconds since any member of ``broker_name`` was last heard from."""
        seen = [r.seen for r in (*self._brokers.values(), *self._down.values())
                if r.broker_name == broker_name]  # fmt: skip
        return self.clock() - max(seen) if seen else 0.0

    def master_of(self, members: list[Registration]) -> Registration | None:
        """The group's master: the registered master with the newest epoch; a
        same-epoch tie goes to the one that became master last (warned about)."""
        masters = [m for m in members if m.role == MASTER]
        if not masters:
            return None
        best = max(masters, key=lambda m: (m.epoch, m.master_since))
        rivals = sorted(m.address for m in masters if m is not best and m.epoch == best.epoch)
        warned = (best.broker_name, best.address, tuple(rivals))
        if rivals and warned not in self._warned:
            self._warned.add(warned)
            log.warning(
                "broker group %s has %d masters with epoch %d; routing to %s, which became "
                "master last (also claiming: %s): stop the old master or give the new one a "
                "newer epoch", best.broker_name, len(rivals) + 1, best.epoch, best.address,
                ", ".join(rivals),
                extra={"broker": best.broker_name, "epoch": best.epoch},
            )  # fmt: skip
            if len(self._warned) > 1024:  # bounded: an old warning may repeat
                self._warned.clear()
        return best

    # -- reads -----------------------------------------------------------------

    def route(self, topic: str) -> pb.TopicRoute:
        self.expire()
        by_name: dict[str, list[Registration]] = {}
        for registration in self._brokers.values():
            if topic in registration.topics:
                by_name.setdefault(registration.broker_name, []).append(registration)
        down = self.down_groups(topic)
        if not by_name:
            said = ", ".join(f"{g} (not heard from for {self.silent_s(g):.0f} s)" for g in down)
            raise NameServerError(
                grpc.StatusCode.NOT_FOUND,
                f"topic {topic[:80]!r} is on no live broker"
                + (f"; its broker groups are down: {said}" if said else ""),
            )
        route = pb.TopicRoute(topic=topic, down_brokers=down)
        for name in sorted(by_name):
            members = sorted(by_name[name], key=lambda r: r.address)
            master = self.master_of(self._group(name))
            replicas = [r for r in members if r.role == REPLICA]
            # The master describes the queues; without one (failover under
            # way) the first replica does, and there is no address to write to.
            routed = master if master is not None and master in members else None
            lead = routed or (replicas[0] if replicas else members[0])
            entry = route.brokers.add(
                broker_name=name,
                cluster=lead.cluster,
                address=routed.address if routed else "",
                incarnation=lead.topics[topic].incarnation,
                epoch=routed.epoch if routed else 0,
            )
            registered = lead.topics[topic]
            entry.queues.extend(registered.queues)
            entry.replica_addresses.extend(r.address for r in replicas)
            # Every member carries the master's schemas: the lead's versions stand
            # for the group (a replica's lag behind them is momentary).
            entry.value_schema_version = registered.value_schema_version
            entry.value_schema_fingerprint = registered.value_schema_fingerprint
            entry.key_schema_version = registered.key_schema_version
            # The master's fetch port first ("" when none is routed), then the
            # replicas' in replica_addresses order.
            fetchers = [routed.fetch_address if routed else ""]
            entry.fetch_addresses.extend([*fetchers, *(r.fetch_address for r in replicas)])
            if routed is not None:
                entry.replicas[0] = routed.address
            for number, replica in enumerate(replicas, start=1):
                entry.replicas[number] = replica.address
        return route

    def other_master(self, broker_name: str, address: str) -> Registration | None:
        """The group's master as routes name it, unless it is at ``address``."""
        master = self.master_of(self._group(broker_name))
        return master if master is not None and master.address != address else None

    def _group(self, broker_name: str) -> list[Registration]:
        return [r for r in self._brokers.values() if r.broker_name == broker_name]

    def brokers(
        self, cluster: str = "", include_down: bool = False, with_topic_names: bool = False
    ) -> list[pb.BrokerEntry]:
        """The live members (their state: LIVE or SUSPECT); with
        ``include_down`` also those remembered as DOWN."""
        self.expire()
        masters = {name: self.master_of(self._group(name)) for name, _ in self._brokers}
        down = list(self._down.values()) if include_down else []
        members = sorted(
            [*self._brokers.values(), *down],
            key=lambda r: (r.broker_name, r.role != MASTER, r.address),
        )
        now = self.clock()
        return [
            pb.BrokerEntry(
                broker_name=r.broker_name,
                cluster=r.cluster,
                replica_id=r.replica_id,
                address=r.address,
                last_registration_ms=r.last_ms,
                topics=len(r.topics),
                instance_id=r.instance_id,
                role=r.role,
                epoch=r.epoch,
                master=r.master,
                routed_master=masters.get(r.broker_name) is r,
                state=DOWN if _key(r) in self._down else self.state(r),
                silent_ms=round((now - r.seen) * 1000),
                topic_names=sorted(r.topics) if with_topic_names else (),
            )
            for r in members
            if not cluster or r.cluster == cluster
        ]

    def __len__(self) -> int:
        return len(self._brokers)


def _key(registration: Registration) -> BrokerKey:
    return (registration.broker_name, registration.instance_id or registration.address)


def _role(request: pb.RegisterBrokerRequest) -> str:
    """The registered role; a registration from before roles says it by replica id."""
    if not request.role:
        return MASTER if request.replica_id == 0 else REPLICA
    if request.role not in (MASTER, REPLICA):
        raise invalid(f"role {request.role[:40]!r} is not master or replica")
    return request.role


def _check_address(address: str, what: str = "broker address") -> None:
    host, sep, port = address.rpartition(":")
    if (
        not sep
        or not host
        or len(address) > MAX_ADDRESS
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
        or any(c.isspace() for c in address)
    ):
        raise invalid(f"{what} {address[:80]!r} is not one HOST:PORT")
