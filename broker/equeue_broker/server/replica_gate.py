"""The gate that keeps a replica read-only: ``ReplicaGate``, a server interceptor.

``ReplicaGate`` answers every write to a replica (produce, offset commits,
transactions, admin changes) with FAILED_PRECONDITION naming the master
(``ReplicaReadOnly``), reading the role (replication/role.py) per call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc

from equeue_broker.replication.errors import ReplicaReadOnly
from equeue_broker.replication.role import BrokerRole, RoleView
from equeue_broker.server.auth import _refuse
from equeue_broker.server.handlers import MethodHandler

WRITE_METHODS = frozenset(
    "/equeue.v1." + name
    for name in (
        "Broker/Produce", "Broker/ProduceStream", "Broker/CommitOffsets",
        "Broker/CommitTransactions", "Broker/AbortTransactions", "Broker/InitProducer",
        "Admin/CreateTopic", "Admin/DeleteTopic", "Admin/AddQueues",
        "Admin/SetQueueVisibility", "Admin/DeleteQueue", "Admin/ResetOffsets",
        "Admin/DeleteGroup", "Broker/CancelDelayed", "Broker/Nack",
        "Admin/ResendDeadLetters", "Admin/PurgeDeadLetters",
        "Admin/SetSchema", "Admin/SetCompatibility", "Admin/DeleteSchemas",
    )
)  # fmt: skip
"""The calls a replica refuses: everything that changes the log or metadata
(GetSchema is a read: replicas serve it from the schemas their master sent)."""


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
