"""Who a broker is in its group, and checking what others claim about a group.

``MembershipService`` serves ``Membership.Identify`` (broker.proto): this
broker's group (--broker-name), instance id, role and epoch, read per call.
It needs no token (auth.py), like a health check: it tells nothing a route
does not, and a caller checking a claim must not send a secret to an address
it has not verified.

``identify`` calls it on another address (bounded), and ``claim_problem``
says whether the answer backs a claim. Two users (docs/cluster.md, "Trust
model"):

- a name server checks every registration's claim with the address it names
  before accepting it (namesrv/claims.py): a registration that claims group
  ``h``'s master from an address that does not answer as ``h``'s master of
  that epoch or a newer one changes nothing;
- a member of a group run without ZooKeeper, told by a name server of a
  newer master (``RegisterBrokerReply.master``), follows it only once that
  master has answered as its group's master of a newer epoch (registration.py, ``MasterCheck``);
  otherwise it logs a warning and keeps its role (registration.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import grpc

from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from equeue_broker.replication.role import BrokerRole

log = logging.getLogger("equeue.broker")

MASTER = "master"
"""replication/role.py's MASTER (not imported: the name server uses this
module, and loads neither replication nor storage)."""


class MembershipService(pb_grpc.MembershipServicer):
    """``Identify``: this broker's group, instance id, role and epoch now."""

    def __init__(self, broker_name: str, instance_id: str, role: BrokerRole) -> None:
        self.broker_name = broker_name
        self.instance_id = instance_id
        self.role = role

    async def Identify(self, request: pb.IdentifyRequest, context: Any) -> pb.MemberIdentity:
        view = self.role.view
        return pb.MemberIdentity(
            broker_name=self.broker_name, instance_id=self.instance_id, role=view.role,
            epoch=view.epoch, master=view.master,
        )  # fmt: skip


async def identify(
    address: str,
    timeout_s: float,
    credentials: grpc.ChannelCredentials | None = None,
) -> pb.MemberIdentity:
    """``address``'s answer to ``Identify`` (``grpc.RpcError`` if it gives none
    within ``timeout_s``); over TLS with ``credentials``, else plaintext."""
    options = [("grpc.max_receive_message_length", 64 << 10)]
    channel = (
        grpc.aio.insecure_channel(address, options=options)
        if credentials is None
        else grpc.aio.secure_channel(address, credentials, options=options)
    )
    async with channel:
        stub = pb_grpc.MembershipStub(channel)
        reply: pb.MemberIdentity = await stub.Identify(pb.IdentifyRequest(), timeout=timeout_s)
        return reply


def claim_problem(
    identity: pb.MemberIdentity, group: str, role: str, epoch: int, instance_id: str = ""
) -> str | None:
    """Why ``identity`` does not back the claim "a member of ``group`` in
    ``role`` (a master: of ``epoch`` or a newer one), with ``instance_id``
    if given"; None if it does."""
    if identity.broker_name != group:
        shown = identity.broker_name or "(a standalone broker)"
        return f"it answers as a member of group {shown!r}, not {group!r}"
    if instance_id and identity.instance_id != instance_id:
        return f"it answers as member {identity.instance_id!r}, not {instance_id!r}"
    if identity.role != role:
        return f"it answers as {identity.role or 'no role'}, not {role}"
    if role == MASTER and identity.epoch < epoch:
        return f"it answers as master of epoch {identity.epoch}, older than the claimed {epoch}"
    return None


def describe(exc: grpc.RpcError) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)
