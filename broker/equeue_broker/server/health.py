"""The standard gRPC health service (``grpc.health.v1.Health``), per role.

A replica serves reads and refuses every write (replica_gate.py), so one
SERVING for the whole broker would send a load balancer's or an
orchestrator's writes to it. The services checked, and what they mean:

- ``""`` (the overall status), ``equeue.v1.Broker``, ``equeue.v1.Admin`` and
  ``equeue.v1.Broker/reads``: SERVING while the process accepts requests
  (reads work on a master and on a replica alike);
- ``equeue.v1.Broker/writes``: SERVING on a master, NOT_SERVING on a replica
  (and on a member of a ZooKeeper group until it is elected), following the
  role as failover or ``SetRole`` changes it.

At shutdown every service turns NOT_SERVING before in-flight calls are
drained. Health needs no token (auth.py).
"""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health, health_pb2

from equeue_broker.replication.role import BrokerRole, RoleView
from equeue_proto.v1 import broker_pb2 as pb

BROKER = pb.DESCRIPTOR.services_by_name["Broker"].full_name
ADMIN = pb.DESCRIPTOR.services_by_name["Admin"].full_name
READS = f"{BROKER}/reads"
WRITES = f"{BROKER}/writes"
ALWAYS = ("", BROKER, ADMIN, READS)
"""Serving whatever the role."""

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class BrokerHealth:
    """The health servicer, its statuses kept in step with ``role``."""

    def __init__(self, role: BrokerRole) -> None:
        self.servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self._role = role
        self._loop = asyncio.get_running_loop()
        self._updates: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Every service's status now; then follow the role's changes."""
        for name in ALWAYS:
            await self.servicer.set(name, SERVING)
        self._role.add_listener(self._changed)
        await self._follow(self._role.view)

    def _changed(self, _old: RoleView, new: RoleView) -> None:
        # Role listeners run on the thread that changed it (an election's, a call's).
        self._loop.call_soon_threadsafe(self._update, new)

    def _update(self, view: RoleView) -> None:
        task = self._loop.create_task(self._follow(view))
        self._updates.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._updates.discard)

    async def _follow(self, _view: RoleView) -> None:
        # The current view, not the one passed: changes may arrive out of order.
        await self.servicer.set(WRITES, SERVING if self._role.is_master else NOT_SERVING)

    async def stop(self) -> None:
        """Everything NOT_SERVING, for good (the server is stopping)."""
        await self.servicer.enter_graceful_shutdown()
