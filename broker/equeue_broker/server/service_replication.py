"""The Replication service: the gRPC servicer of a master's replication streams.

The logic is replication/'s (master.py documents the stream: requests,
replies, metadata, fencing and divergence; insync.py the in-sync set and the
acks of sync replication); this servicer runs it on one stream per replica.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc

from equeue_broker.replication.master import (
    HW_LINGER_S,
    MAX_REPLY_BYTES,
    MAX_WAIT_MS,
    METADATA_INTERVAL_S,
    LogGrowth,
    check_request_epoch,
    divergence,
)
from equeue_broker.replication.replica_log import encode_metadata, encode_schemas, master_metadata
from equeue_broker.replication.wire import encode_reply
from equeue_broker.server.errors import BadRequest
from equeue_broker.server.service_base import BrokerState, rpc_stream
from equeue_broker.storage import Store
from equeue_broker.storage.config import FlushMode
from equeue_broker.storage.errors import PreconditionFailed
from equeue_broker.storage.log.positioned import LogPiece
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc


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
        """``Store.read_log``: on the event loop in async flush mode, where it
        never waits for the disk (copies from the page cache, like that mode's
        produce): a sync-mode ack waits for this read, and a thread-pool hop
        costs a wake-up on a busy machine. In sync flush mode the store lock may
        be held across an fsync: the read goes to the thread pool."""
        if self.sync_flush:
            return await self.s.call(store.read_log, position, max_bytes)
        return self.s.inline(store.read_log, position, max_bytes)

    @rpc_stream
    async def Replicate(
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
        sent_schemas = -1  # the schemas' generation last sent: the first reply always carries them
        insync, member = self.s.insync, ""
        sent_hw = sent_version = -1
        try:
            async for request in request_iterator:
                capacity = store.chunk_capacity
                if request.chunk_capacity != capacity:
                    raise BadRequest(
                        f"replica chunk capacity {request.chunk_capacity} differs from the "
                        f"master's {capacity}: start the replica with --chunk-size {capacity}"
                    )
                address = request.replica_address or context.peer()
                epoch = check_request_epoch(self.s.role, request, address)
                member = request.replica_id or address  # its data directory's id
                # A pipelined request asks past what the replica has applied:
                # only what it applied counts (its status, the in-sync set).
                applied = request.position - min(request.unapplied, request.position)
                self.s.replicas.update(slot, address, applied, member)
                diverged = divergence(store, request.last_epoch, applied)
                if diverged is not None:  # the replica cuts its log there (follower.py)
                    yield pb.ReplicateReply(
                        position=diverged, master_end=store.log_end,
                        master_start=store.log_start, chunk_capacity=capacity,
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
                topics, offsets = store.metadata_generation()
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
                # Read after the version, like the topics: a reply's version never
                # claims a schema change it does not carry (SetSchema waits for it).
                schemas = b""
                if store.schemas.generation != sent_schemas:
                    sent_schemas, schemas = encode_schemas(store)
                    if len(schemas) + len(piece.data) > self.max_reply_bytes:
                        piece = replace(piece, data=b"")  # the bytes come in the next reply
                sent_hw, sent_version = insync.high_watermark(piece.end), version
                insync.offered(member, slot, piece.end, version)
                yield encode_reply(pb.ReplicateReply(
                    position=piece.position, master_end=piece.end,
                    master_start=piece.start, metadata=meta if send_meta else b"",
                    chunk_capacity=capacity, high_watermark=sent_hw,
                    metadata_version=version, epoch=epoch,
                    schemas=schemas, schemas_generation=sent_schemas,
                ), piece.data)  # fmt: skip
        finally:
            self.s.replicas.close(slot)
            insync.disconnected(member, slot)
