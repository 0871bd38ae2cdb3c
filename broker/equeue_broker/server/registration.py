"""A broker's registration with its name servers (``--namesrv``).

The broker registers with every name server at start, every
``register_interval_ms`` and at once on a topic change (the admin handlers
call ``BrokerState.topology_changed``; a topic auto-created by a produce is
caught by comparing the topic snapshot every second). Each registration is a
full snapshot of the broker's topics and queues, so a name server that
restarted, or dropped the broker while it was unreachable, has it all back
with the next one. Name servers are independent: one down delays nothing
for the others, and a failure is logged once per name server until it answers
again. On SIGTERM the broker unregisters, so clients stop routing to it at once.

Masters and replicas both register, each with its role and epoch read from
``BrokerRole`` at every registration; a role change (failover, promotion)
registers at once (``follow``), so name servers and, through them, clients
learn a new master within a registration round trip instead of an interval.
A reply names the group's master when it is another member (``on_master``):
in a group run without ZooKeeper, a member that missed a promotion (down, or
cut off, while ``equeue cluster promote`` ran) learns of it so, but follows
it only once that master itself has answered as the group's master of a newer
epoch (``MasterCheck``): a name server's word alone moves no master.

Name servers may serve TLS and require tokens (docs/cluster.md, "Security"):
``credentials`` are the channel's (``--namesrv-tls-ca``, ``--namesrv-tls-cert``,
``--namesrv-tls-key``), ``token`` the broker token sent with every call
(``--namesrv-token-file`` or ``$EQUEUE_NAMESRV_TOKEN``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from equeue_broker.replication.failover import RoleSwitch
from equeue_broker.replication.role import MASTER, BrokerRole, RoleView
from equeue_broker.server.membership import claim_problem, describe, identify
from equeue_broker.storage import Store
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

log = logging.getLogger("equeue.broker")

CHECK_INTERVAL_S = 1.0
"""How often the topic snapshot is compared with the last one registered."""
CALL_TIMEOUT_S = 3.0
"""A registration's bound: a name server checks a new claim within it (its
--member-check-timeout-ms, 2 s by default)."""
IDENTIFY_TIMEOUT_S = 2.0
"""A member's check of a master a name server names."""
RECHECK_S = 10.0
"""A master that failed that check is not asked again for this long (every
registration reply names it again)."""


def advertised(host: str, port: int, advertise_address: str) -> str:
    """The address clients are told: ``advertise_address``, else ``host:port``
    (this machine's host name for a wildcard host)."""
    if advertise_address:
        return advertise_address
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    return f"{host}:{port}"


def topic_snapshot(store: Store) -> list[pb.RegisteredTopic]:
    return [
        pb.RegisteredTopic(
            name=meta.name,
            incarnation=meta.incarnation,
            queues=[
                pb.RouteQueue(
                    queue_id=q.queue_id, writable=q.producer_visible, readable=q.consumer_visible
                )
                for q in meta.queues
            ],
            **schema_versions(store, meta.name, meta.incarnation),
        )
        for meta in store.topic_admin.listing()
    ]


def schema_versions(store: Store, topic: str, incarnation: int) -> dict[str, Any]:
    """The topic's latest value and key schema versions (0: none) and the value's
    fingerprint: routes show them, so clients learn of a new version from the
    routes they refresh anyway, and a broker group that lags shows."""
    value = store.schemas.get(topic, "value", incarnation)
    key = store.schemas.get(topic, "key", incarnation)
    latest = value.latest if value is not None else None
    return {
        "value_schema_version": latest.version if latest else 0,
        "value_schema_fingerprint": latest.fingerprint if latest else "",
        "key_schema_version": key.latest_version if key is not None else 0,
    }


