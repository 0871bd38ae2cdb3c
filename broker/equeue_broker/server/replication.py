"""Master -> replica log replication over gRPC (the Replication service).

Master side, ``ReplicationService.Replicate``: one bidirectional stream per
replica. Each request carries the position the replica needs next; each is
answered by one reply (flow control by request, whatever gRPC's windows would
allow: at most two replies in flight), built by
``storage.replicated.read_for_replica``: up to ``MAX_REPLY_BYTES`` of whole
records within one chunk, or, at the end of the log, an empty reply after at
most the request's ``wait_ms`` (woken by the store's listener when records
are appended). The group's metadata rides along when it changed and at least
every ``METADATA_INTERVAL_S`` (encoded only then: ``metadata_generation``).

The replica side is ``follower.Follower``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator

import grpc

from equeue_broker.server.errors import BadRequest, StaleEpoch
from equeue_broker.server.replicate_wire import encode_reply
from equeue_broker.server.role import REPLICA
from equeue_broker.server.service_base import BrokerState, rpc_stream
from equeue_broker.storage import Store
from equeue_broker.storage.config import FlushMode
from equeue_broker.storage.errors import PreconditionFailed
from equeue_broker.storage.replicated import (
    LogPiece,
    encode_metadata,
    master_metadata,
    metadata_generation,
    read_for_replica,
)
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

log = logging.getLogger("equeue.replication")

MAX_REPLY_BYTES = 4 << 20
"""Most log bytes in one reply (at least one record is sent, whatever its size):
a 1,000-message batch of 1 KiB messages fits one (a sync-mode ack waits for
every reply its write needs)."""
MAX_WAIT_MS = 10_000
"""Longest a request may ask the master to wait at the end of the log."""
METADATA_INTERVAL_S = 2.0
"""Metadata is sent at least this often (and whenever it changes)."""
HW_LINGER_S = 0.02
"""Sync mode: a new high watermark alone waits this long for records to ride
with. Every ack moves the HW: sent at once, each write would cost a second
exchange with each replica (CPU both sides, on a shared machine the writes'
own). A replica's reads lag the master's by at most this much more; a HW
lower than the master's is never unsafe (it hides, never shows)."""


class LogGrowth:
    """Wakes replication streams parked at the end of the log."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.get_ident()
        """The loop's thread (this is built on it)."""
        self._event = asyncio.Event()
        self.waiting = 0
        self.wakes = 0
        """Counts ``wake`` calls: a stream that read before one re-reads instead
        of parking (the wake may have come while it was not waiting yet)."""

    def notify_threadsafe(self, _topic: str, _queue_id: int, _end: int) -> None:
        """A store listener (any thread): records became readable."""
        if not self.waiting:
            return
        if threading.get_ident() == self._thread:  # an append on the loop (async flush)
            self._wake()  # no self-pipe write and extra loop pass per write
        else:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def wake(self) -> None:
        """On the loop: wake the parked streams (sync replication: a write is
        durable here, or the high watermark or the metadata version moved)."""
        self.wakes += 1
        if self.waiting:
            self._wake()

    async def wait(self, timeout_s: float) -> None:
        event = self._event
        self.waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        finally:
            self.waiting -= 1


