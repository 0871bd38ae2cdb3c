"""What a master knows of its replicas, and the gate that keeps a replica read-only.

``ReplicaTracker`` records, per replication stream, the position the replica
asked from last (everything below it is on the replica), its address and when
it last asked; GetStats shows them. ``ReplicaGate`` answers every write to a
replica (produce, offset commits, transactions, admin changes) with
FAILED_PRECONDITION naming the master (errors.ReplicaReadOnly).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from equeue_broker.server.auth import _refuse
from equeue_broker.server.errors import ReplicaReadOnly
from equeue_broker.server.handlers import MethodHandler
from equeue_broker.server.role import BrokerRole, RoleView
from equeue_broker.storage.errors import LimitExceeded

WRITE_METHODS = frozenset(
    "/equeue.v1." + name
    for name in (
        "Broker/Produce", "Broker/ProduceStream", "Broker/CommitOffsets",
        "Broker/CommitTransactions", "Broker/AbortTransactions",
        "Admin/CreateTopic", "Admin/DeleteTopic", "Admin/AddQueues",
        "Admin/SetQueueVisibility", "Admin/DeleteQueue", "Admin/ResetOffsets",
        "Admin/DeleteGroup",
    )
)  # fmt: skip
"""The calls a replica refuses: everything that changes the log or metadata."""


@dataclass
class ReplicaView:
    address: str
    position: int
    last_seen: float
    connected: bool
    replica_id: str = ""
    """Its data directory's id (ReplicateRequest.replica_id): the in-sync set names it so."""


class ReplicaTracker:
    """The replicas following this master (thread-safe)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._streams: dict[int, ReplicaView] = {}
        self._gone: dict[str, ReplicaView] = {}
        """Replicas whose stream ended, by address (kept so stats show them)."""

    def open(self, address: str) -> int:
        with self._lock:
            live = sum(1 for v in self._streams.values() if v.connected)
            if live >= self.limit:
                raise LimitExceeded(
                    f"replica {address!r} refused: {live} replicas follow this master "
                    f"already (max_replicas={self.limit})"
                )
            slot = next(self._ids)
            self._streams[slot] = ReplicaView(address, 0, time.monotonic(), True)
            return slot

    def update(self, slot: int, address: str, position: int, replica_id: str = "") -> None:
        with self._lock:
            view = self._streams[slot]
            view.address, view.position, view.last_seen = address, position, time.monotonic()
            view.replica_id = replica_id

    def close(self, slot: int) -> None:
        with self._lock:
            view = self._streams.pop(slot)
            view.connected = False
            self._gone[view.address] = view
            while len(self._gone) > self.limit:  # bounded: the oldest goes
                self._gone.pop(next(iter(self._gone)))

    def views(self) -> list[ReplicaView]:
        with self._lock:
            live = {v.address: v for v in self._streams.values()}
            gone = [v for a, v in self._gone.items() if a not in live]
            return sorted([*live.values(), *gone], key=lambda v: v.address)


class ReplicaGate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses writes while this broker is a replica, naming its master.

    The role is read per call (a failover may change it at any time)."""

    def __init__(self, broker_name: str, role: BrokerRole) -> None:
        self.name = broker_name or "(unnamed)"
        self.role = role

    def error(self, view: RoleView) -> ReplicaReadOnly:
        master = f"master {view.master}" if view.master else "no master now (an election is due)"
        return ReplicaReadOnly(
            f"broker {self.name} is a replica of {master}: it serves reads only; "
            "send writes to the group's master"
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        handler = await continuation(details)
        view = self.role.view
        if handler is None or view.is_master or details.method not in WRITE_METHODS:
            return handler
        return _refuse(handler, self.error(view))