class Registrar:
    """Keeps one broker registered with every name server it was given."""

    def __init__(
        self, store: Store, namesrvs: list[str], *, cluster: str, broker_name: str,
        address: str, instance_id: str, interval_s: float, role: BrokerRole | None = None,
        credentials: grpc.ChannelCredentials | None = None, token: str = "",
    ) -> None:  # fmt: skip
        self.store = store
        self.namesrvs = namesrvs
        self.cluster = cluster
        self.broker_name = broker_name
        self.address = address
        self.instance_id = instance_id
        self.interval_s = interval_s
        self.role = role or BrokerRole(MASTER)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._channels = {
            a: grpc.aio.insecure_channel(a)
            if credentials is None
            else grpc.aio.secure_channel(a, credentials)
            for a in namesrvs
        }
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._stubs = {a: pb_grpc.NameServerStub(c) for a, c in self._channels.items()}
        self._failing: set[str] = set()
        self.registrations = 0
        """Successful registrations so far (all name servers together)."""
        self.fetch_address: Callable[[], str] = lambda: ""
        """The broker's fetch port address now (``BrokerState.fetch_address``; empty:
        none), sent with every registration."""
        self.on_master: Callable[[str, int], Awaitable[None]] | None = None
        """Called with the group's master and its epoch when a name server's
        reply names another member (``RoleSwitch.learned``)."""

    def changed(self) -> None:
        """A topic changed: register now (safe to call from the event loop)."""
        self._wake.set()

    def follow(self) -> None:
        """Register again whenever the role changes (call on the event loop;
        the listener may run on any thread, e.g. an election's)."""
        self._loop = asyncio.get_running_loop()
        self.role.add_listener(self._role_changed)

    def _role_changed(self, old: RoleView, new: RoleView) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.changed)

    def request(self) -> pb.RegisterBrokerRequest:
        view = self.role.view
        return pb.RegisterBrokerRequest(
            cluster=self.cluster, broker_name=self.broker_name,
            replica_id=0 if view.is_master else 1, address=self.address,
            topics=topic_snapshot(self.store), instance_id=self.instance_id,
            role=view.role, epoch=view.epoch, master=view.master,
            fetch_address=self.fetch_address(),
        )  # fmt: skip

    async def register_once(self, request: pb.RegisterBrokerRequest) -> None:
        await asyncio.gather(*(self._register(a, request) for a in self.namesrvs))

    async def _register(self, address: str, request: pb.RegisterBrokerRequest) -> None:
        try:
            reply = await self._stubs[address].RegisterBroker(
                request, timeout=CALL_TIMEOUT_S, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            if address not in self._failing:
                self._failing.add(address)
                log.warning(
                    "cannot register with name server %s: %s", address, _describe(exc),
                    extra={"namesrv": address},
                )  # fmt: skip
            return
        self.registrations += 1
        if address in self._failing:
            self._failing.discard(address)
            log.info("registered with name server %s again", address, extra={"namesrv": address})
        if reply.master and self.on_master is not None:
            await self.on_master(reply.master, reply.master_epoch)

    async def run(self) -> None:
        last_topics: list[pb.RegisteredTopic] | None = None
        last_role: tuple[str, int, str, str] | None = None
        last_sent = 0.0
        while True:
            request = self.request()
            topics = list(request.topics)
            role = (request.role, request.epoch, request.master, request.fetch_address)
            due = time.monotonic() - last_sent >= self.interval_s
            if due or topics != last_topics or role != last_role:
                last_sent = time.monotonic()
                last_topics, last_role = topics, role
                await self.register_once(request)
            self._wake.clear()
            wait = min(CHECK_INTERVAL_S, max(0.0, self.interval_s - (time.monotonic() - last_sent)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def unregister(self) -> None:
        """Leave every name server (bounded: a name server that is down just expires us)."""
        request = pb.UnregisterBrokerRequest(broker_name=self.broker_name, address=self.address)

        async def leave(address: str) -> None:
            with contextlib.suppress(grpc.RpcError):
                await self._stubs[address].UnregisterBroker(
                    request, timeout=1.0, metadata=self._metadata
                )

        await asyncio.gather(*(leave(a) for a in self.namesrvs))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)


class MasterCheck:
    """What a member run without ZooKeeper does with a master a name server
    names (``Registrar.on_master``): asks that master itself, and only if it
    answers as this group's master of a newer epoch (or, for a replica with no
    master, of this member's epoch) does the switch follow it
    (``RoleSwitch.learned``). A name server's word alone moves nothing."""

    def __init__(self, switch: RoleSwitch, timeout_s: float = IDENTIFY_TIMEOUT_S) -> None:
        self.switch = switch
        self.timeout_s = timeout_s
        self._lock = asyncio.Lock()  # several name servers answer at once: one check
        self._refused: dict[tuple[str, int], float] = {}

    async def __call__(self, master: str, epoch: int) -> None:
        switch = self.switch
        if not switch.would_learn(master, epoch):
            return  # the usual reply: the master this member already follows
        async with self._lock:
            if not switch.would_learn(master, epoch):
                return  # another name server's reply was acted on meanwhile
            key = (master, epoch)
            now = time.monotonic()
            if now - self._refused.get(key, -RECHECK_S) < RECHECK_S:
                return
            try:  # plaintext, as replication itself is (follower.py)
                identity = await identify(master, self.timeout_s)
            except grpc.RpcError as exc:
                problem: str | None = f"it does not answer ({describe(exc)})"
            else:
                problem = claim_problem(identity, switch.group, MASTER, epoch)
            if problem is not None:
                if len(self._refused) > 256:  # bounded: an old refusal may be checked again
                    self._refused.clear()
                self._refused[key] = now
                log.warning(
                    "a name server routes group %s to %s, master of epoch %d, but %s: "
                    "keeping this broker's role (%s, epoch %d)", switch.group, master, epoch,
                    problem, switch.role.view.role, switch.role.view.epoch,
                    extra={"broker": switch.group, "claimed_master": master, "epoch": epoch},
                )  # fmt: skip
                return
            # What the master itself says, not what the name server said.
            await switch.learned(master, identity.epoch)


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    return f"{details} ({code.name if code else 'error'})"
