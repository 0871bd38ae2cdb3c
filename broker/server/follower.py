"""A replica's replication loop: follows its master's log (the Replication service).

``Follower`` keeps one stream open to the master named by the broker's role
(role.py; reconnecting with a bounded back-off), applies metadata, then bytes
(``ReplicaLog.append``), and cuts its log where the master says it ends or
diverges (``truncate``). The master side is ``replication.ReplicationService``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from equeue_broker.server.replication import MAX_REPLY_BYTES
from equeue_broker.server.role import BrokerRole
from equeue_broker.server.service_base import BrokerState
from equeue_broker.storage.errors import InvalidArgument, StorageError
from equeue_broker.storage.replicated import ReplicaLog, decode_metadata
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

log = logging.getLogger("equeue.replication")


class Follower:
    """A replica's replication loop (``run`` until cancelled)."""

    def __init__(self, state: BrokerState, address: str) -> None:
        self.s = state
        self.replica = ReplicaLog(state.store)
        self.address = address
        self.master_end = 0
        self.last_contact = 0.0
        self.stopped: str | None = None
        """Why replication stopped for good (a capacity or name mismatch)."""
        self.metadata_version = 0
        """The master's metadata version of the last reply applied (insync.py)."""

    async def run(self) -> None:
        try:
            await self._run()
        finally:  # no longer following: nothing holds reads below a master's HW
            self.s.store.set_hw_limit(None)

    async def _run(self) -> None:
        backoff = 0.1
        while self.stopped is None:
            master = self.s.role.view.master  # read again: failover may change it
            if not master:  # no master now: wait for failover to name one
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            try:
                async with grpc.aio.insecure_channel(
                    master, options=[("grpc.max_receive_message_length", 64 << 20)]
                ) as channel:
                    await self._follow(pb_grpc.ReplicationStub(channel))
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.warning("replication from %s: %s %s", master, exc.code().name, exc.details())
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self.stopped = str(exc.details())
            except StaleReply as exc:
                log.warning("replication from %s refused: %s", master, exc)
            except (StorageError, OSError) as exc:
                log.error("replication from %s stopped: %s", master, exc)
                self.stopped = str(exc)
            if self.stopped is not None:
                log.error("REPLICATION STOPPED: %s", self.stopped)
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _follow(self, stub: pb_grpc.ReplicationStub) -> None:
        requests: asyncio.Queue[pb.ReplicateRequest] = asyncio.Queue()
        self.metadata_version = 0  # a master's versions mean something on its stream only

        async def send() -> AsyncIterator[pb.ReplicateRequest]:
            while True:
                yield await requests.get()

        def ask() -> None:
            request = pb.ReplicateRequest(
                position=self.replica.end,
                max_bytes=MAX_REPLY_BYTES,
                wait_ms=1000,
                replica_address=self.address,
                chunk_capacity=self.replica.capacity,
                replica_id=self.s.instance_id,  # the in-sync set's name for it
                metadata_version=self.metadata_version,
                # Fencing and divergence (docs/replication.md, "Epochs in the log").
                epoch=self.s.role.view.epoch,
                last_epoch=self.s.store.epochs.last_epoch,
            )
            requests.put_nowait(request)

        call: Any = stub.Replicate(send())  # type: ignore[arg-type]  # the aio stub
        ask()
        name = self.s.config.broker_name
        reply: pb.ReplicateReply
        async for reply in call:
            check_reply_epoch(self.s.role, reply.epoch)
            self.last_contact = time.monotonic()
            self.master_end = reply.master_end
            if reply.metadata:
                meta = decode_metadata(reply.metadata)
                if name and meta.broker_name != name:
                    raise InvalidArgument(
                        f"the master is broker {meta.broker_name!r}, this replica is {name!r}: "
                        "a replica must have its master's --broker-name (message ids name it)"
                    )
                await self.s.call(self.replica.apply_metadata, meta)
            # Reads here stop at the master's high watermark (set before the bytes
            # it may not cover): below it, every record is on every in-sync
            # member, so a failover cannot lose it.
            self.s.store.set_hw_limit(reply.high_watermark)
            end = self.replica.end
            if reply.data:  # durable here (in sync flush mode fsynced) when it returns
                await self.s.call(self.replica.append, reply.position, reply.data)
            elif reply.position < end:
                await self.s.call(self.replica.truncate, reply.position)
            self.metadata_version = reply.metadata_version
            ask()  # at once: in sync replication the master's acks wait for this

    def lag_bytes(self) -> int:
        return max(0, self.master_end - self.replica.end)


class StaleReply(Exception):
    """A reply from a master of an older epoch than this replica has seen."""


def check_reply_epoch(role: BrokerRole, epoch: int) -> None:
    """Refuse (``StaleReply``: nothing applied, reconnect) a reply stamped with an
    epoch older than the newest seen: its master was deposed. A newer one is
    remembered."""
    seen = role.view.epoch
    if epoch < seen:
        raise StaleReply(
            f"the master's reply is from epoch {epoch}, older than epoch {seen}: "
            "it was deposed; not applied"
        )
    role.see_epoch(epoch)