class ReplicationService(pb_grpc.ReplicationServicer):
    def __init__(self, state: BrokerState, growth: LogGrowth) -> None:
        self.s = state
        self.growth = growth
        self.sync_flush = state.config.storage.flush_mode is FlushMode.SYNC
        # Within gRPC's send limit, which is at least max_read_bytes + 1 MiB (app.py).
        self.max_reply_bytes = min(
            MAX_REPLY_BYTES, max(1 << 20, state.config.storage.max_read_bytes)
        )

    async def _read(self, store: Store, position: int, max_bytes: int) -> LogPiece:
        """``read_for_replica``: on the event loop in async flush mode, where it
        never waits for the disk (copies from the page cache, like that mode's
        produce): a sync-mode ack waits for this read, and a thread-pool hop
        costs a wake-up on a busy machine. In sync flush mode the store lock may
        be held across an fsync: the read goes to the thread pool."""
        if self.sync_flush:
            return await self.s.call(read_for_replica, store, position, max_bytes)
        return self.s.inline(read_for_replica, store, position, max_bytes)

    @rpc_stream
    async def Replicate(  # noqa: N802 (gRPC's name)
        self,
        request_iterator: AsyncIterator[pb.ReplicateRequest],
        context: grpc.aio.ServicerContext[pb.ReplicateRequest, pb.ReplicateReply],
    ) -> AsyncIterator[pb.ReplicateReply | bytes]:
        view = self.s.role.view
        if not view.is_master:
            raise PreconditionFailed(
                f"this broker is a replica of {view.master or 'no master now'}: "
                "replicate from the master"
            )
        store = self.s.store
        capacity = store.config.chunk_capacity_bytes
        slot = self.s.replicas.open(context.peer())
        sent_meta, sent_at = b"", 0.0
        sent_topics: object = None  # metadata_generation of the last metadata encoded
        sent_offsets = -1
        insync, member = self.s.insync, ""
        sent_hw = sent_version = -1
        try:
            async for request in request_iterator:
                capacity = store._log.capacity
                if request.chunk_capacity != capacity:
                    raise BadRequest(
                        f"replica chunk capacity {request.chunk_capacity} differs from the "
                        f"master's {capacity}: start the replica with --chunk-size {capacity}"
                    )
                address = request.replica_address or context.peer()
                epoch = check_request_epoch(self.s, request, address)
                member = request.replica_id or address  # its data directory's id
                # A pipelined request asks past what the replica has applied:
                # only what it applied counts (its status, the in-sync set).
                applied = request.position - min(request.unapplied, request.position)
                self.s.replicas.update(slot, address, applied, member)
                diverged = divergence(store, request.last_epoch, applied)
                if diverged is not None:  # the replica cuts its log there (follower.py)
                    yield pb.ReplicateReply(
                        position=diverged, master_end=store._log.write_position,
                        master_start=store._log.start_position, chunk_capacity=capacity,
                        epoch=epoch, high_watermark=insync.high_watermark(diverged),
                        metadata_version=sent_version if sent_version >= 0 else 0,
                    )  # fmt: skip
                    continue
                max_bytes = min(request.max_bytes or MAX_REPLY_BYTES, self.max_reply_bytes)
                wait_s = min(request.wait_ms, MAX_WAIT_MS) / 1000
                seen = self.growth.wakes
                piece = await self._read(store, request.position, max_bytes)
                if piece.position == request.position:  # a record boundary of this log
                    insync.progress(member, slot, applied, request.metadata_version)
                deadline = time.monotonic() + wait_s
                news_by = math.inf  # when a new HW must be sent, even without records
                while not piece.data and piece.position == request.position:
                    now = time.monotonic()
                    if news_by == math.inf and insync.changed_since(sent_hw, sent_version):
                        news_by = now + HW_LINGER_S
                    left = min(deadline, news_by) - now
                    if left <= 0 or insync.metadata_changed_since(sent_version):
                        break
                    if self.growth.wakes == seen:  # else woken since the read: read again
                        await self.growth.wait(min(left, 0.2))  # staged records notify nobody
                    seen = self.growth.wakes
                    piece = await self._read(store, request.position, max_bytes)
                # After the bytes: the metadata then covers every topic they name;
                # the version read before it: the metadata covers that version.
                version = insync.metadata_version
                topics, offsets = metadata_generation(store)
                now = time.monotonic()
                due = now - sent_at > METADATA_INTERVAL_S
                send_meta = False
                # Encoded only when it may have changed (every reply waits for this).
                if due or topics is not sent_topics or offsets != sent_offsets:
                    sent_topics, sent_offsets = topics, offsets
                    meta = encode_metadata(master_metadata(store, self.s.broker_id))
                    send_meta = due or meta != sent_meta
                if send_meta:
                    sent_meta, sent_at = meta, now
                sent_hw, sent_version = insync.high_watermark(piece.end), version
                insync.offered(member, slot, piece.end, version)
                yield encode_reply(pb.ReplicateReply(
                    position=piece.position, master_end=piece.end,
                    master_start=piece.start, metadata=meta if send_meta else b"",
                    chunk_capacity=capacity, high_watermark=sent_hw,
                    metadata_version=version, epoch=epoch,
                ), piece.data)  # fmt: skip
        finally:
            self.s.replicas.close(slot)
            insync.disconnected(member, slot)


# -- epochs: fencing and divergence (docs/replication.md, "Epochs in the log") --------


def check_request_epoch(state: BrokerState, request: pb.ReplicateRequest, replica: str) -> int:
    """This master's epoch, to stamp the reply with. A replica that has seen a
    newer epoch means this master was deposed: it stops taking writes (a replica
    with no master, until told or elected) and refuses the stream (StaleEpoch)."""
    view = state.role.view
    if request.epoch > view.epoch and view.is_master:
        state.role.set(
            REPLICA, "", request.epoch,
            why=f"deposed: replica {replica} has seen epoch {request.epoch}",
        )  # fmt: skip
        log.error(
            "DEPOSED: replica %s has seen epoch %d, this master is of epoch %d: no longer "
            "taking writes", replica, request.epoch, view.epoch,
        )  # fmt: skip
    view = state.role.view
    if not view.is_master:
        raise StaleEpoch(
            f"this broker is not the master of epoch {request.epoch or view.epoch} (it is a "
            f"replica of {view.master or 'no master now'}, epoch {view.epoch}): "
            "replicate from the current master"
        )
    return view.epoch


def divergence(store: Store, last_epoch: int, log_end: int) -> int | None:
    """Where a replica whose log ends at ``log_end`` with epoch ``last_epoch``
    must cut it, if it goes beyond the end of that epoch on this log (an old
    master's tail this master never had); else None. (A pipelined request's
    unapplied bytes came from this master: only the applied log can diverge.)"""
    end = store.epochs.end_of(last_epoch)
    return end if end is not None and log_end > end else None
